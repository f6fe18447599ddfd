"""The event log's latency and gauge records, end to end (makeService, real sockets): an SSMP
publish to subscribers in SSMP, MCCHAT and socket.mq gives one sampled ``latency`` record per
receiving protocol; an SMQP subscriber that was away when the message came gets ``delivered``
and ``acked`` records whose ``queued_us`` is the time it was away; the SMQP store's queue depth
goes to ``gauge`` records as it changes."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint

from brokerd.events import schema
from brokerd.protocols.smqp.client import connect
from brokerd.protocols.socketmq.api import Client
from tests.integration.smqp_fixtures import ACCOUNTS, write_test_accounts
from tests.support.collect import called
from tests.support.live import LOOPBACK, TIMEOUT, Inbox, LiveBroker, SMQPInbox, reactor, synced


def _records(data_dir: Path) -> list[dict[str, Any]]:
    """Every complete record written so far (a line being written may be cut short)."""
    records = []
    for path in sorted((data_dir / schema.EVENTS_DIR).rglob("*" + schema.FILE_SUFFIX)):
        for line in path.read_text("utf-8", errors="replace").splitlines():
            try:
                records.append(schema.decode(line))
            except schema.SchemaError:
                pass
    return sorted(records, key=lambda record: record["ts"])


def logged(live: LiveBroker, data_dir: Path, condition: Callable[[list[dict[str, Any]]], bool]) -> Deferred:
    """Fires once the event log took a record (bounded) after which ``condition`` holds of
    what is written: the log's buffer is handed to its writer thread and written first."""
    log = live.runtime.event_log_service

    def written() -> bool:
        log.flush()
        log.writer.drain()
        return condition(_records(data_dir))

    return called(log, "_append", written)


@pytest_twisted.ensureDeferred
async def test_latency_samples_queued_time_and_queue_gauges(tmp_path: Path) -> None:
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    data = tmp_path / "data"
    live = LiveBroker.start(data, accounts_file=accounts, event_log_flush=0.1, event_log_sample=0.05,
                            event_log_gauge=0.05,
                            listeners={"ssmp": [LOOPBACK], "mcchat": [LOOPBACK], "smqp": [LOOPBACK],
                                       "socketmq": [LOOPBACK]})
    web = Client(f"http://127.0.0.1:{live.port('socketmq')}")
    try:
        # an SMQP durable subscriber of /room, away while the message comes
        smqp = await connect(TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("smqp")))
        await smqp.login("alice", "c1", ACCOUNTS["alice"])
        await smqp.create_topic("/room")
        await smqp.subscribe("/room")
        await smqp.quit()

        # live subscribers in SSMP, MCCHAT and socket.mq
        ssmp_inbox, mc_inbox = Inbox(), Inbox()
        sub = await live.ssmp(b"s1", ssmp_inbox)
        await sub.subscribe(b"room")
        mc = await live.mcchat(mc_inbox)
        mc.subscribe("room")
        await synced(mc)
        await web.connect()
        got: Deferred = Deferred()
        await web.subscribe("room", lambda event: got.called or got.callback(event))

        publisher = await live.ssmp(b"s0")
        await publisher.mcast(b"room", b"hello")
        await ssmp_inbox.count(1)
        await mc_inbox.count(1)
        event = await got.addTimeout(TIMEOUT, reactor())
        assert event.data in (b"hello", "hello")

        # the message waits in the store: the gauge says so
        await logged(live, data, lambda records: any(r["kind"] == schema.GAUGE and r.get("pending", 0) >= 1
                                                      for r in records))

        back = await connect(TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("smqp")))
        inbox = SMQPInbox(back)
        await back.login("alice", "c1", ACCOUNTS["alice"])
        notify = await inbox.next()
        assert notify.body.sections[0].data == b"hello"
        await back.acknowledge()
        await logged(live, data, lambda records: any(r["kind"] == schema.ACKED for r in records))
        await logged(live, data, lambda records: [(r.get("pending"), r.get("unacknowledged"))
                                                  for r in records if r["kind"] == schema.GAUGE][-1] == (0, 0))
        await back.quit()
    finally:
        await web.close()
        await live.stop()
        await live.runtime.store.close()

    records = _records(data)
    samples = [r for r in records if r["kind"] == schema.LATENCY]
    by_protocol = {r["protocol"]: r for r in samples if r.get("topic") == "room"}
    # one sampled publish, timed at each receiving protocol's write; SMQP's is its own record
    assert set(by_protocol) == {"ssmp", "mcchat", "socketmq"}, samples
    for record in by_protocol.values():
        assert record["sender"] == "ssmp:s0" and record["fanout"] == 1 and record["message"] == "multicast"
        assert record["latency_us"] >= 0
    [accepted] = [r for r in records if r["kind"] == schema.ACCEPTED and r.get("topic") == "room"]
    assert accepted["fanout"] == 3  # the samples are not deliveries: the fan-out still counts them

    logins = [r for r in records if r["kind"] == schema.LOGIN and r.get("session") == "alice:c1"]
    [delivered] = [r for r in records if r["kind"] == schema.DELIVERED and r.get("session") == "alice:c1"]
    [acked] = [r for r in records if r["kind"] == schema.ACKED and r.get("session") == "alice:c1"]
    away_us = logins[-1]["ts"] - accepted["ts"]  # from the publish to the subscriber's return
    for outcome in (delivered, acked):
        assert outcome["sender"] == "ssmp:s0"
        # queued: about the time it was away (the login record is stamped a moment after
        # the session attached); the rest is the time to deliver once it was back
        assert 0 < outcome["queued_us"] <= outcome["latency_us"]
        assert abs(outcome["queued_us"] - away_us) < 1_000_000, (outcome, away_us)
    assert acked["latency_us"] - acked["queued_us"] >= delivered["latency_us"] - delivered["queued_us"]

    gauges = [r for r in records if r["kind"] == schema.GAUGE]
    assert all(r["protocol"] == "smqp" and r["trash"] == 0 for r in gauges)
    readings = [(r["pending"], r["unacknowledged"]) for r in gauges]
    assert any(p >= 1 for p, _u in readings) and readings[-1] == (0, 0)
    assert all(a != b for a, b in zip(readings, readings[1:])), "only changes are logged"
