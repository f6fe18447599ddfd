"""The ~sys/brokerd/ statistics topics, received by a plain SSMP client."""
from __future__ import annotations

from pathlib import Path

import pytest_twisted
from twisted.internet import reactor, threads

from brokerd.admin.systopics import leaves
from brokerd.config import Settings
from brokerd.tap import makeService
from tests.support.broker import LineClient, free_port


def _watch(port: int) -> dict[str, bytes]:
    watcher = LineClient.connect(port)
    assert watcher.request("LOGIN watcher open") == b"200"
    assert watcher.request("SUBSCRIBE ~sys/brokerd/sessions/ssmp") == b"200"
    assert watcher.request("SUBSCRIBE ~sys/brokerd/messages/accepted_by_protocol/ssmp") == b"200"
    publisher = LineClient.connect(port)
    assert publisher.request("LOGIN pub open") == b"200"
    assert publisher.request("MCAST news one") == b"200"
    assert publisher.request("MCAST news two") == b"200"
    seen: dict[str, bytes] = {}
    while len(seen) < 2:  # each interval publishes both; the first may predate the MCASTs
        code, sender, verb, topic, value = watcher.line().split(b" ", 4)
        assert (code, sender, verb) == (b"000", b"sys:brokerd", b"MCAST")
        if topic.endswith(b"accepted_by_protocol/ssmp") and value != b"2":
            continue
        seen[topic.decode()] = value
    publisher.close()
    watcher.close()
    return seen


@pytest_twisted.inlineCallbacks
def test_statistics_arrive_over_ssmp(tmp_path: Path) -> None:
    port = free_port()
    settings = Settings(listeners={"ssmp": [f"tcp:{port}:interface=127.0.0.1"]}, open_login=True,
                        data_dir=tmp_path, event_log=False, sys_interval=0.1)
    service = makeService(settings, reactor)
    service.startService()
    try:
        seen = yield threads.deferToThread(_watch, port)
    finally:
        yield service.stopService()
    assert seen == {"~sys/brokerd/sessions/ssmp": b"2", "~sys/brokerd/messages/accepted_by_protocol/ssmp": b"2"}


def test_leaves_name_every_figure() -> None:
    figures = {"uptime_seconds": 1.5, "failing": True, "sessions": {"ssmp": 2}, "buckets": [[1, 2]], "none": None}
    assert list(leaves(figures)) == [
        ("~sys/brokerd/uptime_seconds", 1.5), ("~sys/brokerd/failing", 1), ("~sys/brokerd/sessions/ssmp", 2)]
