"""Which web pages may use this server from a browser: the Origin check against cross-site
WebSocket hijacking (RFC 6455 section 10.2) and cross-site request forgery, and CORS for the
request-reply API.

A browser sends its client certificate (and any other ambient credential) to the broker whatever
page opened the connection, so a page on another site could otherwise subscribe, publish and
POST as the user.  Browsers always name the page's origin in an ``Origin`` header on WebSocket
handshakes and on POSTs; every request that carries one is checked against
``--socketmq-origins``: a list of origins (``https://app.example.com``), shell-style patterns
(``https://*.example.com``), ``self`` (the origin the request was addressed to: its ``Host``
header and the connection's scheme, provided that Host is one of the broker's own names,
brokerd.auth.hosts, so that a DNS-rebinding page, whose Origin and Host both name the
attacker's domain, is not "self") and ``*`` (any).  The default is ``self``.  A request
without ``Origin`` comes from a program, not a page, and is allowed: a program holds its
credentials itself and cannot be tricked into lending them.

Origins are compared as RFC 6454 tuples, written ``scheme://host:port`` with the default port
filled in and the host lower-cased.  :func:`check_request_origin` and :func:`answer_preflight`
apply the policy to a twisted.web request (POST and OPTIONS of the request-reply API).
"""
from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import urlsplit

from twisted.web.server import Request

from brokerd.auth.hosts import OwnNames

SELF = "self"
ANY = "*"
NULL = "null"
_DEFAULT_PORTS = {"http": 80, "https": 443}

CORS_METHODS = b"POST"
CORS_HEADERS = ("content-type", "security-method", "socket-mq-version", "interface-version")
"""Request headers a page may send cross-origin (besides the CORS-safelisted ones)."""
CORS_EXPOSED = b"Security-Method, Socket-MQ-Version"
"""Response headers a cross-origin page may read."""
CORS_MAX_AGE = b"600"
"""Seconds a browser may cache a preflight answer."""


def normalize(origin: str) -> str | None:
    """``scheme://host:port`` of an http(s) origin (``null`` stays ``null``), or None when
    ``origin`` is not one (another scheme, no host, a path, a bad port)."""
    origin = origin.strip()
    if origin.lower() == NULL:
        return NULL
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = parts.hostname
    if scheme not in _DEFAULT_PORTS or not host or parts.path not in ("", "/") or parts.query:
        return None
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port if port is not None else _DEFAULT_PORTS[scheme]}"


class OriginPolicy:
    """The origins allowed to use the server from a browser (see the module docstring)."""

    def __init__(self, allowed: Iterable[str] = (SELF,), own: OwnNames | None = None) -> None:
        self.own = own if own is not None else OwnNames()
        """The names ``self`` may be addressed by."""
        entries = [entry.strip() for entry in allowed if entry.strip()]
        self.any = ANY in entries
        self.same_origin = SELF in entries
        self.patterns = tuple(_pattern(entry) for entry in entries if entry not in (ANY, SELF))

    @classmethod
    def from_setting(cls, value: str | Iterable[str] | None, own: OwnNames | None = None) -> OriginPolicy:
        """From ``--socketmq-origins``: one string of entries separated by commas or spaces, or
        (in the TOML file) a list of strings; None is the default, ``self``.  ``own``: the
        broker's names (default: the local names and IP addresses only)."""
        if value is None:
            return cls(own=own)
        if isinstance(value, str):
            value = value.replace(",", " ").split()
        return cls(value, own)

    def allows(self, origin: str | None, host: str | None, secure: bool) -> bool:
        """May a page of ``origin`` use a connection addressed to ``host`` (the Host header)
        over TLS (``secure``) or not?  True without an Origin (not a browser page).  ``self``
        holds only for a Host among the broker's own names."""
        if origin is None:
            return True
        if self.any:
            return True
        page = normalize(origin)
        if page is None:
            return False
        if self.same_origin and host and page != NULL and self.own.owns(host):
            if page == normalize(("https://" if secure else "http://") + host.strip()):
                return True
        return any(fnmatchcase(page, pattern) for pattern in self.patterns)

    def cross_origin(self, origin: str | None, host: str | None, secure: bool) -> bool:
        """True when ``origin`` is a page of another origin than ``host`` (so CORS applies)."""
        if origin is None:
            return False
        return normalize(origin) != normalize(("https://" if secure else "http://") + (host or "").strip())


def _pattern(entry: str) -> str:
    """An allow-list entry as a pattern over normalized origins: ``https://*.example.com`` ->
    ``https://*.example.com:443``; an entry that does not parse as an origin is kept lower-cased
    as written (it then matches only what it spells)."""
    lowered = entry.lower()
    if lowered == NULL:
        return NULL
    # urlsplit rejects '*' in a port, and hostname keeps '*' and '?' as written
    return normalize(lowered) or lowered


def allowed_request_headers(requested: str | None) -> bytes:
    """``Access-Control-Allow-Headers`` for a preflight: the headers asked for that a page may
    send (a browser refuses the request when one it needs is missing)."""
    asked = [name.strip().lower() for name in (requested or "").split(",") if name.strip()]
    allowed = [name for name in asked if name in CORS_HEADERS] or list(CORS_HEADERS)
    return ", ".join(allowed).encode("ascii")


def _header(request: Request, name: bytes) -> str | None:
    value = request.getHeader(name)
    return None if value is None else value.decode("latin-1").strip()


def check_request_origin(request: Request, policy: OriginPolicy) -> bool:
    """May the page that sent this twisted.web ``request`` (if a page did) use the server?  For
    an allowed page of another origin, also add the CORS headers that let it read the answer."""
    origin, host, secure = _header(request, b"Origin"), _header(request, b"Host"), request.isSecure()
    request.setHeader(b"Vary", b"Origin")
    if not policy.allows(origin, host, secure):
        return False
    if origin is not None and policy.cross_origin(origin, host, secure):
        request.setHeader(b"Access-Control-Allow-Origin", origin.encode("latin-1"))
        request.setHeader(b"Access-Control-Allow-Credentials", b"true")
        request.setHeader(b"Access-Control-Expose-Headers", CORS_EXPOSED)
    return True


def answer_preflight(request: Request, policy: OriginPolicy) -> bool:
    """Answer an ``OPTIONS`` request with 204: a CORS preflight for a POST from an allowed origin
    gets the methods and headers it may use, an OPTIONS that is no preflight (no ``Origin`` or
    no ``Access-Control-Request-Method``) gets ``Allow``.  False, with no CORS header set, for a
    preflight the caller must refuse (an origin not allowed, a method other than POST)."""
    method = _header(request, b"Access-Control-Request-Method")
    if _header(request, b"Origin") is None or method is None:
        request.setHeader(b"Allow", b"OPTIONS, POST")
    else:
        if method != "POST" or not check_request_origin(request, policy):
            for name in (b"Access-Control-Allow-Origin", b"Access-Control-Allow-Credentials", b"Access-Control-Expose-Headers"):
                request.responseHeaders.removeHeader(name)
            return False
        request.setHeader(b"Access-Control-Allow-Methods", CORS_METHODS)
        requested = _header(request, b"Access-Control-Request-Headers")
        request.setHeader(b"Access-Control-Allow-Headers", allowed_request_headers(requested))
        request.setHeader(b"Access-Control-Max-Age", CORS_MAX_AGE)
    request.setResponseCode(204, b"No Content")
    return True
