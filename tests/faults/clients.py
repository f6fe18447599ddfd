"""The traffic of a fault-injection run: publishers and subscribers in SSMP, MCCHAT, socket.mq
(WebSocket) and SMQP (a durable publisher, a durable subscriber acknowledging each
notification with the 310 exchange), on the run's reactor with brokerd's own client code.

Every client reconnects as a real one would: when its connection is lost, or when the server
leaves a request unanswered for ``stall`` seconds (a frozen node), it drops the connection and
connects again, to its home node first, then to the others, after a short delay.  Every wait
is bounded; the only timers are the clients' own pace (messages per second, keep-alives,
reconnect delay)."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet import endpoints
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.protocol import Factory, Protocol

from brokerd.protocols.mcchat.client import connect as mcchat_connect
from brokerd.protocols.smqp.client import connect as smqp_connect
from brokerd.protocols.socketmq.api import Client as SocketMQClient
from tests.faults.tally import Receiver, Tally

TOPIC = "faults"
SMQP_TOPIC = "/durable"
"""Its own topic: an SSMP, MCCHAT or socket.mq publish on ``faults`` would be stored for a
durable subscriber of ``/faults`` too."""
CONNECT_TIMEOUT = 5.0
RECONNECT_DELAY = 0.5


class Closed(Exception):
    """The connection is gone (or was given up on)."""


def pause(reactor: Any, seconds: float) -> Deferred:
    """A client's pace (not a wait for an event)."""
    d: Deferred = Deferred()
    reactor.callLater(seconds, d.callback, None)
    return d


class SSMPLine(Protocol):
    """A raw SSMP connection: requests answered in order by a code line, ``000`` events to
    ``on_event``, ``PING`` answered by the ``000 . PONG`` event."""

    def __init__(self) -> None:
        self.buffer = b""
        self.answers: deque[Deferred] = deque()
        self.pongs: deque[Deferred] = deque()
        self.on_event: Callable[[bytes], None] = lambda line: None
        self.lost: Deferred = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line == b"000 . PONG":
                if self.pongs:
                    self.pongs.popleft().callback(line)
            elif line.startswith(b"000 "):
                self.on_event(line)
            elif self.answers:
                self.answers.popleft().callback(line)

    def connectionLost(self, reason: Any = None) -> None:
        for d in (*self.answers, *self.pongs):
            d.errback(Closed("connection lost"))
        self.answers.clear()
        self.pongs.clear()
        self.lost.callback(None)

    def request(self, line: bytes) -> Deferred:
        d: Deferred = Deferred()
        self.answers.append(d)
        self.transport.write(line + b"\n")
        return d

    def ping(self) -> Deferred:
        d: Deferred = Deferred()
        self.pongs.append(d)
        self.transport.write(b"PING\n")
        return d


async def ssmp_connect(reactor: Any, port: int) -> SSMPLine:
    endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=CONNECT_TIMEOUT)
    return await endpoint.connect(Factory.forProtocol(SSMPLine)).addTimeout(CONNECT_TIMEOUT, reactor)  # type: ignore[no-any-return]


class Client:
    """A client that keeps reconnecting until :meth:`stop`; subclasses write ``session``."""

    kind = "client"

    def __init__(self, run: Any, name: str, home: int) -> None:
        self.run = run
        self.reactor = run.reactor
        self.tally: Tally = run.tally
        self.name = name
        self.home = home
        self.connections = 0
        self.stopping = False
        self.presence_name: str | None = None
        """This connection's name in presence, while it is subscribed (subscribers only)."""
        self.node: int | None = None
        self.finished: Deferred | None = None
        self.established = False
        """Whether the current session got as far as logging in (and subscribing)."""
        self._abort: Callable[[], None] | None = None

    def start(self) -> None:
        self.finished = ensureDeferred(self._run())

    def stop(self) -> Deferred:
        self.stopping = True
        if self._abort is not None:
            self._abort()
        assert self.finished is not None
        return self.finished

    async def _run(self) -> None:
        while not self.stopping:
            for index in self.run.node_order(self.home):
                if self.stopping:
                    return
                self.established = False
                try:
                    self.node = index
                    await self.session(index)
                except Exception as exc:  # noqa: BLE001 - any failure of a session: reconnect
                    self.run.note(f"{self.name} on node{index + 1}: {type(exc).__name__}: {exc}"[:300])
                finally:
                    self.presence_name = None
                    self.node = None
                    self._abort = None
                if self.stopping:
                    return
                await pause(self.reactor, RECONNECT_DELAY)
                if self.established:
                    self.tally.reconnected(self.name)
                    break  # a session ended: connect again, home first
                # this node did not take us (refused, or no answer in time): the next one

    def ready(self) -> None:
        """The session is set up (logged in, subscribed)."""
        self.established = True
        self.run.signal.changed()

    def stream(self) -> str:
        self.connections += 1
        return f"{self.name}.c{self.connections}"

    async def bounded(self, d: Deferred, timeout: float | None = None) -> Any:
        """``d``'s result, or the connection dropped (Closed) if it takes over ``timeout``
        (default: the run's stall bound)."""
        try:
            return await d.addTimeout(timeout if timeout is not None else self.run.stall, self.reactor)
        except Exception as exc:
            if self._abort is not None:
                self._abort()
            raise Closed(f"{type(exc).__name__} {exc}") from None

    async def session(self, index: int) -> None:
        raise NotImplementedError


class SSMPPublisher(Client):
    kind = "ssmp"

    async def session(self, index: int) -> None:
        line = await ssmp_connect(self.reactor, self.run.nodes[index].ports["ssmp"])
        self._abort = line.transport.abortConnection
        stream = self.stream()
        assert await self.bounded(line.request(b"LOGIN " + stream.encode() + b" open")) == b"200"
        self.ready()
        number = 0
        while not self.stopping and not line.lost.called:
            number += 1
            payload = self.tally.publishing("ssmp", stream, number)
            if await self.bounded(line.request(b"MCAST " + TOPIC.encode() + b" " + payload.encode())) == b"200":
                self.tally.acknowledge("ssmp")
            await pause(self.reactor, self.run.interval)
        line.transport.loseConnection()


class SSMPSubscriber(Client):
    kind = "ssmp"

    async def session(self, index: int) -> None:
        line = await ssmp_connect(self.reactor, self.run.nodes[index].ports["ssmp"])
        self._abort = line.transport.abortConnection
        stream = self.stream()
        receiver = Receiver(stream)
        prefix = b" MCAST " + TOPIC.encode() + b" "

        def event(data: bytes) -> None:
            if prefix in data:
                self.tally.receive(receiver, data.split(prefix, 1)[1], self.name)

        line.on_event = event
        assert await self.bounded(line.request(b"LOGIN " + stream.encode() + b" open")) == b"200"
        assert await self.bounded(line.request(b"SUBSCRIBE " + TOPIC.encode())) == b"200"
        self.presence_name = stream
        self.ready()
        while not self.stopping and not line.lost.called:
            await pause(self.reactor, 1.0)
            if not line.lost.called:
                await self.bounded(line.ping())
        line.transport.loseConnection()


class MCChatSubscriber(Client):
    kind = "mcchat"

    async def session(self, index: int) -> None:
        receiver = Receiver(self.stream())

        def message(topic: str, username: str, text: str) -> None:
            if topic == TOPIC:
                self.tally.receive(receiver, text, self.name)

        endpoint = endpoints.TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.run.nodes[index].ports["mcchat"],
                                                timeout=CONNECT_TIMEOUT)
        client = await self.bounded(Deferred.fromCoroutine(mcchat_connect(endpoint, message)), CONNECT_TIMEOUT)
        self._abort = client.transport.abortConnection
        client.subscribe(TOPIC)
        await self.bounded(client.sync())
        self.presence_name = f"mcchat:127.0.0.1:{client.transport.getHost().port}"
        self.ready()
        closed = client.when_closed()
        while not self.stopping and not closed.called:
            await pause(self.reactor, 1.0)
            if not closed.called:
                await self.bounded(client.sync())
        client.transport.loseConnection()


class MCChatPublisher(Client):
    kind = "mcchat"

    async def session(self, index: int) -> None:
        endpoint = endpoints.TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.run.nodes[index].ports["mcchat"],
                                                timeout=CONNECT_TIMEOUT)
        client = await self.bounded(Deferred.fromCoroutine(mcchat_connect(endpoint)), CONNECT_TIMEOUT)
        self._abort = client.transport.abortConnection
        stream = self.stream()
        self.ready()
        closed = client.when_closed()
        number = 0
        while not self.stopping and not closed.called:
            number += 1
            client.publish(TOPIC, self.name, self.tally.publishing("mcchat", stream, number))
            if number % 10 == 0:  # MCCHAT answers nothing: a topic-list round trip says the node reads
                await self.bounded(client.sync())
                self.tally.acknowledged["mcchat"] = self.tally.acknowledged.get("mcchat", 0) + 10
            await pause(self.reactor, self.run.interval)
        client.transport.loseConnection()


class SocketMQSubscriber(Client):
    kind = "socketmq"

    async def session(self, index: int) -> None:
        client = SocketMQClient(f"http://127.0.0.1:{self.run.nodes[index].ports['socketmq']}", reactor=self.reactor)
        try:
            connection = await self.bounded(client.connect(), CONNECT_TIMEOUT)
            self._abort = connection.transport.abortConnection
            receiver = Receiver(self.stream())
            await self.bounded(connection.subscribe(TOPIC, lambda event: self.tally.receive(receiver, event.data, self.name)))
            self.presence_name = "socketmq"
            self.ready()
            while not self.stopping and not connection.closed.called:
                await pause(self.reactor, 1.0)
                if not connection.closed.called:  # a publish on a topic of its own: the node answers
                    await self.bounded(connection.publish(f"{TOPIC}-keepalive-{self.name}", b"."))
        finally:
            self._abort = None
            await client.close().addTimeout(CONNECT_TIMEOUT, self.reactor).addErrback(lambda _: None)


class SocketMQPublisher(Client):
    kind = "socketmq"

    async def session(self, index: int) -> None:
        client = SocketMQClient(f"http://127.0.0.1:{self.run.nodes[index].ports['socketmq']}", reactor=self.reactor)
        try:
            connection = await self.bounded(client.connect(), CONNECT_TIMEOUT)
            self._abort = connection.transport.abortConnection
            stream = self.stream()
            self.ready()
            number = 0
            while not self.stopping and not connection.closed.called:
                number += 1
                await self.bounded(connection.publish(TOPIC, self.tally.publishing("socketmq", stream, number)))
                self.tally.acknowledge("socketmq")
                await pause(self.reactor, self.run.interval)
        finally:
            self._abort = None
            await client.close().addTimeout(CONNECT_TIMEOUT, self.reactor).addErrback(lambda _: None)


class SMQPPublisher(Client):
    """Publishes to the durable topic, one publish at a time; a 200 is an acknowledgement
    (the message is stored), anything else (451 while the store is away) is not."""

    kind = "smqp"

    async def session(self, index: int) -> None:
        endpoint = endpoints.TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.run.nodes[index].ports["smqp"],
                                                timeout=CONNECT_TIMEOUT)
        client = await self.bounded(smqp_connect(endpoint), CONNECT_TIMEOUT)
        self._abort = client.transport.abortConnection
        await self.bounded(client.login("bob", "pub", "bobpw"), self.run.smqp_stall)
        stream = self.stream()
        self.ready()
        number = 0
        closed = client.when_closed()
        while not self.stopping and not closed.called:
            number += 1
            payload = self.tally.publishing("smqp", stream, number)
            d = client.publish(SMQP_TOPIC, f"{stream}-{number}", [("text/plain", payload.encode())])
            try:
                reply = await self.bounded(d, self.run.smqp_stall)
            except Closed:
                raise
            except Exception as exc:  # noqa: BLE001 - an error reply (451): not acknowledged
                self.run.note(f"{self.name}: {payload} refused: {exc}"[:200])
            else:
                if reply.code == 200:
                    self.tally.smqp_acknowledged.add(payload)
                    self.tally.acknowledge("smqp")
            await pause(self.reactor, self.run.smqp_interval)
        client.transport.loseConnection()


class SMQPDurableSubscriber(Client):
    """bob:durable, subscribed once (the subscription outlives its connections): every
    notification is answered ``310 ACK``; the server's ``310 ACK`` completes the exchange."""

    kind = "smqp"

    async def session(self, index: int) -> None:
        endpoint = endpoints.TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.run.nodes[index].ports["smqp"],
                                                timeout=CONNECT_TIMEOUT)
        receiver = Receiver(self.stream())
        client: Any = None

        def notified(notify: Any) -> None:
            if notify.kind != "MESSAGE" or not notify.body or not notify.body.sections:
                self.run.note(f"{self.name}: unexpected notification {notify!r}"[:200])
                return
            payload = notify.body.sections[0].data
            self.tally.smqp_notified(receiver, payload)
            text = payload.decode("utf-8", "replace")

            def completed(reply: Any) -> None:
                if reply.code == 310:
                    self.tally.smqp_completed.add(text)
                    self.tally.signal.changed()

            client.acknowledge("310 ACK").addCallbacks(completed, lambda _: None)

        client = await self.bounded(smqp_connect(endpoint, notified), CONNECT_TIMEOUT)
        self._abort = client.transport.abortConnection
        await self.bounded(client.login("bob", "durable", "bobpw"), self.run.smqp_stall)
        self.ready()
        closed = client.when_closed()
        while not self.stopping and not closed.called:
            await pause(self.reactor, 2.0)
            if not closed.called:
                await self.bounded(client.noop(), self.run.smqp_stall)
        client.transport.loseConnection()
