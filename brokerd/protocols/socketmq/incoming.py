"""One socket.mq request-reply exchange as the application that serves it sees it.

Its own module because everything that carries a request makes one: the hub that routes it,
the session and the HTTP resource that receive it, the embedded Server API, and the cluster's
remote applications (which the hub itself uses).
"""
from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred


class IncomingRequest:
    """One request-reply exchange, as the application that serves it sees it.

    The draft's request callback arguments are attributes here; ``respond(status, body)``
    answers (only the first answer counts: a late one after a timeout is ignored).
    """

    def __init__(
        self,
        application: str,
        request_id: str,
        body: bytes,
        client_id: str | None = None,
        version: str | None = None,
        content_type: str | None = None,
        names: tuple[str, ...] | None = None,
    ) -> None:
        self.application = application
        self.request_id = request_id
        self.body = body
        self.client_id = client_id
        self.version = version
        self.content_type = content_type
        self.names = names
        """Every name the client is known by (None: not authenticated): what the policy
        matched, and what another node serving the application matches again."""
        self.answered: Deferred = Deferred()
        """Fires with (status, body, content_type) once, on the first respond()."""
        self._cleanups: list[Callable[[], object]] = []

    @property
    def responded(self) -> bool:
        return self.answered.called

    def respond(self, status: int, body: bytes | str = b"", content_type: str | None = None) -> None:
        """Answer with HTTP ``status`` (100-599) and an optional body."""
        if self.answered.called:
            return
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"status must be an HTTP status code, not {status!r}")
        if isinstance(body, str):
            body = body.encode("utf-8")
        for cleanup in self._cleanups:
            cleanup()
        self._cleanups.clear()
        self.answered.callback((status, bytes(body), content_type))

    def on_done(self, cleanup: Callable[[], object]) -> None:
        """Call ``cleanup`` when this request is answered (by anyone, timeouts included)."""
        self._cleanups.append(cleanup)
