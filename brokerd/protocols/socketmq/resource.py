"""The twisted.web resources under ``/socket.mq/``.

    POST /socket.mq/<application>/<request-id>   request-reply (RequestResource)
    GET  /socket.mq/ws                           WebSocket, subprotocol socketmq.v1
    GET  /socket.mq/public-key                   the server's armored OpenPGP key
    GET  /socket.mq/socketmq.js                  the browser client (an ES module)
    GET  /socket.mq/demo/                        the live demo page
    GET  /<mount>                                a WebSocket another front end mounted
                                                 (MountedWebSocketResource)

A POST is routed by its method, so an application may have any valid name that is not one of
the reserved resource names.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from autobahn.twisted.resource import WebSocketResource
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import resource
from twisted.web.resource import IResource
from twisted.web.server import NOT_DONE_YET, Request
from twisted.web.util import Redirect

from brokerd.auth.tls import peer_names
from brokerd.errors import Busy
from brokerd.frontend import WebSocketMounts
from brokerd.protocols.socketmq import limits
from brokerd.protocols.socketmq.codec import is_application_name
from brokerd.protocols.socketmq.hub import REASONS, TEXT, Hub
from brokerd.protocols.socketmq.incoming import IncomingRequest
from brokerd.protocols.socketmq.origin import answer_preflight, check_request_origin
from brokerd.protocols.socketmq.pgp import CONTENT_TYPE, SECURITY_METHOD, Identity, PGPError
from brokerd.protocols.socketmq.session import SocketMQWebSocketFactory

STATIC = Path(__file__).parent / "static"
VERSION_HEADER = b"Socket-MQ-Version"
SECURITY_HEADER = b"Security-Method"
INTERFACE_HEADER = b"Interface-Version"
_VERSION = str(limits.PROTOCOL_VERSION).encode("ascii")
_TEXT = b"text/plain; charset=utf-8"


def _header(request: Request, name: bytes) -> str | None:
    values = request.requestHeaders.getRawHeaders(name)
    if not values:
        return None
    return values[0].decode("latin-1").strip()


def _valid_request_id(segment: bytes) -> str | None:
    """The request id of one URL segment (already percent-decoded by twisted.web), or None."""
    if not segment or len(segment) > limits.MAX_REQUEST_ID:
        return None
    try:
        text = segment.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "/" in text or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return None
    return text


def finish(request: Request, status: int, body: bytes, content_type: bytes = _TEXT, secure: bool = False) -> None:
    """Write a complete response (unless the client went away)."""
    if getattr(request, "gone", False) or request.finished:
        return
    request.setResponseCode(status, REASONS.get(status, "Status").encode("ascii"))
    request.setHeader(VERSION_HEADER, _VERSION)
    request.setHeader(b"Content-Type", content_type)
    request.setHeader(b"Cache-Control", b"no-store")
    if secure:
        request.setHeader(SECURITY_HEADER, SECURITY_METHOD.encode("ascii"))
    request.setHeader(b"Content-Length", str(len(body)).encode("ascii"))
    if request.method != b"HEAD":
        request.write(body)
    request.finish()


def error(request: Request, status: int, reason: str) -> int:
    """Answer ``status`` with a one-line text body; for synchronous render methods."""
    finish(request, status, reason.encode("utf-8") + b"\n")
    return NOT_DONE_YET


class NotFound(resource.Resource):
    """404 with a one-line text body, for any method."""

    isLeaf = True

    def __init__(self, reason: str = "no such socket.mq resource") -> None:
        super().__init__()
        self.reason = reason

    def render(self, request: Request) -> bytes | int:
        return error(request, 404, self.reason)


class RequestResource(resource.Resource):
    """``/socket.mq/<application>/<request-id>``: one request-reply exchange."""

    isLeaf = True
    _log = Logger()

    def __init__(self, hub: Hub, application: bytes) -> None:
        super().__init__()
        self.hub = hub
        self.application = application

    def render(self, request: Request) -> bytes | int:
        if request.method == b"OPTIONS":
            request.setHeader(VERSION_HEADER, _VERSION)
            return b"" if answer_preflight(request, self.hub.origins) else self._foreign(request)
        if request.method != b"POST":
            request.setHeader(b"Allow", b"OPTIONS, POST")
            return error(request, 405, "socket.mq requests are POSTs")
        return self.render_POST(request)

    def _foreign(self, request: Request) -> int:
        """403 for a page whose origin may not use this server (see origin.py)."""
        origin = _header(request, b"Origin") or ""
        self.hub.auth_failure(request.getClientAddress(), None, None, f"origin not allowed: {origin[:200]}")
        return error(request, 403, "pages of this origin may not POST here")

    def render_POST(self, request: Request) -> bytes | int:
        hub = self.hub
        if not check_request_origin(request, hub.origins):
            return self._foreign(request)
        version = _header(request, VERSION_HEADER)
        if version is not None and version != _VERSION.decode():
            return error(request, 400, f"unsupported {VERSION_HEADER.decode()} {version[:16]!r}; this server speaks {limits.PROTOCOL_VERSION}")
        try:
            application = self.application.decode("ascii")
        except UnicodeDecodeError:
            application = ""
        if not is_application_name(application):
            return error(request, 404, "not a valid application name")
        rest = request.postpath or []
        if len(rest) != 1:
            return error(request, 404, "expected /socket.mq/<application>/<request-id>")
        request_id = _valid_request_id(rest[0])
        if request_id is None:
            return error(request, 400, "the request id must be 1-255 bytes of UTF-8 text without / or control characters")
        method = _header(request, SECURITY_HEADER)
        body = request.content.read() if request.content is not None else b""
        setattr(request, "gone", False)  # noqa: B010 (a flag of this request's own, read with getattr)
        request.notifyFinish().addErrback(lambda _: setattr(request, "gone", True))
        content_type = _header(request, b"Content-Type")
        interface = _header(request, INTERFACE_HEADER)
        if method is None:
            names = peer_names(request.transport) or None
            if names is None and hub.policy.required:
                hub.auth_failure(request.getClientAddress(), None, None, "authentication required")
                return error(request, 496, "this server accepts secure requests only (Security-Method: OpenPGP)")
            client_id = names[0] if names else None
            self._authorized(request, application, request_id, body, names, client_id, interface, content_type, None)
            return NOT_DONE_YET
        if method.lower() != SECURITY_METHOD.lower():
            return error(request, 400, f"unsupported Security-Method {method[:32]!r} (only OpenPGP)")
        key = hub.key
        if key is None:
            return error(request, 501, "OpenPGP is not enabled on this server")

        def opened(result: tuple[bytes, Identity]) -> None:
            plaintext, identity = result
            names = (identity.user_id, "fpr:" + identity.fingerprint)
            self._authorized(request, application, request_id, plaintext, names, identity.user_id, interface, content_type, identity)

        def refused(failure: Failure) -> None:
            failure.trap(PGPError)
            hub.auth_failure(request.getClientAddress(), None, SECURITY_METHOD, failure.getErrorMessage())
            finish(request, 401, f"cannot open the request: {failure.getErrorMessage()}\n".encode())

        d = hub.run_crypto(key.open, body, hub.keyring)
        d.addCallbacks(opened, refused)
        d.addErrback(self._failed, request)
        return NOT_DONE_YET

    def _authorized(
        self,
        request: Request,
        application: str,
        request_id: str,
        body: bytes,
        names: tuple[str, ...] | None,
        client_id: str | None,
        interface: str | None,
        content_type: str | None,
        identity: Identity | None,
    ) -> None:
        hub = self.hub
        if not hub.policy.allows("request", names, f"{application}/{request_id}"):
            what = f"request {application}/{request_id}"
            if names is None:
                hub.auth_failure(request.getClientAddress(), None, None, f"not allowed without authentication: {what}")
                finish(request, 496, b"this request needs an authenticated client\n")
            else:
                scheme = SECURITY_METHOD if identity is not None else "cert"
                hub.auth_failure(request.getClientAddress(), client_id, scheme, f"not allowed: {what}")
                finish(request, 403, f"{client_id} may not request {application}/{request_id}\n".encode())
            return
        incoming = IncomingRequest(application, request_id, body, client_id, interface, content_type, names)
        request.notifyFinish().addErrback(lambda _: incoming.respond(499, b"the client went away\n", TEXT))
        d = hub.dispatch(incoming)
        if identity is None:
            d.addCallback(lambda answer: self._answer(request, *answer))
        else:
            d.addCallback(lambda answer: self._seal(request, identity, *answer))
        d.addErrback(self._failed, request)

    def _answer(self, request: Request, status: int, body: bytes, content_type: str | None) -> None:
        kind = content_type.encode("latin-1", "replace") if content_type else b"application/octet-stream"
        finish(request, status, body, kind)

    def _seal(self, request: Request, identity: Identity, status: int, body: bytes, content_type: str | None) -> None:
        if getattr(request, "gone", False):
            return
        key = self.hub.key
        assert key is not None  # a client is identified by OpenPGP only where the server has a key
        d = self.hub.run_crypto(key.seal, body, identity.cert)
        d.addCallback(lambda sealed: finish(request, status, sealed, CONTENT_TYPE.encode(), secure=True))
        d.addErrback(self._failed, request)

    def _failed(self, failure: Failure, request: Request) -> None:
        if failure.check(Busy):
            finish(request, 503, b"busy: too much OpenPGP work is waiting; try again later\n")
            return
        self._log.failure("socket.mq request failed", failure)
        finish(request, 500, b"internal error\n")


class PublicKeyResource(resource.Resource):
    """``GET /socket.mq/public-key``: the server's armored public key, no authentication."""

    isLeaf = True

    def __init__(self, hub: Hub) -> None:
        super().__init__()
        self.hub = hub

    def render_GET(self, request: Request) -> bytes | int:
        if self.hub.key is None:
            return error(request, 404, "OpenPGP is disabled on this server")
        finish(request, 200, self.hub.key.armored_public().encode("ascii"), b"application/pgp-keys")
        return NOT_DONE_YET

    render_HEAD = render_GET


class SocketMQWebSocketResource(WebSocketResource):
    """Autobahn's WebSocketResource, handing the HTTP connection (its admission, and the end
    of the connection) to the session."""

    def render(self, request: Request) -> bytes | int:
        factory: SocketMQWebSocketFactory = self._factory
        factory.pending_channel = request.channel
        try:
            return super().render(request)
        finally:
            factory.pending_channel = None


class MountedWebSocketResource(resource.Resource):
    """``GET /<mount>``: a WebSocket another front end serves on this listener (WebSocketMounts:
    ``factory``, an Autobahn WebSocketServerFactory), behind this listener's Origin check (403
    for a page whose origin ``--socketmq-origins`` does not allow, before any upgrade).

    The protocol ``factory`` builds takes the connection over: the HTTP channel's admission is
    released, because the protocol counts its connection itself (brokerd.protocols.admission),
    and the end of the connection is passed on to the channel, as for the socket.mq session."""

    isLeaf = True

    def __init__(self, hub: Hub, factory: Any) -> None:
        super().__init__()
        self.hub = hub
        self.factory = factory

    def render(self, request: Request) -> bytes | int:
        hub = self.hub
        origin = _header(request, b"Origin")
        if not hub.origins.allows(origin, _header(request, b"Host"), request.isSecure()):
            hub.auth_failure(request.getClientAddress(), None, None, f"origin not allowed: {(origin or '')[:200]}")
            return error(request, 403, "pages of this origin may not use this server")
        return WebSocketResource(_HandOver(self.factory, request.channel)).render(request)


class _HandOver:
    """``factory`` for one upgrade of ``channel``'s connection (see MountedWebSocketResource)."""

    def __init__(self, factory: Any, channel: Any) -> None:
        self.factory = factory
        self.channel = channel

    def buildProtocol(self, addr: Any) -> Any:
        built = self.factory.buildProtocol(addr)
        if built is None:
            return None
        channel = self.channel
        take = getattr(channel, "take_admission", None)
        admission = take() if take is not None else None
        if admission is not None:
            admission.release()
        lost = built.connectionLost

        def connection_lost(reason: Failure | None = None) -> None:
            vars(built).pop("connectionLost", None)  # no cycle left behind
            try:
                lost(reason)
            finally:
                channel.connectionLost(reason)

        built.connectionLost = connection_lost
        return built


class _Static(resource.Resource):
    """A small file of the package, read once when the site is built."""

    isLeaf = True

    def __init__(self, path: Path, content_type: str) -> None:
        super().__init__()
        self.data = path.read_bytes()
        self.content_type = content_type.encode("ascii")

    def render_GET(self, request: Request) -> bytes | int:
        request.setHeader(b"Content-Type", self.content_type)
        request.setHeader(b"Cache-Control", b"no-cache")
        request.setHeader(b"X-Content-Type-Options", b"nosniff")
        request.setHeader(b"Content-Length", str(len(self.data)).encode("ascii"))
        return b"" if request.method == b"HEAD" else self.data

    render_HEAD = render_GET


class DemoResource(resource.Resource):
    """``/socket.mq/demo/``: the demo page (``/socket.mq/demo`` redirects there)."""

    def __init__(self) -> None:
        super().__init__()
        self.page = _Static(STATIC / "demo" / "index.html", "text/html; charset=utf-8")

    def getChild(self, name: bytes, request: Request) -> resource.Resource:
        if name in (b"", b"index.html"):
            return self.page
        return NotFound()

    def render_GET(self, request: Request) -> bytes | int:
        return Redirect(b"/socket.mq/demo/").render(request)


class SocketMQResource(resource.Resource):
    """``/socket.mq``: routes POSTs to applications, everything else to the fixed resources."""

    def __init__(self, hub: Hub, websocket_factory: SocketMQWebSocketFactory, demo: bool = True) -> None:
        super().__init__()
        self.hub = hub
        self.fixed: dict[bytes, IResource] = {
            b"ws": SocketMQWebSocketResource(websocket_factory),
            b"public-key": PublicKeyResource(hub),
            b"socketmq.js": _Static(STATIC / "socketmq.js", "text/javascript; charset=utf-8"),
        }
        if demo:
            self.fixed[b"demo"] = DemoResource()

    def getChild(self, name: bytes, request: Request) -> IResource:
        if request.method == b"POST" or name not in self.fixed:
            if request.postpath:  # /socket.mq/<application>/<request-id>
                return RequestResource(self.hub, name)
            return NotFound()
        return self.fixed[name]

    def render(self, request: Request) -> bytes | int:
        return error(request, 404, "see /socket.mq/demo/ or POST /socket.mq/<application>/<request-id>")


class RootResource(resource.Resource):
    """The site root: ``/socket.mq``, and the WebSockets other front ends mounted (``mounts``,
    a brokerd.frontend.WebSocketMounts read per request, so a front end built after this one may mount)."""

    def __init__(self, socketmq: SocketMQResource, mounts: WebSocketMounts | None = None) -> None:
        super().__init__()
        self.socketmq = socketmq
        self.mounts = mounts if mounts is not None else WebSocketMounts()

    def getChild(self, name: bytes, request: Request) -> resource.Resource:
        if name == b"socket.mq":
            return self.socketmq
        mounted = self.mounts.get(name)
        if mounted is not None and not request.postpath:
            return MountedWebSocketResource(self.socketmq.hub, mounted)
        if name == b"" and not request.postpath and b"demo" in self.socketmq.fixed:
            return Redirect(b"/socket.mq/demo/")  # "/" (Twisted asks for the child b"")
        return NotFound("only /socket.mq/ is served here")
