"""socket.mq applications served on another node of a cluster.

A POST for an application nobody serves on this node goes to the node that registered it
(brokered mode): this node checked the policy, authenticated the client and opened its
OpenPGP body as one node does, then sends the request to that node only (the engine's
node channel, :meth:`IEngine.send`), which checks the same ``request`` rule again with the
client's names, hands it to its registered application exactly as a local POST, and sends the
answer back.  The requesting node answers the HTTP client (sealing it for an OpenPGP client),
so the client sees one broker.  Registrations are announced like logins (``IEngine.claim``):
a name served on one node is refused (409) on the others, as a second registration is on one
node.  A node that leaves the cluster fails its waiting requests with 502, as an application
that disconnects does.

Message layout: a compact JSON header (never a raw LF), one LF, then the body bytes.
"""
from __future__ import annotations

import itertools
import json
from typing import Any, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from brokerd.cluster.damaged import DamagedLog
from brokerd.interfaces import IEngine
from brokerd.protocols.socketmq.incoming import IncomingRequest
from brokerd.protocols.socketmq.policy import Policy

NAMESPACE = "socketmq-app"
"""Where registered application names live in the cluster's directory."""
SERVICE = "socketmq"
"""The engine service name of socket.mq's requests and answers between nodes."""
TEXT = "text/plain; charset=utf-8"
_tokens = itertools.count(1)


class RemoteError(ValueError):
    """A node message that is not a socket.mq request or answer."""


def encode(header: dict[str, Any], body: bytes) -> bytes:
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + body


def decode(data: bytes) -> tuple[dict[str, Any], bytes]:
    head, separator, body = data.partition(b"\n")
    if not separator:
        raise RemoteError("no header")
    try:
        header = json.loads(head)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise RemoteError(f"a header that is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict) or header.get("k") not in ("request", "answer") or \
            not isinstance(header.get("token"), str):
        raise RemoteError("not a socket.mq request or answer")
    return header, body


def _text(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise RemoteError(f"a field that is not text: {value!r}")
    return value


class RequestHub(Protocol):
    """What the cluster side needs of its Hub (brokerd.protocols.socketmq.hub), which imports
    this module: a Protocol, so that no import cycle is needed."""

    @property
    def reactor(self) -> IReactorTime:
        """The clock of the damaged-message lines."""

    @property
    def policy(self) -> Policy:
        """Who may request what."""

    def auth_failure(self, address: object, identity: str | None, scheme: str | None, reason: str) -> None:
        """A request the policy refused."""

    def dispatch(self, request: IncomingRequest, here_only: bool = False) -> Deferred:
        """Hand ``request`` to its application; fires with (status, body, content type)."""


class ServedElsewhere:
    """The Hub's Application for a name another node serves: forwards each request there."""

    def __init__(self, remote: RemoteApplications, origin: str) -> None:
        self.remote = remote
        self.origin = origin

    def handle(self, request: IncomingRequest) -> None:
        self.remote.forward(request, self.origin)


class RemoteApplications:
    """The cluster side of one Hub: registrations announced, requests forwarded and served."""

    def __init__(self, hub: RequestHub, engine: IEngine) -> None:
        self.hub = hub
        self.engine = engine
        self.waiting: dict[str, tuple[IncomingRequest, str]] = {}
        """Requests sent to another node: token -> (IncomingRequest, that node's id)."""
        self.stats = {"forwarded": 0, "served": 0, "bad": 0}
        self.damaged = DamagedLog(hub.reactor)
        """Any client of the cluster's Redis can write on a node's channel: one line per
        interval about what was dropped, never one per message."""
        engine.serve(SERVICE, self.received)
        engine.node_listeners.append(self.node_gone)

    # ------------------------------------------------------------------ registrations

    def served_elsewhere(self, name: str) -> ServedElsewhere | None:
        origin = self.engine.owner(NAMESPACE, name.encode("utf-8"))
        return None if origin is None else ServedElsewhere(self, origin)

    def claim(self, name: str) -> None:
        self.engine.claim(NAMESPACE, name.encode("utf-8"))

    def release(self, name: str) -> None:
        self.engine.release(NAMESPACE, name.encode("utf-8"))

    # ------------------------------------------------------------------ the requesting node

    def forward(self, request: IncomingRequest, origin: str) -> None:
        """Send ``request`` (already allowed here) to node ``origin``; its answer, a 502 when
        the node leaves, or the Hub's timeout answers it."""
        token = str(next(_tokens))
        header = {
            "k": "request", "token": token, "application": request.application,
            "request_id": request.request_id, "client": request.client_id,
            "names": list(request.names) if request.names is not None else None,
            "version": request.version, "content_type": request.content_type,
        }
        if not self.engine.send(origin, SERVICE, encode(header, request.body)):
            request.respond(502, b"the node serving the application is unreachable\n", TEXT)
            return
        self.stats["forwarded"] += 1
        self.waiting[token] = (request, origin)
        request.on_done(lambda: self.waiting.pop(token, None))

    def node_gone(self, origin: str) -> None:
        for request, at in list(self.waiting.values()):
            if at == origin:
                request.respond(502, b"the node serving the application left the cluster\n", TEXT)

    # ------------------------------------------------------------------ both

    def received(self, origin: str, data: bytes) -> None:
        """A request for an application served here, or the answer to one sent from here."""
        try:
            header, body = decode(data)
            if header["k"] == "request":
                self._serve(origin, header, body)
                return
            entry = self.waiting.get(header["token"])
            status = header.get("status")
            if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
                raise RemoteError(f"an answer with status {status!r}")
            if entry is not None and entry[1] == origin:  # else answered already (timeout, 499)
                entry[0].respond(status, body, _text(header.get("content_type")))
        except RemoteError as exc:
            self.stats["bad"] += 1
            self.damaged.dropped(f"a socket.mq request or answer from node {origin}", str(exc))

    # ------------------------------------------------------------------ the serving node

    def _serve(self, origin: str, header: dict[str, Any], body: bytes) -> None:
        names = header.get("names")
        if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
            raise RemoteError("names that are not a list of text")
        application, request_id = _text(header.get("application")), _text(header.get("request_id"))
        if not application or not request_id:
            raise RemoteError("a request without application or request id")
        token = header["token"]
        hub = self.hub
        client = _text(header.get("client"))
        names = tuple(names) if names is not None else None
        if not hub.policy.allows("request", names, f"{application}/{request_id}"):
            hub.auth_failure(None, client, None, f"not allowed here: request {application}/{request_id} from node {origin}")
            if names is None:
                self._answer(origin, token, 496, b"this request needs an authenticated client\n", TEXT)
            else:
                self._answer(origin, token, 403, f"{client} may not request {application}/{request_id}\n".encode(), TEXT)
            return
        incoming = IncomingRequest(application, request_id, body, client, _text(header.get("version")),
                                   _text(header.get("content_type")), names=names)
        self.stats["served"] += 1
        d = hub.dispatch(incoming, here_only=True)
        d.addCallback(lambda answer: self._answer(origin, token, *answer))

    def _answer(self, origin: str, token: str, status: int, body: bytes, content_type: str | None) -> None:
        self.engine.send(origin, SERVICE, encode({"k": "answer", "token": token, "status": status,
                                                  "content_type": content_type}, body))
