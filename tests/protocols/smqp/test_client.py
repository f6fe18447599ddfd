"""The SMQP client protocol: the exact commands it sends, how replies and notifications come
back, errors, a server that breaks the grammar, and a conversation with the real server
through iosim."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet.error import ConnectionClosed, ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.test import iosim

from tests.support.fixtures import pki  # noqa: F401
from brokerd.auth.accounts import AccountsChecker, PasswordHash, run_inline, write_accounts
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.smqp.client import LoginInfo, SMQPClientFactory, SMQPError
from brokerd.protocols.smqp.codec import SMQPProtocolError, encode_notify, encode_reply
from brokerd.protocols.smqp.events import Body, Notify, Section
from brokerd.store.memory import MemoryStore
from tests.support.smqp import smqp_factory


def outcome(d):
    seen = []
    d.addBoth(seen.append)
    return seen[0] if seen else None


def connected():
    notifies: list[Notify] = []
    protocol = SMQPClientFactory(notifies.append).buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(b"SMQP/1.0 Ready. test\r\n")
    return protocol, transport, notifies


def test_login_sends_login_then_pass():
    protocol, transport, _ = connected()
    assert outcome(protocol.greeting) is protocol
    d = protocol.login("alice", "c1", "secret pw")
    assert transport.value() == b"LOGIN alice:c1 CLEAR/1.0\r\n"
    protocol.dataReceived(b"200 OK\r\n")
    assert transport.value().endswith(b"PASS alice secret pw\r\n")
    protocol.dataReceived(encode_reply(200, "OK", "Topic: /accounts/alice/c1", "Time: D1", "Suid: s"))
    assert outcome(d) == LoginInfo("/accounts/alice/c1", None, "D1", "s")


def test_errors_and_values():
    protocol, transport, _ = connected()
    d = protocol.create_topic("/a", ["x,y", "Z"], link="/b")
    assert transport.value() == b"CREATE TOPIC /a (x\\,y,Z) > /b\r\n"
    protocol.dataReceived(b"409 Conflict: /a exists\r\n")
    error = outcome(d).value
    assert isinstance(error, SMQPError) and error.code == 409 and error.lines == ("Conflict: /a exists",)
    listing = protocol.list_topics("/")
    count = protocol.count("topic", "/a/*")
    keywords = protocol.get_keywords("/a")
    protocol.dataReceived(b"200-OK\r\n200-/a\r\n200 /b > /a\r\n200-OK\r\n200 3\r\n200-OK\r\n200 (x\\,y,Z)\r\n")
    assert outcome(listing) == ["/a", "/b > /a"]
    assert outcome(count) == 3
    assert outcome(keywords) == ("x,y", "Z")


def test_topic_timeouts():
    protocol, transport, _ = connected()
    sets = [protocol.set_timeout("/a", 90), protocol.set_timeout("/a", None), protocol.set_timeout("/a", "DEFAULT")]
    got = protocol.get_timeout("/a/b")
    inherited = protocol.get_timeout("/c")
    broken = protocol.get_timeout("/d")
    assert transport.value() == (b"SET TOPIC TIMEOUT /a 90\r\nSET TOPIC TIMEOUT /a INFINITE\r\n"
                                 b"SET TOPIC TIMEOUT /a DEFAULT\r\nGET TOPIC TIMEOUT /a/b\r\n"
                                 b"GET TOPIC TIMEOUT /c\r\nGET TOPIC TIMEOUT /d\r\n")
    protocol.dataReceived(b"200 OK\r\n" * 3 + b"200-OK\r\n200-00:00:01:30\r\n200 From: /a\r\n"
                          b"200-OK\r\n200-INFINITE\r\n200 From: SERVER\r\n200-OK\r\n200 soon\r\n")
    assert [outcome(d).code for d in sets] == [200, 200, 200]
    assert outcome(got) == (90.0, "/a") and outcome(inherited) == (None, "SERVER")
    assert outcome(broken).check(SMQPProtocolError)


def test_notifications_and_greeting_refusal():
    protocol, _transport, notifies = connected()
    body = Body((("Smuid", "s/1"),), (Section((("Content-Type", "text/plain"),), b"hi"),))
    protocol.dataReceived(encode_notify("MESSAGE", "/a", "ADD", body=body) + b"NOTIFY SERVER BYE\r\n")
    assert [n.kind for n in notifies] == ["MESSAGE", "SERVER"] and notifies[0].body.sections[0].data == b"hi"
    other = SMQPClientFactory().buildProtocol(None)
    other.makeConnection(StringTransport())
    other.dataReceived(b"SMQP/1.0 Not Available.\r\n")
    assert outcome(other.greeting).check(ConnectionClosed)


def test_a_broken_server_is_dropped_and_pending_commands_fail():
    protocol, transport, _ = connected()
    d = protocol.noop()
    protocol.dataReceived(b"what is this\r\n")
    assert transport.disconnecting or transport.disconnected
    protocol.connectionLost(Failure(ConnectionDone()))
    assert outcome(d).check(ConnectionDone)
    assert outcome(protocol.noop()).check(Exception)


def test_conversation_with_the_real_server(tmp_path: Path):
    path = tmp_path / "accounts"
    write_accounts(path, {"alice": PasswordHash.create("pw", n=2)})
    server_factory = smqp_factory(Broker(), Settings(), Clock(), MemoryStore(),
                                       AccountsChecker(path, run=run_inline), run=run_inline)
    server_factory.start()
    client, server, pump = iosim.connectedServerAndClient(
        lambda: server_factory.buildProtocol(None), lambda: SMQPClientFactory().buildProtocol(None))
    pump.flush()
    info = client.login("alice", "ch", "pw")
    pump.flush()
    assert outcome(info).topic == "/accounts/alice/ch"
    created = client.create_topic("/news", ["A"])
    found = client.find_topics("/news")
    channel = client.get_channel()
    contact = client.set_contact("text/x-vcard", b"begin:vcard\r\nend:vcard")
    got = client.get_contact()
    pump.flush()
    assert outcome(created).code == 200
    assert outcome(found) == ["/news (A)"]
    assert outcome(channel) == "ch"
    assert outcome(contact).code == 200 and outcome(got) == b"begin:vcard\r\nend:vcard"
    password = client.set_password("pw", "new")
    pump.flush()
    assert outcome(password).code == 200
    quit = client.quit()
    pump.flush()
    assert outcome(quit).code == 200
    assert not client.is_open and server.closed


def _handshake(description: str, pki: Any) -> Any:
    """Connect ``client_endpoint(description, tls=True)`` in memory to a TLS server holding the
    test PKI's server certificate (localhost and 127.0.0.1); return the client's
    connectionLost reason, or None if the handshake succeeded and the client saw it."""
    from twisted.internet.protocol import Factory, Protocol
    from twisted.internet.testing import MemoryReactor
    from twisted.protocols.tls import TLSMemoryBIOFactory
    from twisted.test.iosim import FakeTransport, connect

    from brokerd.auth.tls import ServerTLS
    from brokerd.protocols.smqp.client import client_endpoint

    class Client(Protocol):
        reason = None
        secure = False

        def connectionMade(self) -> None:
            self.transport.write(b"hello")  # goes out once the handshake is done

        def connectionLost(self, reason: Any = None) -> None:
            Client.reason = reason

    class Server(Protocol):
        def dataReceived(self, data: bytes) -> None:
            Client.secure = data == b"hello"

    reactor = MemoryReactor()
    client_endpoint(reactor, description, tls=True, ca=pki.ca).connect(Factory.forProtocol(Client))
    [(_host, _port, factory, _timeout, _bind)] = reactor.tcpClients
    client = factory.buildProtocol(None)
    tls = ServerTLS.from_files(pki.server.cert, pki.server.key, None)
    server = TLSMemoryBIOFactory(tls.context_factory, False, Factory.forProtocol(Server)).buildProtocol(None)
    pump = connect(server, FakeTransport(server, isServer=True), client, FakeTransport(client, isServer=False))
    pump.flush()
    return None if Client.secure else Client.reason


def test_tls_endpoint_verifies_the_host_of_any_tcp_form(pki):  # noqa: F811
    from service_identity import VerificationError

    # Before, only the positional form had a host to verify: the others raised ValueError.
    for description in ("tcp:localhost:720", "tcp:host=localhost:port=720", "tcp:127.0.0.1:720"):
        assert _handshake(description, pki) is None, description
    # the certificate covers neither ::1 nor another name: the client refuses the server
    for description in (r"tcp:\:\:1:720", "tcp:host=example.com:port=720"):
        reason = _handshake(description, pki)
        assert reason is not None and reason.check(VerificationError), (description, reason)
