"""brokerd.auth.tls: loading the server's files, the ``tls:`` endpoint, client contexts, and
real handshakes on loopback with Twisted, stdlib ``ssl`` and ``openssl s_client`` clients."""
from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hypothesis import given
from hypothesis import strategies as st
from OpenSSL import SSL, crypto
from twisted.internet import defer, threads
from twisted.internet.endpoints import (
    SSL4ClientEndpoint,
    SSL4ServerEndpoint,
    TCP4ClientEndpoint,
    TCP4ServerEndpoint,
    connectProtocol,
)
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import (
    IHandshakeListener,
    IListeningPort,
    IOpenSSLClientConnectionCreator,
    ISSLTransport,
)
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.auth import devcerts
from brokerd.auth.tls import (
    ServerTLS,
    certificate_names,
    client_context,
    listen_endpoint,
    peer_names,
)
from brokerd.errors import ConfigurationError
from tests.support.certs import CLIENT_NAMES, SERVER_HOSTNAME, TestPKI
from tests.support.fixtures import pki  # noqa: F401

TIMEOUT = 15
NAMES_LINE = repr(CLIENT_NAMES).encode() + b"\n"


# ---------------------------------------------------------------- ServerTLS.from_files


@pytest.fixture(scope="module")
def verifying_tls(pki: TestPKI) -> ServerTLS:  # noqa: F811
    return ServerTLS.from_files(pki.server.cert, pki.server.key, pki.ca)


@pytest.fixture(scope="module")
def plain_tls(pki: TestPKI) -> ServerTLS:  # noqa: F811
    return ServerTLS.from_files(pki.server.cert, pki.server.key, None)


def test_with_ca_asks_for_but_does_not_require_client_certificates(verifying_tls):
    mode = verifying_tls.context_factory.getContext().get_verify_mode()
    assert verifying_tls.verifies_clients is True
    assert mode & SSL.VERIFY_PEER
    assert not mode & SSL.VERIFY_FAIL_IF_NO_PEER_CERT


def test_without_ca_does_not_verify_clients(plain_tls):
    assert plain_tls.verifies_clients is False
    assert plain_tls.context_factory.getContext().get_verify_mode() == SSL.VERIFY_NONE


@pytest.mark.parametrize("verifying", [True, False], ids=["verifying_tls", "plain_tls"])
def test_tls_1_2_is_the_minimum(pki, verifying):  # noqa: F811
    # a ServerTLS of its own: set_options fails on a context another test made a connection with
    tls = ServerTLS.from_files(pki.server.cert, pki.server.key, pki.ca if verifying else None)
    options = tls.context_factory.getContext().set_options(0)  # adds nothing, returns all
    assert options & SSL.OP_NO_TLSv1
    assert options & SSL.OP_NO_TLSv1_1
    assert not options & SSL.OP_NO_TLSv1_2
    assert not options & SSL.OP_NO_TLSv1_3


def test_certificate_file_may_hold_the_chain(pki, tmp_path):  # noqa: F811
    chain = tmp_path / "chain.pem"
    chain.write_bytes(pki.server.cert.read_bytes() + pki.ca.read_bytes())
    tls = ServerTLS.from_files(chain, pki.server.key, pki.ca)
    assert len(tls.context_factory.extraCertChain) == 1


def _garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.pem"
    path.write_bytes(b"this is not PEM\n")
    return path


def _encrypted_key(pki: TestPKI, tmp_path: Path) -> Path:  # noqa: F811
    key = serialization.load_pem_private_key(pki.server.key.read_bytes(), password=None)
    path = tmp_path / "encrypted.key"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    return path


BAD_FILES: dict[str, tuple[str, str, Callable[[TestPKI, Path], dict[str, Path]]]] = {
    "missing cert": ("--tls-cert", "cannot read", lambda p, t: {"cert": t / "nope.pem"}),
    "cert is a directory": ("--tls-cert", "cannot read", lambda p, t: {"cert": t}),
    "cert not PEM": ("--tls-cert", "not a PEM certificate", lambda p, t: {"cert": _garbage(t)}),
    "cert is a key": ("--tls-cert", "not a PEM certificate", lambda p, t: {"cert": p.server.key}),
    "missing key": ("--tls-key", "cannot read", lambda p, t: {"key": t / "nope.key"}),
    "key not PEM": ("--tls-key", "not a PEM private key", lambda p, t: {"key": _garbage(t)}),
    "key is a cert": ("--tls-key", "not a PEM private key", lambda p, t: {"key": p.server.cert}),
    "key encrypted": ("--tls-key", "encrypted", lambda p, t: {"key": _encrypted_key(p, t)}),
    "key of another cert": ("--tls-key", "does not match", lambda p, t: {"key": p.client.key}),
    "missing CA": ("--tls-ca", "cannot read", lambda p, t: {"ca": t / "nope.pem"}),
    "CA not PEM": ("--tls-ca", "not a PEM certificate", lambda p, t: {"ca": _garbage(t)}),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_name_the_option_and_the_file(case, pki, tmp_path):  # noqa: F811
    option, reason, change = BAD_FILES[case]
    files = {"cert": pki.server.cert, "key": pki.server.key, "ca": pki.ca}
    files.update(change(pki, tmp_path))
    with pytest.raises(ConfigurationError) as raised:
        ServerTLS.from_files(files["cert"], files["key"], files["ca"])
    message = str(raised.value)
    bad_file = files[option.removeprefix("--tls-")]
    assert message.startswith(f"{option} {bad_file}: ")
    assert reason in message
    assert "\n" not in message


# ---------------------------------------------------------------- listen_endpoint


@pytest.mark.parametrize(
    "description, port, interface, backlog",
    [
        ("tls:8788", 8788, "", 50),
        ("tls:0:interface=127.0.0.1", 0, "127.0.0.1", 50),
        ("tls:8788:backlog=7:interface=10.0.0.1", 8788, "10.0.0.1", 7),
        (r"tls:8788:interface=\:\:1", 8788, "::1", 50),
    ],
)
def test_listen_endpoint_parses_brokerd_syntax(plain_tls, description, port, interface, backlog):
    reactor = MemoryReactor()
    endpoint = listen_endpoint(reactor, plain_tls, description)
    assert isinstance(endpoint, SSL4ServerEndpoint)
    factory = Factory.forProtocol(Protocol)
    endpoint.listen(factory)
    assert reactor.sslServers == [
        (port, factory, plain_tls.context_factory, backlog, interface)
    ]


@pytest.mark.parametrize(
    "description",
    [
        "tls",
        "tls:",
        "tcp:8788",
        "ssl:8788",
        "tls:http",
        "tls:-1",
        "tls:65536",
        "tls:８７８８",
        "tls:8788:bogus",
        "tls:8788:port=1",
        "tls:8788:interface=",
        "tls:8788:backlog=0",
        "tls:8788:backlog=many",
        "tls:8788:interface=127.0.0.1:interface=::1",
        "tls:8788:interface=::1",
    ],
)
def test_listen_endpoint_rejects_bad_syntax(plain_tls, description):
    with pytest.raises(ConfigurationError) as raised:
        listen_endpoint(MemoryReactor(), plain_tls, description)
    assert repr(description) in str(raised.value)


@given(st.text(max_size=40).map(lambda rest: "tls:" + rest) | st.text(max_size=40))
def test_listen_endpoint_gives_an_endpoint_or_configuration_error(plain_tls, description):
    try:
        endpoint = listen_endpoint(MemoryReactor(), plain_tls, description)
    except ConfigurationError:
        return
    assert isinstance(endpoint, SSL4ServerEndpoint)


# ---------------------------------------------------------------- names


def test_certificate_names_are_cn_then_dns_then_uri_without_duplicates():
    ca = devcerts.make_ca()
    issued = devcerts.make_client_cert(
        ca,
        "Alice",
        dns_names=["alice.example", "Alice", "a.example"],
        uris=["urn:brokerd:Alice", "spiffe://example.org/alice", "alice.example"],
    )
    assert certificate_names(issued.certificate) == (
        "Alice",
        "alice.example",
        "a.example",
        "urn:brokerd:Alice",
        "spiffe://example.org/alice",
    )


def test_certificate_names_without_subject_alt_names_is_the_cn():
    issued = devcerts.make_client_cert(devcerts.make_ca(), "bob")
    assert certificate_names(issued.certificate) == ("bob",)


def test_peer_names_of_a_plain_transport_is_empty():
    assert peer_names(StringTransport()) == ()
    assert peer_names(object()) == ()


@implementer(ISSLTransport)
class BrokenTLSTransport(StringTransport):
    """Claims to be TLS but cannot answer: peer_names must still return, not raise."""

    def getHandle(self):
        raise RuntimeError("no handle")

    def getPeerCertificate(self):
        raise RuntimeError("no certificate")


def test_peer_names_never_raises():
    assert peer_names(BrokenTLSTransport()) == ()


@dataclass
class FakeHandle:
    """The two calls peer_names makes on the transport's OpenSSL connection."""

    verify_mode: int
    certificate: x509.Certificate | None

    def get_verify_mode(self) -> int:
        return self.verify_mode

    def get_peer_certificate(self, *, as_cryptography: bool = False) -> x509.Certificate | None:
        assert as_cryptography, "pyOpenSSL's X509 objects are deprecated"
        return self.certificate


@implementer(ISSLTransport)
class FakeTLSTransport(StringTransport):
    def __init__(self, verify_mode: int, certificate: x509.Certificate | None) -> None:
        super().__init__()
        self._handle = FakeHandle(verify_mode, certificate)

    def getHandle(self) -> FakeHandle:
        return self._handle


CAROL_NAMES = ("carol", "carol.example", "urn:brokerd:carol")


@pytest.mark.parametrize(
    "verify_mode, with_certificate, expected",
    [
        (SSL.VERIFY_PEER, True, CAROL_NAMES),
        (SSL.VERIFY_PEER | SSL.VERIFY_CLIENT_ONCE, True, CAROL_NAMES),
        (SSL.VERIFY_PEER, False, ()),
        (SSL.VERIFY_NONE, True, ()),  # a certificate nobody verified vouches for nothing
    ],
)
def test_peer_names_needs_a_certificate_the_server_verified(
    verify_mode, with_certificate, expected
):
    issued = devcerts.make_client_cert(
        devcerts.make_ca(), "carol", dns_names=["carol.example"], uris=["urn:brokerd:carol"]
    )
    certificate = issued.certificate if with_certificate else None
    assert peer_names(FakeTLSTransport(verify_mode, certificate)) == expected


# ---------------------------------------------------------------- client_context


def test_client_context_is_a_client_connection_creator(pki):  # noqa: F811
    creator = client_context(SERVER_HOSTNAME, pki.ca, pki.client.cert, pki.client.key)
    assert IOpenSSLClientConnectionCreator.providedBy(creator)


@pytest.mark.parametrize(
    "arguments, expected",
    [
        (lambda p, t: {"ca": t / "nope.pem"}, "CA "),
        (lambda p, t: {"cert": t / "nope.pem", "key": p.client.key}, "client certificate "),
        (lambda p, t: {"cert": p.client.cert, "key": _garbage(t)}, "client key "),
        (lambda p, t: {"cert": p.client.cert, "key": p.server.key}, "does not match"),
        (lambda p, t: {"key": p.client.key}, "without a client certificate"),
        (lambda p, t: {"cert": p.client.cert}, "client key "),  # the key is not in the file
    ],
)
def test_client_context_bad_files(pki, tmp_path, arguments, expected):  # noqa: F811
    with pytest.raises(ConfigurationError, match=expected):
        client_context(SERVER_HOSTNAME, **{"ca": pki.ca, **arguments(pki, tmp_path)})


# ---------------------------------------------------------------- real handshakes


@implementer(IHandshakeListener)
class NamesReporter(Protocol):
    """Writes ``repr(peer_names(transport))`` once the handshake is over, then hangs up.

    TLS connections are "made" before the handshake, when there is no peer certificate yet,
    so the names are also recorded at connectionMade to show that they are empty then."""

    def __init__(self) -> None:
        self.names_at_connect: tuple[str, ...] | None = None
        self.reported: tuple[str, ...] | None = None
        self.lost_reason: Failure | None = None
        self.lost: defer.Deferred[None] = defer.Deferred()

    def connectionMade(self) -> None:
        self.names_at_connect = peer_names(self.transport)
        if not ISSLTransport.providedBy(self.transport):
            self.handshakeCompleted()  # plain TCP: nothing to wait for

    def handshakeCompleted(self) -> None:
        self.reported = peer_names(self.transport)
        self.transport.write(repr(self.reported).encode() + b"\n")
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure) -> None:
        self.lost_reason = reason
        self.lost.callback(None)


class ReporterFactory(Factory):
    def __init__(self) -> None:
        self.connections: list[NamesReporter] = []

    def buildProtocol(self, addr):
        protocol = NamesReporter()
        self.connections.append(protocol)
        return protocol

    async def only_connection(self) -> NamesReporter:
        """The one connection a test made, once the server side has closed it."""
        from twisted.internet import reactor

        assert len(self.connections) == 1
        await self.connections[0].lost.addTimeout(TIMEOUT, reactor)
        return self.connections[0]


@dataclass
class Server:
    port: int
    factory: ReporterFactory


Serve = Callable[[ServerTLS], Awaitable[Server]]


@pytest_twisted.async_yield_fixture
async def serve() -> AsyncIterator[Serve]:
    """``await serve(tls)`` starts a names-reporting listener on 127.0.0.1 with brokerd's own
    endpoint; every listener is stopped after the test."""
    from twisted.internet import reactor

    ports: list[IListeningPort] = []

    async def start(tls: ServerTLS) -> Server:
        factory = ReporterFactory()
        port = await listen_endpoint(reactor, tls, "tls:0:interface=127.0.0.1").listen(factory)
        ports.append(port)
        return Server(port.getHost().port, factory)

    yield start
    for port in ports:
        await port.stopListening()


class Collector(Protocol):
    """Client side: everything the server sends, and why the connection ended."""

    def __init__(self) -> None:
        self.data = b""
        self.done: defer.Deferred[tuple[bytes, Failure]] = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure) -> None:
        self.done.callback((self.data, reason))


async def twisted_client(port: int, creator: IOpenSSLClientConnectionCreator | None):
    """(bytes received, reason the connection ended) for a Twisted client; TLS with
    ``creator``, plain TCP without."""
    from twisted.internet import reactor

    if creator is None:
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    else:
        endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", port, creator)
    collector = Collector()
    await connectProtocol(endpoint, collector)
    return await collector.done.addTimeout(TIMEOUT, reactor)


def _stdlib_exchange(
    port: int,
    ca: Path,
    cert: Path | None = None,
    key: Path | None = None,
    version: ssl.TLSVersion | None = None,
) -> bytes | ssl.SSLError:
    """Blocking stdlib client (run in a thread): what the server sent, or the TLS error."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(cert, key)
    if version is not None:
        context.minimum_version = context.maximum_version = version
        context.set_ciphers("DEFAULT@SECLEVEL=0")
    received = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
            with context.wrap_socket(raw, server_hostname=SERVER_HOSTNAME) as tls:
                while chunk := tls.recv(4096):
                    received += chunk
    except ssl.SSLError as error:
        return error
    return received


def stdlib_client(*args, **kwargs) -> defer.Deferred:
    return threads.deferToThread(_stdlib_exchange, *args, **kwargs)


def _s_client(port: int, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", *arguments]
    return subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT
    )


def s_client(port: int, *arguments: str) -> defer.Deferred:
    return threads.deferToThread(_s_client, port, *arguments)


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")


@pytest_twisted.ensureDeferred
async def test_valid_client_certificate_names_are_reported(serve, verifying_tls, pki):  # noqa: F811
    server = await serve(verifying_tls)
    creator = client_context(SERVER_HOSTNAME, pki.ca, pki.client.cert, pki.client.key)
    data, reason = await twisted_client(server.port, creator)
    assert data == NAMES_LINE
    assert reason.check(ConnectionDone)
    connection = await server.factory.only_connection()
    assert connection.reported == CLIENT_NAMES
    assert connection.names_at_connect == ()  # no certificate before the handshake


@pytest_twisted.ensureDeferred
async def test_key_may_follow_the_certificate_in_one_file(
    serve, verifying_tls, pki, tmp_path  # noqa: F811
):
    combined = tmp_path / "alice-combined.pem"
    combined.write_bytes(pki.client.cert.read_bytes() + pki.client.key.read_bytes())
    server = await serve(verifying_tls)
    data, _ = await twisted_client(server.port, client_context(SERVER_HOSTNAME, pki.ca, combined))
    assert data == NAMES_LINE


@pytest_twisted.ensureDeferred
async def test_client_without_certificate_connects_with_no_names(
    serve, verifying_tls, pki  # noqa: F811
):
    server = await serve(verifying_tls)
    data, reason = await twisted_client(server.port, client_context(SERVER_HOSTNAME, pki.ca))
    assert data == b"()\n"
    assert reason.check(ConnectionDone)
    assert (await server.factory.only_connection()).reported == ()


@pytest_twisted.ensureDeferred
async def test_stdlib_client_with_certificate(serve, verifying_tls, pki):  # noqa: F811
    server = await serve(verifying_tls)
    result = await stdlib_client(server.port, pki.ca, pki.client.cert, pki.client.key)
    assert result == NAMES_LINE


@pytest_twisted.ensureDeferred
async def test_certificate_from_another_ca_fails_the_handshake(
    serve, verifying_tls, pki  # noqa: F811
):
    server = await serve(verifying_tls)
    creator = client_context(
        SERVER_HOSTNAME, pki.ca, pki.wrong_ca_client.cert, pki.wrong_ca_client.key
    )
    data, reason = await twisted_client(server.port, creator)
    assert data == b""
    assert reason.check(SSL.Error)
    assert "unknown ca" in str(reason.value)
    connection = await server.factory.only_connection()
    assert connection.reported is None  # the handshake never completed
    assert "certificate verify failed" in str(connection.lost_reason.value)


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
@pytest.mark.parametrize(
    "which, alert",
    [("wrong_ca_client", "TLSV1_ALERT_UNKNOWN_CA"), ("expired_client", "CERTIFICATE_EXPIRED")],
)
@pytest_twisted.ensureDeferred
async def test_unverifiable_certificate_fails_the_handshake(
    serve, verifying_tls, pki, which, alert, version  # noqa: F811
):
    server = await serve(verifying_tls)
    files = getattr(pki, which)
    result = await stdlib_client(server.port, pki.ca, files.cert, files.key, version)
    assert isinstance(result, ssl.SSLError)
    assert alert in str(result)
    assert (await server.factory.only_connection()).reported is None


@pytest_twisted.ensureDeferred
async def test_tls_1_1_is_refused(serve, plain_tls, pki):  # noqa: F811
    server = await serve(plain_tls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        result = await stdlib_client(server.port, pki.ca, version=ssl.TLSVersion.TLSv1_1)
    if isinstance(result, ssl.SSLError) and "NO_PROTOCOLS_AVAILABLE" in str(result):
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    assert isinstance(result, ssl.SSLError)
    assert "PROTOCOL_VERSION" in str(result)  # the server's alert, not a local refusal


@pytest_twisted.ensureDeferred
async def test_server_without_ca_reports_no_names_even_for_a_valid_certificate(
    serve, plain_tls, pki  # noqa: F811
):
    server = await serve(plain_tls)
    creator = client_context(SERVER_HOSTNAME, pki.ca, pki.client.cert, pki.client.key)
    data, _ = await twisted_client(server.port, creator)
    assert data == b"()\n"


@pytest_twisted.ensureDeferred
async def test_plain_tcp_connection_has_no_names():
    from twisted.internet import reactor

    factory = ReporterFactory()
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    try:
        data, _ = await twisted_client(port.getHost().port, None)
    finally:
        await port.stopListening()
    assert data == b"()\n"


@needs_openssl
@pytest_twisted.ensureDeferred
async def test_openssl_s_client_with_client_certificate(serve, verifying_tls, pki):  # noqa: F811
    server = await serve(verifying_tls)
    done = await s_client(
        server.port,
        "-quiet",
        "-verify_return_error",
        "-verify_hostname",
        SERVER_HOSTNAME,
        "-CAfile",
        str(pki.ca),
        "-cert",
        str(pki.client.cert),
        "-key",
        str(pki.client.key),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == NAMES_LINE.decode()


@needs_openssl
@pytest_twisted.ensureDeferred
async def test_openssl_s_client_with_wrong_ca_certificate_fails(
    serve, verifying_tls, pki  # noqa: F811
):
    server = await serve(verifying_tls)
    done = await s_client(
        server.port,
        "-quiet",
        "-CAfile",
        str(pki.ca),
        "-cert",
        str(pki.wrong_ca_client.cert),
        "-key",
        str(pki.wrong_ca_client.key),
    )
    assert done.returncode != 0
    assert "unknown ca" in done.stderr
    assert done.stdout == ""


@needs_openssl
@pytest.mark.parametrize("with_ca, requested", [(True, True), (False, False)])
@pytest_twisted.ensureDeferred
async def test_client_certificate_is_requested_only_with_a_ca(
    serve, verifying_tls, plain_tls, pki, with_ca, requested  # noqa: F811
):
    server = await serve(verifying_tls if with_ca else plain_tls)
    done = await s_client(server.port, "-msg", "-CAfile", str(pki.ca))
    assert done.returncode == 0, done.stderr
    assert ("CertificateRequest" in done.stdout) is requested
