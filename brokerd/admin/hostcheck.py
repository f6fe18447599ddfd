"""The admin listener's first check: the request is addressed to one of the broker's own
names (brokerd.auth.hosts), else ``421 Misdirected Request`` before any other check or
handler runs.

This is what keeps a DNS-rebinding page out of a loopback listener without a token: the
page's requests carry its own name in ``Host``.  The check applies to every request, the
dashboard's static files and listeners with a token included: one rule, whatever the
credential, and a token-guarded listener reached by a DNS name simply lists that name in
``--server-names``.
"""
from __future__ import annotations

from twisted.web.resource import Resource
from twisted.web.server import Request

from brokerd.admin import strictjson
from brokerd.auth.hosts import OwnNames


class Misdirected(Resource):
    isLeaf = True

    def render(self, request: Request) -> bytes:
        request.setResponseCode(421, b"Misdirected Request")
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        return strictjson.dumps({"error": "this listener does not answer to that Host name (--server-names)"}) + b"\n"


class HostCheck(Resource):
    """The site's root: refuses a foreign ``Host``, else hands the request to ``inner``."""

    def __init__(self, inner: Resource, own: OwnNames) -> None:
        super().__init__()
        self.inner = inner
        self.own = own

    def getChildWithDefault(self, path: bytes, request: Request) -> Resource:
        host = request.getHeader(b"host")
        if not self.own.owns(None if host is None else host.decode("latin-1")):
            return Misdirected()
        return self.inner.getChildWithDefault(path, request)

    def render(self, request: Request) -> bytes:  # only reached for an empty path, which HTTP has not
        return Misdirected().render(request)
