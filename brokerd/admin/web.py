"""The admin listener's HTTP side: ``/metrics``, the JSON API under ``/api/``, and who may
use them.

Every request passes :class:`AdminRoot`'s check first: a bearer token (compared in constant
time) or a verified client certificate whose name is listed, unless the listener runs
without either (allowed on loopback only, see brokerd.admin.service).  Requests that change
something are POSTs with a JSON content type, which a web page of another origin cannot send
without the browser asking first, so a loopback listener without a token cannot be driven
by a page the operator happens to visit.
"""
from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from brokerd.admin import strictjson
from brokerd.admin.dashboard import ASSETS, Asset, Events
from brokerd.admin.figures import Figures
from brokerd.admin.history import RateHistory
from brokerd.admin.manage import AccessEntries, Accounts, read_body, rest_of_path
from brokerd.admin.metrics import CONTENT_TYPE, exposition
from brokerd.admin.sessions import (
    MAX_CLOSE_BODY,
    UNNAMED_REALMS,
    close_session,
    find_session,
    keep_out_seconds,
    list_sessions,
    list_topics,
)
from brokerd.auth.tls import peer_names
from brokerd.events.log import peer_text
from brokerd.events.schema import text
from brokerd.jsontypes import JSONObject, JSONValue

_log = Logger(namespace="brokerd.admin")
"""Module-level, as brokerd.admin.oplog's is (why: there)."""

JSON = b"application/json"
_T = TypeVar("_T")


class Access:
    """Who may use the admin listener: ``token`` (bytes) and/or client certificates with a
    name in ``certificate_names``; neither means anyone who can connect."""

    def __init__(self, token: bytes | None, certificate_names: frozenset[str] = frozenset()) -> None:
        self.token = token
        self.certificate_names = certificate_names

    @property
    def open(self) -> bool:
        return self.token is None and not self.certificate_names

    def allows(self, request: Request) -> bool:
        if self.open:
            return True
        if self.token is not None:
            header = request.getHeader(b"authorization") or b""
            scheme, _, presented = header.partition(b" ")
            if scheme.lower() == b"bearer" and hmac.compare_digest(presented.strip(), self.token):
                return True
        if self.certificate_names:
            names = peer_names(request.channel.transport)
            if any(name in self.certificate_names for name in names):
                return True
        return False


def _json(request: Request, code: int, body: JSONValue) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", JSON)
    request.setHeader(b"cache-control", b"no-store")
    return strictjson.dumps(body) + b"\n"


def _finish_later(request: Request, d: Deferred[_T], render: Callable[[_T], bytes]) -> int:
    """Answer ``request`` once ``d`` fires (NOT_DONE_YET now); a client gone meanwhile is fine."""
    gone: list[bool] = []
    request.notifyFinish().addErrback(lambda _f: gone.append(True))

    def answer(result: _T) -> None:
        if gone:
            return
        request.write(render(result))
        request.finish()

    def failed(failure: Failure) -> None:
        _log.failure("admin request {uri}", failure, uri=request.uri)
        if not gone:
            request.write(_json(request, 500, {"error": failure.getErrorMessage()}))
            request.finish()

    d.addCallback(answer).addErrback(failed)
    return NOT_DONE_YET


class AdminResource(Resource):

    def __init__(self, figures: Figures) -> None:
        super().__init__()
        self.figures = figures

    def render(self, request: Request) -> bytes | int:
        method = request.method.decode("ascii", "replace")
        handler = getattr(self, f"render_{method}", None)
        if handler is None:
            allowed = sorted(name[len("render_"):] for name in dir(self) if name.startswith("render_")
                             and name not in ("render_HEAD",))
            request.setHeader(b"allow", ", ".join(allowed).encode())
            return _json(request, 405, {"error": f"method {method} not allowed", "allowed": allowed})
        return handler(request)


class Metrics(AdminResource):
    isLeaf = True

    def render_GET(self, request: Request) -> int:
        figures = self.figures

        def render(queues: dict[str, Any] | None) -> bytes:
            request.setHeader(b"content-type", CONTENT_TYPE.encode())
            return exposition(figures.snapshot(), queues)

        return _finish_later(request, figures.queues(), render)


class History(Resource):
    """``GET /api/history``: the last hour of per-second message rates (brokerd.admin.history)."""

    isLeaf = True

    def __init__(self, history: RateHistory) -> None:
        super().__init__()
        self.history = history

    def render_GET(self, request: Request) -> bytes:
        return _json(request, 200, self.history.view())


class Status(AdminResource):
    isLeaf = True

    def render_GET(self, request: Request) -> int:
        figures = self.figures

        def render(queues: dict[str, Any] | None) -> bytes:
            snapshot = figures.snapshot()
            snapshot["smqp_queues"] = queues
            snapshot["recent_auth_failures"] = list(figures.operator_log.recent_auth_failures)
            return _json(request, 200, snapshot)

        return _finish_later(request, figures.queues(), render)


class Topics(AdminResource):
    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        return _json(request, 200, {"topics": list_topics(self.figures.broker)})


def _posted_json(request: Request) -> bool:
    content_type = (request.getHeader(b"content-type") or b"").split(b";")[0].strip().lower()
    return content_type == JSON


class Sessions(AdminResource):
    """``GET /api/sessions``; ``POST /api/sessions/ID/close`` (body ``{}``, or ``{"for":
    SECONDS}`` to keep the session's principal out that long on every node)."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        if rest_of_path(request) not in ([], [b""]):
            return _json(request, 404, {"error": "no such resource"})
        return _json(request, 200, {"sessions": list_sessions(self.figures.broker)})

    def render_POST(self, request: Request) -> bytes:
        if len(rest_of_path(request)) != 2 or rest_of_path(request)[1] != b"close":
            return _json(request, 404, {"error": "POST /api/sessions/ID/close"})
        if not _posted_json(request):
            return _json(request, 415, {"error": "send Content-Type: application/json"})
        wanted = rest_of_path(request)[0].decode("ascii", "replace")
        try:
            seconds = keep_out_seconds(read_body(request, MAX_CLOSE_BODY + 1))
        except ValueError as exc:
            return _json(request, 400, {"error": str(exc)})
        session = find_session(self.figures.broker, wanted)
        if session is None:
            return _json(request, 404, {"error": f"no session {wanted}"})
        principal = getattr(session, "principal", None)
        if seconds and (principal is None or principal.realm in UNNAMED_REALMS):
            return _json(request, 409, {"error": f"session {wanted} has no identity to keep out"})
        if not close_session(session):
            return _json(request, 409, {"error": f"session {wanted} has no connection to close"})
        answer: dict[str, Any] = {"closed": wanted}
        if seconds and principal is not None:  # refused above when there is none
            self.figures.broker.keep_out(principal, seconds)
            answer["kept_out"] = {"principal": str(principal), "seconds": seconds}
            _log.info("admin: closed {protocol} session {name} ({id}) and keeps {principal} out for "
                           "{seconds} s", protocol=session.protocol, name=text(session.name), id=wanted,
                           principal=str(principal), seconds=seconds)
        else:
            _log.info("admin: closed {protocol} session {name} ({id})", protocol=session.protocol,
                           name=text(session.name), id=wanted)
        return _json(request, 200, answer)


@runtime_checkable
class ReloadsFiles(Protocol):
    """A front end that reads files of its own again on request (SMQP's accounts and access
    list); a Protocol because the front ends' factories share no base class."""

    def reload_files(self) -> Deferred: ...


class Reload(AdminResource):
    """``POST /api/reload``: every front end that reads access lists or accounts from files
    reads them again now (a bad file is refused and the old one stays)."""

    isLeaf = True

    def render_POST(self, request: Request) -> bytes | int:
        if not _posted_json(request):
            return _json(request, 415, {"error": "send Content-Type: application/json"})
        factories = self.figures.runtime.front_ends
        reloading = {name: factory for name, factory in sorted(factories.items()) if isinstance(factory, ReloadsFiles)}
        names = list(reloading)
        d = gatherResults([maybeDeferred(factory.reload_files) for factory in reloading.values()], consumeErrors=True)

        def failed(failure: Failure) -> bytes:
            error = getattr(failure.value, "subFailure", failure)
            return _json(request, 422, {"error": error.getErrorMessage()})

        answered: Deferred[bytes] = d.addCallbacks(lambda _: _json(request, 200, {"reloaded": names}), failed)
        return _finish_later(request, answered, lambda body: body)


class Refused(Resource):
    isLeaf = True

    def render(self, request: Request) -> bytes:
        request.setHeader(b"www-authenticate", b'Bearer realm="brokerd"')
        return _json(request, 401, {"error": "authentication required"})


class NotFound(Resource):
    isLeaf = True

    def render(self, request: Request) -> bytes:
        return _json(request, 404, {"error": "no such resource"})


class Index(AdminResource):
    """``GET /api/``: what this listener serves."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        if rest_of_path(request) not in ([], [b""]):
            return _json(request, 404, {"error": "no such resource"})
        return _json(request, 200, {"brokerd": self.figures.snapshot()["version"], "endpoints": [
            "GET /", "GET /metrics", "GET /api/status", "GET /api/sessions", "GET /api/topics", "GET /api/events",
            "GET /api/history",
            "POST /api/sessions/ID/close", "POST /api/reload", "GET /api/accounts",
            "POST /api/accounts/add|passwd|remove", "GET /api/ual", "POST /api/ual/set|remove"]})


class Api(Resource):
    def __init__(self, index: Resource) -> None:
        super().__init__()
        self.index = index

    def getChild(self, path: bytes, request: Request) -> Resource:
        return self.index if path == b"" else NotFound()


class AdminRoot(Resource):
    """Checks every request but those for the dashboard's static files, then dispatches it."""

    def __init__(self, figures: Figures, access: Access, clock: IReactorTime, history: RateHistory) -> None:
        super().__init__()
        self.figures = figures
        self.access = access
        self.assets = {path: Asset(name, content_type) for path, (name, content_type) in ASSETS.items()}
        self.events = Events(figures, clock)
        api = Api(Index(figures))
        api.putChild(b"events", self.events)
        api.putChild(b"status", Status(figures))
        api.putChild(b"history", History(history))
        api.putChild(b"sessions", Sessions(figures))
        api.putChild(b"topics", Topics(figures))
        api.putChild(b"reload", Reload(figures))
        api.putChild(b"accounts", Accounts(figures.runtime))
        api.putChild(b"ual", AccessEntries(figures.runtime))
        self.putChild(b"metrics", Metrics(figures))
        self.putChild(b"api", api)

    def getChildWithDefault(self, path: bytes, request: Request) -> Resource:
        if path in self.assets and request.postpath == [] and request.method in (b"GET", b"HEAD"):
            return self.assets[path]  # no data, no secret: the page asks /api/events with the token
        if not self.access.allows(request):
            self.figures.operator_log.auth_failure(
                "admin", None, source=peer_text(request.getClientAddress()),
                scheme="bearer" if request.getHeader(b"authorization") else None,
                reason="no valid token or client certificate")
            return Refused()
        child = self.children.get(path)
        if child is None:
            return NotFound()
        return child
