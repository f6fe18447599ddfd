"""makeService in another Twisted program: in-process on the test's reactor, and the
documented example as a real program."""
from __future__ import annotations

import re
import socket
import sys
import time

import pytest
import pytest_twisted
from twisted.internet import defer, protocol, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol

from brokerd.config import Settings
from brokerd.core.message import MULTICAST, Message
from brokerd.tap import ListenFailed, StartupError, makeService
from tests.support import processes
from tests.support.broker import REPO, LineClient, free_port


class Collector(protocol.Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.waiting: list[tuple[bytes, defer.Deferred]] = []

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        for marker, d in list(self.waiting):
            if marker in self.data:
                self.waiting.remove((marker, d))
                d.callback(self.data)

    def wait_for(self, marker: bytes) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        if marker in self.data:
            d.callback(self.data)
        else:
            self.waiting.append((marker, d))
        return d.addTimeout(5, reactor)


@pytest_twisted.inlineCallbacks
def test_make_service_in_process_and_publish_from_host_code():
    port = free_port()
    settings = Settings(listeners={"ssmp": [f"tcp:{port}:interface=127.0.0.1"]}, open_login=True)
    service = makeService(settings, reactor)
    service.startService()
    try:
        client = yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), Collector())
        client.transport.write(b"LOGIN alice open\nSUBSCRIBE app/events\n")
        yield client.wait_for(b"200\n200\n")
        broker = service.runtime.broker
        broker.publish(Message(MULTICAST, b"app/events", b"hello from the host", "app", b"host"))
        data = yield client.wait_for(b"hello from the host\n")
        assert data.endswith(b"000 app:host MCAST app/events hello from the host\n")
        client.transport.loseConnection()
    finally:
        yield service.stopService()


@pytest_twisted.inlineCallbacks
def test_the_program_listens_with_a_running_front_end_on_its_own_endpoint(tmp_path):
    """docs/embedding.md, "Your own listener": the typed runtime's factory on the program's port
    meets the same broker as the service's own listener."""
    settings = Settings(listeners={"ssmp": ["tcp:0:interface=127.0.0.1"]}, open_login=True, data_dir=tmp_path)
    service = makeService(settings, reactor)
    service.startService()
    own = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(service.runtime.front_ends["ssmp"])
    try:
        assert service.runtime.services.broker is service.runtime.broker
        listener = next(child for child in service if getattr(child, "option", None) == "ssmp")
        subscriber = yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", own.getHost().port), Collector())
        subscriber.transport.write(b"LOGIN sub open\nSUBSCRIBE app/events\n")
        yield subscriber.wait_for(b"200\n200\n")
        port = listener.running_port.getHost().port
        publisher = yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), Collector())
        publisher.transport.write(b"LOGIN pub open\nMCAST app/events over two listeners\n")
        data = yield subscriber.wait_for(b"over two listeners\n")
        assert data.endswith(b"000 pub MCAST app/events over two listeners\n")
        for client in (subscriber, publisher):
            client.transport.loseConnection()
    finally:
        yield own.stopListening()
        yield service.stopService()


def test_bad_settings_raise_startup_error(tmp_path):
    with pytest.raises(StartupError, match="--ssmp bogus:1: not a valid endpoint"):
        makeService(Settings(listeners={"ssmp": ["bogus:1"]}, data_dir=tmp_path), reactor)


@pytest_twisted.inlineCallbacks
def test_port_in_use_raises_startup_error_then_listen_failed(tmp_path):
    """A port taken when makeService runs is a StartupError from makeService; one taken
    between makeService and startService is ListenFailed from startService."""
    port = free_port()
    endpoint = f"tcp:{port}:interface=127.0.0.1"
    first = makeService(Settings(listeners={"ssmp": [endpoint]}, data_dir=tmp_path / "first"), reactor)
    first.startService()
    try:
        with pytest.raises(StartupError, match=f"--ssmp {endpoint}: cannot listen: 127.0.0.1:{port}: "):
            makeService(Settings(listeners={"ssmp": [endpoint]}, data_dir=tmp_path / "second"), reactor)
    finally:
        yield first.stopService()
    late = makeService(Settings(listeners={"ssmp": [endpoint]}, data_dir=tmp_path / "late"), reactor)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(ListenFailed, match=f"--ssmp {endpoint}: cannot listen"):
            late.startService()
    yield late.stopService()


@pytest_twisted.inlineCallbacks
def test_second_service_on_one_data_dir_is_refused_until_the_first_stops(tmp_path):
    settings = Settings(listeners={"ssmp": ["tcp:0:interface=127.0.0.1"]}, data_dir=tmp_path)
    first = makeService(settings, reactor)
    first.startService()
    with pytest.raises(StartupError, match=f"--data-dir {tmp_path} is in use by another broker \\(pid \\d+\\)"):
        makeService(settings, reactor)
    yield first.stopService()
    second = makeService(settings, reactor)  # the lock went with the first service
    second.startService()
    yield second.stopService()


@pytest.mark.slow
def test_documented_example_runs(tmp_path):
    example = (REPO / "docs" / "examples" / "embed.py").read_text()
    documented = (REPO / "docs" / "embedding.md").read_text()
    code = re.search(r"```python\n(.*?)```", documented, re.S).group(1)
    assert code.strip() == example.split('"""', 2)[2].strip(), "docs/embedding.md and embed.py differ"
    port = free_port()
    script = tmp_path / "embed.py"
    script.write_text(example.replace("8787", str(port)))
    log = tmp_path / "embed.log"
    process = processes.spawn([sys.executable, str(script)], log, cwd=tmp_path)
    processes.wait_for_output("brokerd embedded", process, log)
    processes.wait_for_port(port, process, log, time.monotonic() + 30)
    client = LineClient.connect(port)
    assert client.request("LOGIN alice open") == b"200"
    assert client.request("PING") == b"000 . PONG"
    client.close()
    # SIGTERM, not SIGINT: a backgrounded test run hands its children SIGINT ignored
    assert processes.stop(process) == 0, log.read_text()
