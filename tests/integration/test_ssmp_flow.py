"""Flow control on real TCP sockets: reads stay at Twisted's 64 KiB whatever the output limit,
and direct writes keep every byte in order."""
from __future__ import annotations

import threading

import pytest_twisted
from twisted.internet import reactor, threads

from brokerd.config import Settings
from brokerd.protocols.ssmp.server import SSMPServerProtocol
from brokerd.tap import makeService
from tests.support.broker import LineClient, free_port


@pytest_twisted.inlineCallbacks
def test_reads_stay_small_and_order_survives_direct_writes(monkeypatch, tmp_path):
    reads: list[int] = []
    original = SSMPServerProtocol.dataReceived

    def recording(self, data):
        reads.append(len(data))
        original(self, data)

    monkeypatch.setattr(SSMPServerProtocol, "dataReceived", recording)
    port = free_port()
    settings = Settings(
        listeners={"ssmp": [f"tcp:{port}:interface=127.0.0.1"]}, open_login=True,
        data_dir=tmp_path, event_log=False, max_output_buffer=8 << 20,
    )
    service = makeService(settings, reactor)
    service.startService()
    messages = 20_000

    def conversation() -> list[bytes]:
        subscriber = LineClient.connect(port, timeout=20)
        assert subscriber.request("LOGIN sub open") == b"200"
        assert subscriber.request("SUBSCRIBE t") == b"200"
        publisher = LineClient.connect(port, timeout=20)
        assert publisher.request("LOGIN pub open") == b"200"
        burst = b"".join(b"MCAST t %08d" % i + b"x" * 50 + b"\n" for i in range(messages))
        sender = threading.Thread(target=publisher.send, args=(burst,))
        sender.start()
        got = [subscriber.line()[16:24] for _ in range(messages)]
        sender.join()
        for _ in range(messages):
            assert publisher.line() == b"200"
        return got

    try:
        got = yield threads.deferToThread(conversation)
    finally:
        yield service.stopService()
    assert got == [b"%08d" % i for i in range(messages)]
    assert max(reads) <= 65536, f"a read of {max(reads)} bytes"
