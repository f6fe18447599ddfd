"""In-process brokers and clients on real loopback sockets, driven by the global reactor, with
bounded waits: the one copy of each for the real-socket tests.

``LiveBroker`` is the product's own wiring (``brokerd.tap.makeService``) with listeners on ports
the OS chooses; ``Inbox`` collects what an SSMP or MCCHAT client gets; ``SMQPInbox`` what an SMQP
client is notified of; ``LineProtocol`` is a raw SSMP line client; ``Waiter`` collects anything.
Every wait fails after :data:`TIMEOUT` seconds instead of hanging.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.application.internet import backoffPolicy
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol

from brokerd.config import Settings
from brokerd.protocols.mcchat.client import MCChatClientProtocol, client_endpoint, connect
from brokerd.protocols.ssmp.client import SSMPClient
from brokerd.protocols.ssmp.client import client_endpoint as ssmp_endpoint
from brokerd.tap import ListenerService, makeService

TIMEOUT = 10.0
"""Seconds any single wait may take before the test fails instead of hanging."""
LOOPBACK = "tcp:0:interface=127.0.0.1"


def reactor() -> Any:
    from twisted.internet import reactor as global_reactor

    return global_reactor


def sleep(seconds: float) -> Deferred:
    """Let ``seconds`` pass on the reactor: only for tests about time passing (an idle timeout),
    never to wait for an event."""
    d: Deferred = Deferred()
    reactor().callLater(seconds, d.callback, None)
    return d


class Waiter:
    """Collects items (it is the callback) and fires bounded waits for conditions over them."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._waits: list[tuple[Callable[[list[Any]], bool], Deferred]] = []

    def __call__(self, item: Any) -> None:
        self.items.append(item)
        self._check()

    def until(self, condition: Callable[[list[Any]], bool] = bool) -> Deferred:
        """Fires with the items once ``condition(items)`` holds; fails after TIMEOUT."""
        d: Deferred = Deferred()
        self._waits.append((condition, d))
        self._check()
        return d.addTimeout(TIMEOUT, reactor())

    def count(self, n: int) -> Deferred:
        return self.until(lambda items: len(items) >= n)

    def _check(self) -> None:
        for condition, d in list(self._waits):
            if not d.called and condition(self.items):
                self._waits.remove((condition, d))
                d.callback(self.items)


class Inbox:
    """What one SSMP or MCCHAT client received, with bounded waits for more of it."""

    def __init__(self) -> None:
        self.messages: list[tuple] = []
        self.presence: list[tuple] = []
        self._waits: list[tuple[Any, Deferred]] = []

    def on_message(self, *message: Any) -> None:
        self.messages.append(message)
        self._check()

    def on_presence(self, *change: Any) -> None:
        self.presence.append(change)
        self._check()

    def until(self, condition: Any) -> Deferred:
        """Fires once ``condition(self)`` holds; fails after TIMEOUT seconds."""
        d: Deferred = Deferred()
        self._waits.append((condition, d))
        self._check()
        return d.addTimeout(TIMEOUT, reactor())

    def count(self, n: int) -> Deferred:
        return self.until(lambda inbox: len(inbox.messages) >= n)

    def _check(self) -> None:
        for condition, d in list(self._waits):
            if not d.called and condition(self):
                self._waits.remove((condition, d))
                d.callback(None)


class SMQPInbox:
    """Collects an SMQP client's notifications (it takes over ``client.notifyReceived``)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.items: list[Any] = []
        self.waiting: list[Deferred] = []
        client.notifyReceived = self.got

    def got(self, notify: Any) -> None:
        self.items.append(notify)
        waiting, self.waiting = self.waiting, []
        for d in waiting:
            d.callback(None)

    def arrival(self) -> Deferred:
        """Fires once a notification is waiting (at once if one is)."""
        d: Deferred = Deferred()
        if self.items:
            d.callback(None)
        else:
            self.waiting.append(d)
        return d

    async def next(self, timeout: float = TIMEOUT) -> Any:
        while not self.items:
            await self.arrival().addTimeout(timeout, reactor())
        return self.items.pop(0)

    async def quiet(self) -> bool:
        """True if no notification is waiting once the server has answered a NOOP on this
        connection: whatever it wrote before handling the NOOP has arrived by then."""
        reply = await self.client.noop()
        assert reply.lines == ("OK",), reply  # the positive control: the connection carries replies
        return not self.items


class LineProtocol(Protocol):
    """A raw SSMP client on the reactor: sends what the test writes, collects every line."""

    def __init__(self) -> None:
        self.lines = Waiter()
        self._buffer = b""
        self.lost: Deferred = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self.lines(line)

    def connectionLost(self, reason: Any = None) -> None:
        self.lost.callback(None)

    def send(self, *lines: bytes) -> None:
        self.transport.write(b"".join(line + b"\n" for line in lines))

    def next_line(self, predicate: Callable[[bytes], bool]) -> Deferred:
        """Fires with the first line (seen or still to come) that satisfies ``predicate``."""
        d = self.lines.until(lambda items: any(predicate(line) for line in items))
        return d.addCallback(lambda items: next(line for line in items if predicate(line)))

    async def login(self, name: bytes) -> None:
        self.send(b"LOGIN " + name + b" open")
        await self.lines.count(1)
        assert self.lines.items[0] == b"200", self.lines.items

    def close(self) -> Deferred:
        self.transport.loseConnection()
        return self.lost


class LiveBroker:
    """makeService (SSMP and MCCHAT listeners on loopback unless ``listeners`` says otherwise),
    started on the global reactor, and the clients the test opened on it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.service: MultiService | None = None
        self.mcchat_clients: list[MCChatClientProtocol] = []
        self.ssmp_clients: list[SSMPClient] = []

    @classmethod
    def start(cls, data_dir: Path, **fields: Any) -> LiveBroker:
        listeners = fields.pop("listeners", {"ssmp": [LOOPBACK], "mcchat": [LOOPBACK]})
        settings = Settings(listeners=listeners, data_dir=data_dir, open_login=True, **fields)
        live = cls(settings)
        live.service = makeService(settings, reactor())
        live.service.startService()
        return live

    @property
    def runtime(self) -> Any:
        return self.service.runtime  # type: ignore[union-attr]

    @property
    def broker(self) -> Any:
        return self.runtime.broker

    def port(self, protocol: str) -> int:
        for service in self.service:  # type: ignore[union-attr]
            if isinstance(service, ListenerService) and service.option == protocol:
                return service.running_port.getHost().port  # type: ignore[no-any-return]
        raise LookupError(protocol)

    def address(self, protocol: str) -> str:
        """The client endpoint description (without TLS) of ``protocol``'s listener."""
        return f"tcp:127.0.0.1:{self.port(protocol)}"

    def mcchat_factory(self) -> Any:
        for service in self.service:  # type: ignore[union-attr]
            if isinstance(service, ListenerService) and service.option == "mcchat":
                return service.factory
        raise LookupError("mcchat")

    async def mcchat(self, inbox: Inbox | None = None, **tls: Any) -> MCChatClientProtocol:
        """A connected MCCHAT client (INFO received)."""
        endpoint = client_endpoint(reactor(), self.address("mcchat"), **tls)
        handler = inbox.on_message if inbox is not None else None
        d = Deferred.fromCoroutine(connect(endpoint, handler))
        protocol = await d.addTimeout(TIMEOUT, reactor())
        self.mcchat_clients.append(protocol)
        return protocol  # type: ignore[no-any-return]

    async def ssmp(self, identifier: bytes, inbox: Inbox | None = None, **options: Any) -> SSMPClient:
        """A started SSMPClient, logged in; ``endpoint`` (a TLS one, say) and the other
        ``options`` go to SSMPClient.  It reconnects quickly after a drop."""
        endpoint = options.pop("endpoint", None) or ssmp_endpoint(reactor(), self.address("ssmp"))
        options.setdefault("retry_policy", backoffPolicy(initialDelay=0.05, maxDelay=0.5))
        inbox = inbox or Inbox()
        client = SSMPClient(
            endpoint,
            identifier,
            reactor=reactor(),
            on_message=inbox.on_message,
            on_presence=inbox.on_presence,
            **options,
        )
        self.ssmp_clients.append(client)
        client.startService()
        await client.whenConnected(failAfterFailures=1).addTimeout(TIMEOUT, reactor())
        return client

    async def stop(self) -> None:
        for mc in self.mcchat_clients:
            await mc.close().addTimeout(TIMEOUT, reactor())
        for client in self.ssmp_clients:
            await client.stopService()
        if self.service is not None:
            await self.service.stopService()


async def synced(*clients: MCChatClientProtocol) -> None:
    """Wait until the server handled everything each client sent so far (TLRQ barrier)."""
    for client in clients:
        await client.sync().addTimeout(TIMEOUT, reactor())


def mcchat_session(live: LiveBroker, client: Any) -> Any:
    """The server's protocol object for a client connection (found by its ``ip:port``)."""
    name = f"127.0.0.1:{client.transport.getHost().port}".encode()
    for protocol in live.mcchat_factory().live:
        if protocol.name == name:
            return protocol
    raise LookupError(name)
