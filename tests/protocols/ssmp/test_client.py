"""The SSMP client: the protocol on a StringTransport (exact bytes, Deferred outcomes, what the
spec makes a client do by itself), conversations with the real server through iosim, and the
reconnecting SSMPClient on a Clock."""
from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.error import (
    ConnectionClosed,
    ConnectionDone,
    ConnectionLost,
    ConnectionRefusedError,
)
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure
from twisted.test import iosim
from zope.interface import implementer

from brokerd.auth.realm import build_portal
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.endpoints import endpoint_host
from brokerd.protocols.ssmp.client import (
    SSMPClient,
    SSMPClientFactory,
    SSMPClientProtocol,
    SSMPError,
    client_endpoint,
)
from brokerd.protocols.ssmp.events import Event
from brokerd.protocols.ssmp.server import SSMPServerFactory

# ---------------------------------------------------------------------------- helpers


class Recorder:
    """Collects what the event callbacks receive."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, bytes, bytes | None, bytes, bool]] = []
        self.presence: list[tuple[bytes, bytes, bytes, bool]] = []

    def on_message(self, *args: Any) -> None:
        self.messages.append(args)  # type: ignore[arg-type]

    def on_presence(self, *args: Any) -> None:
        self.presence.append(args)  # type: ignore[arg-type]


def outcome(d: Deferred) -> list[Any]:
    """The result or Failure a Deferred has fired with (empty while it has not)."""
    seen: list[Any] = []
    d.addBoth(seen.append)
    return seen


def connect(
    keepalive: float | None = 30.0, pong_timeout: float = 30.0
) -> tuple[SSMPClientProtocol, StringTransport, Clock, Recorder]:
    clock = Clock()
    recorder = Recorder()
    factory = SSMPClientFactory(
        clock, keepalive, pong_timeout, recorder.on_message, recorder.on_presence
    )
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport, clock, recorder


def feed_bytewise(protocol: SSMPClientProtocol, data: bytes) -> None:
    for index in range(len(data)):
        protocol.dataReceived(data[index : index + 1])


def logged_in(**options: Any) -> tuple[SSMPClientProtocol, StringTransport, Clock, Recorder]:
    protocol, transport, clock, recorder = connect(**options)
    protocol.login(b"alice")
    protocol.dataReceived(b"200\n")
    transport.clear()
    return protocol, transport, clock, recorder


def lose(protocol: SSMPClientProtocol, reason: Exception | None = None) -> None:
    protocol.connectionLost(Failure(reason or ConnectionDone()))


# ---------------------------------------------------------------------------- requests


def test_login_writes_the_request_and_fires_with_the_protocol() -> None:
    protocol, transport, _clock, _recorder = connect()
    d = protocol.login(b"alice")
    assert transport.value() == b"LOGIN alice open\n"
    seen = outcome(d)
    assert seen == []
    protocol.dataReceived(b"200\n")
    assert seen == [protocol]
    assert protocol.identifier == b"alice"


def test_login_with_a_credential_sends_it_as_a_payload() -> None:
    protocol, transport, _clock, _recorder = connect()
    protocol.login(b"bob/phone", b"secret", b"s3cret")
    protocol.login(b"carol", b"secret", b"\x01binary")
    assert transport.value() == (
        b"LOGIN bob/phone secret s3cret\nLOGIN carol secret \x00\x06\x01binary\n"
    )


def test_refused_login_fails_with_the_code_and_the_schemes() -> None:
    protocol, _transport, _clock, _recorder = connect()
    seen = outcome(protocol.login(b"alice", b"open"))
    protocol.dataReceived(b"401 open secret\n")
    error = seen[0].value
    assert isinstance(error, SSMPError)
    assert (error.code, error.content) == (b"401", b"open secret")
    assert str(error) == "SSMP 401 open secret"
    assert protocol.identifier is None


def test_requests_are_written_exactly_and_answered_in_order() -> None:
    protocol, transport, _clock, _recorder = logged_in()
    requests = [
        protocol.subscribe(b"news"),
        protocol.subscribe(b"chat", presence=True),
        protocol.unsubscribe(b"gone"),
        protocol.ucast(b"bob", b"hi bob"),
        protocol.mcast(b"news", b"hello world"),
        protocol.bcast(b"everyone"),
    ]
    assert transport.value() == (
        b"SUBSCRIBE news\n"
        b"SUBSCRIBE chat PRESENCE\n"
        b"UNSUBSCRIBE gone\n"
        b"UCAST bob hi bob\n"
        b"MCAST news hello world\n"
        b"BCAST everyone\n"
    )
    seen = [outcome(d) for d in requests]
    feed_bytewise(protocol, b"200\n409\n404\n404\n200\n405\n")
    assert seen[0] == [None] and seen[4] == [None]
    codes = [s[0].value.code for s in seen if isinstance(s[0], Failure)]
    assert codes == [b"409", b"404", b"404", b"405"]


def test_payloads_that_text_cannot_carry_go_binary() -> None:
    protocol, transport, _clock, _recorder = logged_in()
    protocol.mcast(b"t", b"two\nlines")
    protocol.mcast(b"t", b"\x02starts with STX")
    protocol.mcast(b"t", b"text", binary=True)
    protocol.bcast(b"x" * 1024)
    assert transport.value() == (
        b"MCAST t \x00\x08two\nlines\n"
        b"MCAST t \x00\x0f\x02starts with STX\n"
        b"MCAST t \x00\x03text\n"
        b"BCAST " + b"x" * 1024 + b"\n"
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.mcast(b"t", b""),
        lambda p: p.mcast(b"t", b"x" * 1025),
        lambda p: p.mcast(b"bad topic", b"x"),
        lambda p: p.mcast(b"t" * 65, b"x"),
        lambda p: p.ucast(b"", b"x"),
        lambda p: p.subscribe(b"a\nb"),
        lambda p: p.login(b"alice", b"no spaces"),
        lambda p: p.login(b"alice", b"secret", b""),
    ],
)
def test_requests_no_ssmp_line_can_carry_raise_value_error(call: Any) -> None:
    protocol, transport, _clock, _recorder = logged_in()
    with pytest.raises(ValueError):
        call(protocol)
    assert transport.value() == b""


def test_payloads_must_be_bytes() -> None:
    protocol, _transport, _clock, _recorder = logged_in()
    with pytest.raises(TypeError):
        protocol.mcast(b"t", "text")  # type: ignore[arg-type]


def test_ping_fires_with_the_round_trip_when_pong_arrives() -> None:
    protocol, transport, clock, _recorder = logged_in()
    seen = outcome(protocol.ping())
    assert transport.value() == b"PING\n"
    clock.advance(0.25)
    protocol.dataReceived(b"000 . PONG\n")
    assert seen == [0.25]


def test_close_sends_close_and_drops_the_connection_on_200() -> None:
    protocol, transport, _clock, _recorder = logged_in()
    seen = outcome(protocol.close())
    assert transport.value() == b"CLOSE\n"
    assert not protocol.is_open
    later = outcome(protocol.mcast(b"t", b"too late"))
    assert isinstance(later[0].value, ConnectionClosed)
    assert transport.value() == b"CLOSE\n"
    protocol.dataReceived(b"200\n")
    assert seen == [None]
    assert transport.disconnecting


def test_connection_loss_fails_unanswered_requests_but_not_close() -> None:
    protocol, _transport, _clock, _recorder = logged_in()
    published = outcome(protocol.mcast(b"t", b"x"))
    pinged = outcome(protocol.ping())
    closed = outcome(protocol.close())
    gone = outcome(protocol.when_closed())
    lose(protocol, ConnectionLost())
    assert isinstance(published[0].value, ConnectionLost)
    assert isinstance(pinged[0].value, ConnectionLost)
    assert closed == [None]
    assert isinstance(gone[0], ConnectionLost)
    assert isinstance(outcome(protocol.when_closed())[0], ConnectionLost)


def test_requests_before_the_connection_fail() -> None:
    protocol = SSMPClientProtocol(reactor=Clock())
    assert isinstance(outcome(protocol.mcast(b"t", b"x"))[0].value, ConnectionClosed)


# ---------------------------------------------------------------------------- events


def test_messages_reach_on_message_as_content() -> None:
    protocol, transport, _clock, recorder = logged_in()
    feed_bytewise(
        protocol,
        b"000 bob MCAST news hello world\n"
        b"000 bob UCAST alice \x00\x04a\nbcd\n"
        b"000 carol BCAST hi all\n",
    )
    assert recorder.messages == [
        (b"bob", b"MCAST", b"news", b"hello world", False),
        (b"bob", b"UCAST", b"alice", b"a\nbcd", True),
        (b"carol", b"BCAST", None, b"hi all", False),
    ]
    assert transport.value() == b""
    assert not transport.disconnecting


def test_presence_reaches_on_presence() -> None:
    protocol, _transport, _clock, recorder = logged_in()
    protocol.dataReceived(b"000 bob SUBSCRIBE news PRESENCE\n000 carol SUBSCRIBE news\n")
    protocol.dataReceived(b"000 bob UNSUBSCRIBE news\n")
    assert recorder.presence == [
        (b"bob", b"SUBSCRIBE", b"news", True),
        (b"carol", b"SUBSCRIBE", b"news", False),
        (b"bob", b"UNSUBSCRIBE", b"news", False),
    ]


def test_event_received_can_be_overridden() -> None:
    class Raw(SSMPClientProtocol):
        def __init__(self) -> None:
            super().__init__(reactor=Clock())
            self.events: list[Event] = []

        def eventReceived(self, event: Event) -> None:
            self.events.append(event)

    protocol = Raw()
    protocol.makeConnection(StringTransport())
    protocol.dataReceived(b"000 bob MCAST news \x00\x01hi\n000 . PONG\n")
    assert protocol.events == [Event(b"bob", b"MCAST", b"news", b"\x00\x01hi")]


def test_a_failing_handler_is_logged_and_the_connection_stays() -> None:
    events: list[dict] = []
    protocol, transport, _clock, _recorder = logged_in()
    protocol.on_message = lambda *args: 1 / 0  # type: ignore[method-assign]
    globalLogPublisher.addObserver(events.append)
    try:
        protocol.dataReceived(b"000 bob MCAST news hi\n000 . PING\n")
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert any(e.get("log_failure") for e in events)
    assert transport.value() == b"PONG\n"
    assert not transport.disconnecting


def test_server_ping_is_answered_with_pong() -> None:
    protocol, transport, _clock, _recorder = logged_in()
    feed_bytewise(protocol, b"000 . PING\n")
    assert transport.value() == b"PONG\n"
    assert not transport.disconnecting


@pytest.mark.parametrize(
    "line",
    [
        b"000 bob FROB news\n",  # a verb SSMP 1.1 does not define
        b"000 bob CLOSE\n",  # a request verb, never an event
        b"000 bob LOGIN alice open\n",
    ],
)
def test_an_event_with_an_unknown_verb_closes_the_connection(line: bytes) -> None:
    protocol, _transport, _clock, recorder = logged_in()
    transport = protocol.transport
    pending = outcome(protocol.mcast(b"t", b"x"))
    protocol.dataReceived(line + b"000 bob MCAST news after\n200\n")
    assert transport.disconnecting
    assert recorder.messages == []
    assert pending == []
    lose(protocol)
    assert isinstance(pending[0].value, ConnectionDone)


@pytest.mark.parametrize(
    "data",
    [
        b"hello\n",
        b"20\n",
        b"000 bob MCAST news\n",
        b"000 bob MCAST news \x00\x02short\n",
        b"200 \x00\x01abc",
        b"x" * 3000,
    ],
)
def test_a_grammar_violation_closes_the_connection(data: bytes) -> None:
    protocol, transport, _clock, _recorder = logged_in()
    feed_bytewise(protocol, data)
    assert transport.disconnecting
    assert not protocol.is_open


def test_events_before_a_violation_are_still_delivered() -> None:
    protocol, transport, _clock, recorder = logged_in()
    protocol.dataReceived(b"000 bob MCAST news first\nnonsense\n000 bob MCAST news second\n")
    assert [m[3] for m in recorder.messages] == [b"first"]
    assert transport.disconnecting


def test_a_response_to_no_request_closes_the_connection() -> None:
    protocol, transport, _clock, _recorder = logged_in()
    protocol.dataReceived(b"200\n")
    assert transport.disconnecting


# ---------------------------------------------------------------------------- keepalive


def test_keepalive_pings_a_quiet_server_and_closes_without_pong() -> None:
    protocol, transport, clock, _recorder = logged_in(keepalive=30, pong_timeout=10)
    clock.advance(29.9)
    assert transport.value() == b""
    clock.advance(0.1)
    assert transport.value() == b"PING\n"
    clock.advance(9.9)
    assert not transport.disconnecting
    clock.advance(0.1)
    assert transport.disconnecting
    assert not protocol.is_open


def test_keepalive_pong_keeps_the_connection_and_rearms() -> None:
    protocol, transport, clock, _recorder = logged_in(keepalive=30, pong_timeout=10)
    clock.advance(30)
    protocol.dataReceived(b"000 . PONG\n")
    clock.advance(29.9)  # past the pong timeout: the PONG cancelled it
    assert not transport.disconnecting
    assert transport.value() == b"PING\n"
    clock.advance(0.1)
    assert transport.value() == b"PING\nPING\n"
    protocol.dataReceived(b"000 . PONG\n")
    clock.advance(29)
    assert not transport.disconnecting


def test_server_events_postpone_the_keepalive_ping() -> None:
    protocol, transport, clock, _recorder = logged_in(keepalive=30)
    clock.advance(20)
    protocol.dataReceived(b"000 bob MCAST news hi\n")
    clock.advance(20)
    assert transport.value() == b""
    clock.advance(10)
    assert transport.value() == b"PING\n"


def test_no_keepalive_ping_before_login() -> None:
    protocol, transport, clock, _recorder = connect(keepalive=30)
    clock.advance(100)
    assert transport.value() == b""
    protocol.login(b"alice")
    protocol.dataReceived(b"200\n")
    transport.clear()
    clock.advance(30)
    assert transport.value() == b"PING\n"


def test_keepalive_can_be_turned_off() -> None:
    _protocol, transport, clock, _recorder = logged_in(keepalive=None)
    clock.advance(1000)
    assert transport.value() == b""
    assert not clock.getDelayedCalls()


def test_connection_loss_cancels_the_keepalive_timers() -> None:
    protocol, _transport, clock, _recorder = logged_in(keepalive=30)
    clock.advance(30)
    lose(protocol)
    assert not clock.getDelayedCalls()


# ---------------------------------------------------------------------------- with the server


class Server:
    """The real SSMP server (Broker, portal, Settings) on a Clock, for iosim conversations."""

    def __init__(self, clock: Clock, portal: Any = None, settings: Settings | None = None):
        self.broker = Broker()
        self.factory = SSMPServerFactory(
            self.broker, portal or build_portal(open_login=True), settings or Settings(), clock
        )
        self.clock = clock

    def connect(
        self, recorder: Recorder | None = None, keepalive: float | None = None
    ) -> tuple[SSMPClientProtocol, Any, iosim.IOPump]:
        recorder = recorder or Recorder()
        client_factory = SSMPClientFactory(
            self.clock, keepalive, 30.0, recorder.on_message, recorder.on_presence
        )
        return iosim.connectedServerAndClient(
            lambda: self.factory.buildProtocol(None),
            lambda: client_factory.buildProtocol(None),
            clock=self.clock,
        )


def test_conversation_with_the_server() -> None:
    clock = Clock()
    server = Server(clock)
    alice_events, bob_events = Recorder(), Recorder()
    alice, _alice_server, alice_pump = server.connect(alice_events)
    bob, _bob_server, bob_pump = server.connect(bob_events)

    def pump() -> None:
        for _ in range(3):
            alice_pump.flush()
            bob_pump.flush()

    results = [outcome(alice.login(b"alice")), outcome(bob.login(b"bob"))]
    pump()
    assert results == [[alice], [bob]]

    results = [
        outcome(alice.subscribe(b"news", presence=True)),
        outcome(bob.subscribe(b"news")),
        outcome(bob.mcast(b"news", b"hello\nworld")),
        outcome(bob.ucast(b"alice", b"psst")),
        outcome(bob.bcast(b"all of you")),
        outcome(bob.ucast(b"nobody", b"lost")),
        outcome(alice.subscribe(b"news")),
    ]
    pump()
    assert results[:5] == [[None]] * 5
    assert [r[0].value.code for r in results[5:]] == [b"404", b"409"]
    assert alice_events.presence == [(b"bob", b"SUBSCRIBE", b"news", False)]
    assert alice_events.messages == [
        (b"bob", b"MCAST", b"news", b"hello\nworld", True),
        (b"bob", b"UCAST", b"alice", b"psst", False),
        (b"bob", b"BCAST", None, b"all of you", False),
    ]
    assert bob_events.messages == []

    rtt = outcome(alice.ping())
    closed = outcome(bob.close())
    pump()
    assert rtt == [0]
    assert closed == [None]
    assert isinstance(outcome(bob.when_closed())[0], ConnectionDone)
    assert alice_events.presence[-1] == (b"bob", b"UNSUBSCRIBE", b"news", False)


def test_refused_login_against_the_server() -> None:
    clock = Clock()
    server = Server(clock, portal=build_portal(secret=b"right"))
    client, _server_protocol, pump = server.connect()
    seen = outcome(client.login(b"alice", b"secret", b"wrong"))
    pump.flush()
    assert (seen[0].value.code, seen[0].value.content) == (b"401", b"secret")
    assert isinstance(outcome(client.when_closed())[0], ConnectionDone)


def test_server_ping_is_answered_so_the_server_keeps_the_connection() -> None:
    clock = Clock()
    server = Server(clock, settings=Settings(ping_interval=30, pong_timeout=30))
    server.factory.doStart()
    try:
        client, server_protocol, pump = server.connect()
        pings: list[Event] = []
        answer = client.event_PING
        def spy(event: Event) -> None:
            pings.append(event)
            answer(event)

        client.event_PING = spy  # type: ignore[method-assign]
        client.login(b"alice")
        pump.flush()
        for _ in range(20):  # 200 s of silence from the application
            clock.advance(10)
            pump.flush()
        assert len(pings) >= 4
        assert client.is_open and not server_protocol.closed
    finally:
        server.factory.doStop()


# ---------------------------------------------------------------------------- SSMPClient


@implementer(IStreamClientEndpoint)
class ServerEndpoint:
    """A client endpoint whose connections reach ``server`` through iosim pumps; ``refuse``
    makes the next attempts fail as a refused TCP connection would."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.pumps: list[iosim.IOPump] = []
        self.server_protocols: list[Any] = []
        self.refuse = 0

    def connect(self, factory: Any) -> Deferred:
        if self.refuse:
            self.refuse -= 1
            return fail(ConnectionRefusedError())
        client = factory.buildProtocol(None)
        server = self.server.factory.buildProtocol(None)
        pump = iosim.connect(
            server,
            iosim.makeFakeServer(server),
            client,
            iosim.makeFakeClient(client),
            greet=False,
            clock=self.server.clock,
        )
        self.pumps.append(pump)
        self.server_protocols.append(server)
        return succeed(client)

    def flush(self) -> None:
        for _ in range(3):
            for pump in self.pumps:
                pump.flush()
            self.server.clock.advance(0)


def make_client(server: Server, **options: Any) -> tuple[SSMPClient, ServerEndpoint, Recorder]:
    endpoint = ServerEndpoint(server)
    recorder = Recorder()
    client = SSMPClient(
        endpoint,
        b"alice",
        reactor=server.clock,
        on_message=recorder.on_message,
        on_presence=recorder.on_presence,
        keepalive=None,
        retry_policy=lambda attempt: 2.0 * attempt,
        **options,
    )
    return client, endpoint, recorder


def test_client_logs_in_and_sends_once_connected() -> None:
    clock = Clock()
    server = Server(clock)
    client, endpoint, _recorder = make_client(server)
    sent = outcome(client.mcast(b"news", b"queued before the connection"))
    ready = outcome(client.whenConnected())
    client.startService()
    endpoint.flush()
    assert isinstance(ready[0], SSMPClientProtocol) and ready[0].identifier == b"alice"
    assert sent == [None]
    assert client.protocol is ready[0]
    outcome(client.stopService())
    endpoint.flush()
    assert server.broker.session_for("ssmp", b"alice") is None


def test_client_logs_in_again_and_resubscribes_after_a_drop() -> None:
    clock = Clock()
    server = Server(clock)
    client, endpoint, recorder = make_client(server)
    client.startService()
    subscribed = [
        outcome(client.subscribe(b"news", presence=True)),
        outcome(client.subscribe(b"x")),
    ]
    endpoint.flush()
    assert subscribed == [[None], [None]]
    assert outcome(client.unsubscribe(b"x")) == [] and client.subscriptions == {b"news": True}
    endpoint.flush()

    endpoint.server_protocols[0].transport.loseConnection()  # the broker drops us
    endpoint.flush()
    assert client.protocol is None
    waiting = outcome(client.whenConnected())
    clock.advance(2.0)  # the retry policy's delay for the first attempt
    endpoint.flush()
    assert len(endpoint.pumps) == 2
    assert waiting and waiting[0] is client.protocol
    session = server.broker.session_for("ssmp", b"alice")
    assert server.broker.subscriptions(session) == [b"news"]

    publisher, _server_protocol, pump = server.connect()
    publisher.login(b"bob")
    publisher.mcast(b"news", b"after the reconnect")
    pump.flush()
    endpoint.flush()
    assert recorder.messages[-1] == (b"bob", b"MCAST", b"news", b"after the reconnect", False)
    client.stopService()
    endpoint.flush()


def test_when_connected_fails_after_the_given_number_of_failures() -> None:
    clock = Clock()
    server = Server(clock)
    client, endpoint, _recorder = make_client(server)
    endpoint.refuse = 2
    patient, impatient = outcome(client.whenConnected(2)), outcome(client.whenConnected(1))
    forever = outcome(client.whenConnected())
    client.startService()
    clock.advance(0)
    assert impatient[0].check(ConnectionRefusedError) and patient == []
    clock.advance(2.0)
    assert patient[0].check(ConnectionRefusedError)
    clock.advance(4.0)
    endpoint.flush()
    assert isinstance(forever[0], SSMPClientProtocol)
    client.stopService()
    endpoint.flush()


def test_refused_login_is_reported_and_backs_off() -> None:
    clock = Clock()
    server = Server(clock, portal=build_portal(secret=b"right"))
    delays: list[int] = []
    endpoint = ServerEndpoint(server)
    client = SSMPClient(
        endpoint,
        b"alice",
        b"secret",
        b"wrong",
        reactor=clock,
        keepalive=None,
        retry_policy=lambda attempt: delays.append(attempt) or 5.0,
    )
    seen = outcome(client.whenConnected(failAfterFailures=1))
    client.startService()
    endpoint.flush()
    assert isinstance(seen[0].value, SSMPError) and seen[0].value.code == b"401"
    clock.advance(5.0)
    endpoint.flush()
    assert delays == [2, 3]  # each refusal counts on top of ClientService's own attempts
    assert len(endpoint.pumps) == 2
    stopped = outcome(client.stopService())
    endpoint.flush()
    assert stopped == [None]


def test_stopping_cancels_waiters_and_says_close() -> None:
    clock = Clock()
    server = Server(clock)
    client, endpoint, _recorder = make_client(server)
    client.startService()
    endpoint.flush()
    server_protocol = endpoint.server_protocols[0]
    endpoint.refuse = 100
    stopped = outcome(client.stopService())
    endpoint.flush()
    assert stopped == [None]
    assert server_protocol.closed
    assert isinstance(outcome(client.whenConnected())[0].value, CancelledError)
    assert isinstance(outcome(client.mcast(b"t", b"x"))[0].value, CancelledError)


def test_client_checks_arguments_before_waiting() -> None:
    client, _endpoint, _recorder = make_client(Server(Clock()))
    with pytest.raises(ValueError):
        client.mcast(b"t", b"")
    with pytest.raises(ValueError):
        client.subscribe(b"no spaces")
    with pytest.raises(ValueError):
        SSMPClient(ServerEndpoint(Server(Clock())), b"bad id")


# ---------------------------------------------------------------------------- endpoints


@pytest.mark.parametrize(
    "description, host",
    [
        ("tcp:broker.example:8787", "broker.example"),
        ("tcp:host=10.0.0.1:port=8787", "10.0.0.1"),
        ("tcp:port=8787:host=h", "h"),
        ("tcp:\\:\\:1:8787", "::1"),
        ("unix:/tmp/ssmp.sock", None),
    ],
)
def test_endpoint_host(description: str, host: str | None) -> None:
    assert endpoint_host(description) == host


def test_client_endpoint_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="not a client endpoint"):
        client_endpoint(Clock(), "nonsense:1")
    with pytest.raises(ValueError, match="hostname"):
        client_endpoint(Clock(), "unix:/tmp/x.sock", tls=True)
