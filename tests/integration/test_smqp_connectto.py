"""SMQP CONNECTTO (draft 4.1.1) over real sockets: the server connects to the client's own
notification listener, exchanges the draft's greeting and SUID, then sends notifications
there (and takes their 310 ACK there); other addresses, and the client's own when it is not
public (loopback here), are refused unless the operator's allow-list (--smqp-connectto-allow)
names them; a failed connection is one answer whatever failed."""
from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.protocol import Factory, Protocol

from brokerd.errors import ConfigurationError
from brokerd.protocols.smqp.client import SMQPError
from brokerd.protocols.smqp.codec import SMQPClientParser
from brokerd.protocols.smqp.connectto import parse_allow_list, permitted
from tests.support.broker import free_port
from tests.integration.smqp_fixtures import smqp_server  # noqa: F401


class Listener(Protocol):
    """The client's notification listener: greets as the draft's example does, records the
    SUID line, answers 200 OK, then parses what the server sends."""

    def __init__(self, owner: "Listening", greeting: bytes) -> None:
        self.owner = owner
        self.greeting = greeting
        self.buffer = b""
        self.suid: str | None = None
        self.parser = SMQPClientParser(expect_greeting=False)
        self.events: list = []
        self.waiting: list[Deferred] = []

    def connectionMade(self) -> None:
        self.owner.connections.append(self)
        self.transport.write(self.greeting)

    def dataReceived(self, data: bytes) -> None:
        if self.suid is None:
            self.buffer += data
            if b"\r\n" not in self.buffer:
                return
            line, _, data = self.buffer.partition(b"\r\n")
            self.suid = line.decode()
            self.transport.write(b"200 OK\r\n")
        self.events.extend(self.parser.feed(data))
        waiting, self.waiting = self.waiting, []
        for d in waiting:
            d.callback(None)

    async def next(self, timeout: float = 5.0):
        while not self.events:
            d: Deferred = Deferred()
            self.waiting.append(d)
            await d.addTimeout(timeout, reactor)
        return self.events.pop(0)


class Listening(Factory):
    def __init__(self, greeting: bytes = b"SMQP/1.0 Ready.\r\n") -> None:
        self.greeting = greeting
        self.connections: list[Listener] = []

    def buildProtocol(self, addr):
        return Listener(self, self.greeting)


@pytest_twisted.async_yield_fixture
async def listen():
    ports = []

    async def start(factory: Listening, interface: str = "127.0.0.1"):
        port = await serverFromString(reactor, f"tcp:0:interface={interface}").listen(factory)
        ports.append(port)
        return port.getHost().port

    yield start
    for port in ports:
        await port.stopListening()


async def refused(d, code: int) -> SMQPError:
    with pytest.raises(SMQPError) as info:
        await d
    assert info.value.code == code, info.value
    return info.value


LOOPBACK = "127.0.0.1"
"""These tests' clients and listeners are on loopback, which CONNECTTO refuses unless the
allow-list names it."""


@pytest_twisted.ensureDeferred
async def test_connectto_own_listener_gets_greeting_suid_and_notifications(smqp_server, listen):
    server = await smqp_server(smqp_connectto_allow=LOOPBACK)
    alice = await server.login("alice", "c1")
    on_command_connection: list = []
    alice.notifyReceived = on_command_connection.append
    await alice.create_topic("/news")
    await alice.subscribe("/news")
    listening = Listening()
    port = await listen(listening)
    reply = await alice.command("CONNECTTO", "alice:c1", str(port))
    assert (reply.code, reply.lines) == (200, ("OK",))
    notifier = listening.connections[0]
    assert notifier.suid == server.factory.suid  # the SUID of the login reply, as the draft says
    bob = await server.login("bob", "c1")
    await bob.publish("/news", "N1", [("text/plain", b"over the notification connection")])
    notify = await notifier.next()
    assert notify.args == ("/news", "ADD")
    assert notify.body.sections[0].data == b"over the notification connection"
    notifier.transport.write(b"310 ACK\r\n")
    ack = await notifier.next()
    assert (ack.code, ack.lines) == (310, ("ACK",))
    await bob.publish("/news", "N2", [("text/plain", b"second")])
    assert (await notifier.next()).body.sections[0].data == b"second"
    # the command connection still carries replies, and no NOTIFY went there
    notifier.transport.write(b"310 ACK\r\n")
    assert (await notifier.next()).code == 310
    assert (await alice.noop()).lines == ("OK",)
    assert on_command_connection == []


@pytest_twisted.ensureDeferred
async def test_connectto_falls_back_to_command_connection_when_listener_closes(smqp_server, listen):
    server = await smqp_server(smqp_connectto_allow=LOOPBACK)
    alice = await server.login("alice", "c1")
    got: list = []
    arrived: Deferred = Deferred()

    def on_notify(notify) -> None:
        got.append(notify)
        if not arrived.called:
            arrived.callback(None)

    alice.notifyReceived = on_notify
    await alice.create_topic("/news")
    await alice.subscribe("/news")
    listening = Listening()
    port = await listen(listening)
    await alice.command("CONNECTTO", "alice:c1", f"127.0.0.1:{port}")
    notifier = listening.connections[0]
    notifier.transport.loseConnection()
    session = next(iter(server.factory.sessions["alice"]))
    for _ in range(100):  # each NOOP round trip lets the reactor see the close
        if session.notifier is None:
            break
        await alice.noop()
    assert session.notifier is None
    bob = await server.login("bob", "c1")
    await bob.publish("/news", "N1", [("text/plain", b"back on the command connection")])
    await arrived.addTimeout(5, reactor)
    assert got[0].body.sections[0].data == b"back on the command connection"


@pytest_twisted.ensureDeferred
async def test_connectto_other_address_refused_unless_allowed(smqp_server, listen):
    listening = Listening()
    port = await listen(listening, interface="127.0.0.2")
    closed = await smqp_server()
    alice = await closed.login("alice", "c1")
    error = await refused(alice.command("CONNECTTO", "alice:c1", f"127.0.0.2:{port}"), 403)
    assert "127.0.0.2" in error.lines[-1]
    assert not listening.connections  # refused before any connection was tried
    await refused(alice.command("CONNECTTO", "bob:c1", str(port)), 400)
    open_ = await smqp_server(smqp_connectto_allow="127.0.0.0/8:" + str(port))
    carol = await open_.login("alice", "c2")
    reply = await carol.command("CONNECTTO", "alice:c2", f"127.0.0.2:{port}")
    assert reply.code == 200
    assert listening.connections[0].suid == open_.factory.suid
    # the allow-list names one port: another port of the same address stays refused
    await refused(carol.command("CONNECTTO", "alice:c2", f"127.0.0.2:{port + 1 if port < 65535 else port - 1}"), 403)


@pytest_twisted.ensureDeferred
async def test_connectto_bad_greeting_silence_and_no_listener_are_one_451(smqp_server, listen):
    """A wrong greeting, a listener that never greets and a port nobody listens on get the
    same 451 line: the client learns nothing about what listens where."""
    server = await smqp_server(smqp_connectto_allow=LOOPBACK, login_timeout=0.5)
    alice = await server.login("alice", "c1")
    rude = Listening(greeting=b"HELLO there\r\n")
    port = await listen(rude)
    answers = [await refused(alice.command("CONNECTTO", "alice:c1", str(port)), 451)]
    silent = Listening(greeting=b"")
    silent_port = await listen(silent)
    answers.append(await refused(alice.command("CONNECTTO", "alice:c1", str(silent_port)), 451))
    assert silent.connections  # it was dialled, and said nothing
    answers.append(await refused(alice.command("CONNECTTO", "alice:c1", str(free_port())), 451))  # nobody listens
    assert {error.lines for error in answers} == {("Local error: notification connection failed",)}
    good = Listening()
    good_port = await listen(good)
    assert (await alice.command("CONNECTTO", "alice:c1", str(good_port))).code == 200  # positive control


@pytest_twisted.ensureDeferred
async def test_connectto_own_loopback_address_refused_unless_allowed(smqp_server, listen):
    """A client on the broker's host would scan its ports through CONNECTTO: its own address
    is loopback, which only the allow-list admits; 403 before anything is dialled."""
    listening = Listening()
    port = await listen(listening)
    closed = await smqp_server()
    alice = await closed.login("alice", "c1")
    await refused(alice.command("CONNECTTO", "alice:c1", str(port)), 403)
    await refused(alice.command("CONNECTTO", "alice:c1", f"127.0.0.1:{port}"), 403)
    await refused(alice.command("CONNECTTO", "alice:c1", f"[::ffff:127.0.0.1]:{port}"), 403)
    assert not listening.connections
    assert (await alice.noop()).lines == ("OK",)
    allowed = await smqp_server(smqp_connectto_allow=f"127.0.0.1:{port}")
    bob = await allowed.login("bob", "c1")
    assert (await bob.command("CONNECTTO", "bob:c1", str(port))).code == 200  # positive control
    assert listening.connections[0].suid == allowed.factory.suid


def test_allow_list_parsing():
    entries = parse_allow_list("10.0.0.0/8, 192.0.2.7:7000 [::1]:9000 notify.example.com")
    assert permitted("127.0.0.1", "10.1.2.3", 5, entries)
    assert permitted("127.0.0.1", "192.0.2.7", 7000, entries)
    assert not permitted("127.0.0.1", "192.0.2.7", 7001, entries)
    assert permitted("127.0.0.1", "::1", 9000, entries)
    assert permitted("127.0.0.1", "Notify.example.com", 1, entries)
    assert permitted("93.184.216.34", "93.184.216.34", 1, ())  # a public address: its own
    assert not permitted("93.184.216.34", "93.184.216.35", 1, ())
    for own in ("127.0.0.1", "::1", "10.1.2.3", "192.168.1.2", "169.254.1.1", "fe80::1", "fd00::1",
                "100.64.0.1", "::ffff:127.0.0.1", "0.0.0.0"):
        assert not permitted(own, own, 1, ()), own  # not public: only the allow-list admits it
    assert permitted("127.0.0.1", "127.0.0.1", 1, parse_allow_list("127.0.0.1"))
    assert not permitted("127.0.0.1", "127.0.0.2", 1, ())
    for bad in ("10.0.0.0/33", "a b/c", "1.2.3.4:0", "[::1"):
        with pytest.raises(ConfigurationError):
            parse_allow_list(bad)
