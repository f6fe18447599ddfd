"""Flow control on real TCP sockets: reads stay at Twisted's 64 KiB whatever the output limit,
direct writes keep every byte in order, and so do pipelined UCAST runs."""
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


@pytest_twisted.inlineCallbacks
def test_pipelined_ucast_runs_to_several_peers_arrive_in_order_with_every_reply(tmp_path):
    """UCASTs pipelined to one peer go through the core as runs (a Unicast run, Router.route); mixed
    with UCASTs to another peer and to nobody, on real sockets and with the event log on,
    every event arrives in order and every UCAST is answered in order."""
    port = free_port()
    settings = Settings(
        listeners={"ssmp": [f"tcp:{port}:interface=127.0.0.1"]}, open_login=True, data_dir=tmp_path,
    )
    service = makeService(settings, reactor)
    service.startService()
    rounds = 5_000

    def conversation() -> tuple[list[bytes], list[bytes], list[bytes]]:
        peers = {}
        for name in ("bob", "carol"):
            peers[name] = LineClient.connect(port, timeout=20)
            assert peers[name].request(f"LOGIN {name} open") == b"200"
        alice = LineClient.connect(port, timeout=20)
        assert alice.request("LOGIN alice open") == b"200"
        burst = b"".join(b"UCAST bob %06da\nUCAST bob %06db\nUCAST carol %06d\nUCAST nobody %06d\n" % (i, i, i, i)
                         for i in range(rounds))
        sender = threading.Thread(target=alice.send, args=(burst,))
        sender.start()
        to_bob = [peers["bob"].line() for _ in range(2 * rounds)]
        to_carol = [peers["carol"].line() for _ in range(rounds)]
        sender.join()
        replies = [alice.line() for _ in range(4 * rounds)]
        return to_bob, to_carol, replies

    try:
        to_bob, to_carol, replies = yield threads.deferToThread(conversation)
    finally:
        yield service.stopService()
    assert to_bob == [b"000 alice UCAST bob %06d%s" % (i, x) for i in range(rounds) for x in (b"a", b"b")]
    assert to_carol == [b"000 alice UCAST carol %06d" % i for i in range(rounds)]
    assert replies == [b"200", b"200", b"200", b"404"] * rounds
