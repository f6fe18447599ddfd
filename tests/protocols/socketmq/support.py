"""Real-socket helpers for socket.mq tests: an in-process brokerd (SSMP + socket.mq on
loopback ports, one Broker), a raw SSMP line client, and bounded waits."""
from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any, Callable

from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol

from brokerd.auth.realm import build_portal
from brokerd.config import Runtime, Settings
from brokerd.core.broker import Broker
from brokerd.protocols.socketmq.server import build_factory
from brokerd.protocols.ssmp.server import SSMPServerFactory
from tests.support import processes
from tests.support.broker import free_port, twistd

TIMEOUT = 10.0
"""Seconds any single wait may take before the test fails instead of hanging."""


def reactor() -> Any:
    from twisted.internet import reactor as global_reactor

    return global_reactor


def sleep(seconds: float) -> Deferred:
    d: Deferred = Deferred()
    reactor().callLater(seconds, d.callback, None)
    return d


class Waiter:
    """Collects items and fires bounded waits for conditions over them."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._waits: list[tuple[Callable[[list[Any]], bool], Deferred]] = []

    def __call__(self, item: Any) -> None:
        self.items.append(item)
        self._check()

    def until(self, condition: Callable[[list[Any]], bool] = bool) -> Deferred:
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


class LineClient(Protocol):
    """A raw SSMP client: sends what the test writes, collects every line it gets."""

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


class LiveBrokerd:
    """SSMP and socket.mq front ends on 127.0.0.1 (OS-chosen ports) around one Broker."""

    def __init__(self, data_dir: Path, events: Any = None, **settings: Any) -> None:
        """``events``: an IEventRecorder for the front ends (the runtime's ``event_log``)."""
        extra = {k: settings.pop(k) for k in list(settings) if k.startswith("socketmq_")}
        self.settings = Settings(open_login=True, data_dir=data_dir, **settings)
        for name, value in extra.items():
            setattr(self.settings, name, value)
        self.broker = Broker(max_connections=self.settings.max_connections)
        portal = build_portal(open_login=True)
        self.runtime = Runtime(self.settings, self.broker, portal, reactor())
        if events is not None:
            self.runtime.resources["event_log"] = events
        self.ssmp_factory = SSMPServerFactory(self.broker, portal, self.settings, reactor())
        self.site = build_factory(self.runtime)
        self.hub = self.runtime.resources["socketmq.hub"]
        self.ports: list[Any] = []
        self.clients: list[Any] = []

    async def start(self, tls_endpoint: Any = None) -> LiveBrokerd:
        self.ssmp_port = await endpoints.serverFromString(reactor(), "tcp:0:interface=127.0.0.1").listen(self.ssmp_factory)
        self.http_port = await endpoints.serverFromString(reactor(), "tcp:0:interface=127.0.0.1").listen(self.site)
        self.ports += [self.ssmp_port, self.http_port]
        if tls_endpoint is not None:
            self.tls_port = await tls_endpoint.listen(self.site)
            self.ports.append(self.tls_port)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port.getHost().port}"

    @property
    def tls_url(self) -> str:
        return f"https://localhost:{self.tls_port.getHost().port}"

    async def ssmp(self, name: bytes = b"sam") -> LineClient:
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", self.ssmp_port.getHost().port)
        client: LineClient = await endpoint.connect(Factory.forProtocol(LineClient))
        self.clients.append(client)
        await client.login(name)
        return client

    def track(self, client: Any) -> Any:
        self.clients.append(client)
        return client

    async def stop(self) -> None:
        for client in self.clients:
            close = client.close()
            if isinstance(close, Deferred):
                await close.addTimeout(TIMEOUT, reactor())
        for session in self.broker.sessions():
            drop = getattr(session, "dropConnection", None)
            if drop is not None:
                drop(abort=True)
        for port in self.ports:
            await port.stopListening()
        # let aborted connections finish closing before the next test
        await sleep(0.05)


class TwistdBroker:
    """A real ``twistd -n brokerd`` with SSMP and socket.mq on loopback ports."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.ssmp_port = free_port()
        self.http_port = free_port()
        self.data_dir = data_dir
        self.log_path = data_dir.parent / "twistd.log"
        self.command = [
            *twistd(),
            "--ssmp", f"tcp:{self.ssmp_port}:interface=127.0.0.1",
            "--socketmq", f"tcp:{self.http_port}:interface=127.0.0.1",
            "--open-login", "--data-dir", str(data_dir), *extra,
        ]
        self.process: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    async def start(self, startup_timeout: float = 30.0) -> TwistdBroker:
        """Start it and wait (bounded, polling the ports) until both listeners accept."""
        self.process = processes.spawn(self.command, self.log_path)
        deadline = time.monotonic() + startup_timeout
        for port in (self.ssmp_port, self.http_port):
            while not _accepts(port):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    processes.stop(self.process)
                    raise RuntimeError(f"twistd did not listen on {port}: {self.log_path.read_text()[-2000:]}")
                await sleep(0.1)
        return self

    async def ssmp(self, name: bytes) -> LineClient:
        endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", self.ssmp_port)
        client: LineClient = await endpoint.connect(Factory.forProtocol(LineClient))
        await client.login(name)
        return client

    def stop(self) -> None:
        if self.process is not None:
            processes.stop(self.process)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False
