"""``--cluster`` URLs: where the Redis server is, and how to reach it without blocking.

``redis://[user:password@]HOST:PORT[/DB]``, ``rediss://`` (the same over TLS, verified with
``--cluster-tls-ca`` or the system's trust store) and ``unix://PATH[?db=DB]``.  A password
in the URL wins over ``--cluster-password-file``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from twisted.internet import endpoints

from brokerd.errors import ConfigurationError

DEFAULT_PORT = 6379


@dataclass(frozen=True)
class RedisAddress:
    """A parsed ``--cluster`` URL."""

    scheme: str
    host: str | None = None
    port: int = DEFAULT_PORT
    path: str | None = None
    db: int | None = None
    username: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "rediss"

    @property
    def loopback(self) -> bool:
        """A Unix socket, or a host this machine only reaches (localhost, 127.0.0.0/8, ::1)."""
        if self.scheme == "unix":
            return True
        import ipaddress

        host = (self.host or "").strip("[]")
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def __str__(self) -> str:
        """The URL without its password (for logs)."""
        if self.scheme == "unix":
            return f"unix://{self.path}"
        db = f"/{self.db}" if self.db is not None else ""
        return f"{self.scheme}://{self.host}:{self.port}{db}"


def parse(url: str) -> RedisAddress:
    """Parse a ``--cluster`` URL; ConfigurationError naming the option when it is not one."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme == "unix":
            path = unquote(parts.netloc + parts.path)
            if not path:
                raise ValueError("a unix:// URL needs a socket path")
            db_values = parse_qs(parts.query).get("db")
            return RedisAddress("unix", path=path, db=_db(db_values[0]) if db_values else None,
                                password=unquote(parts.password) if parts.password else None)
        if scheme not in ("redis", "rediss"):
            raise ValueError("the scheme must be redis://, rediss:// or unix://")
        if not parts.hostname:
            raise ValueError("no host")
        db_text = parts.path.lstrip("/")
        return RedisAddress(
            scheme,
            host=parts.hostname,
            port=parts.port or DEFAULT_PORT,
            db=_db(db_text) if db_text else None,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
        )
    except ValueError as exc:
        raise ConfigurationError(f"--cluster {_hide_password(url)}: {exc}") from None


def _db(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"the database must be a number, not {text!r}")
    return int(text)


def _hide_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@")
    return url


def client_endpoint(reactor, address: RedisAddress, tls_ca: Path | None = None):
    """The Twisted client endpoint of ``address`` (TLS verified against ``tls_ca``, or the
    platform's trust roots when None)."""
    if address.scheme == "unix":
        return endpoints.UNIXClientEndpoint(reactor, address.path, timeout=5)
    host = address.host
    if host is None:
        raise ConfigurationError(f"--cluster {address}: no host")
    plain = endpoints.HostnameEndpoint(reactor, host, address.port, timeout=5)
    if not address.tls:
        return plain
    from twisted.internet import ssl

    trust = None
    if tls_ca is not None:
        try:
            trust = ssl.Certificate.loadPEM(Path(tls_ca).read_bytes())
        except OSError as exc:
            raise ConfigurationError(f"--cluster-tls-ca {tls_ca}: {exc.strerror}") from None
    options = ssl.optionsForClientTLS(host, trustRoot=trust)
    return endpoints.wrapClientTLS(options, plain)
