"""--cluster on the command line: URLs, the password file, the node name, and the SMQP rule
(a cluster with an SMQP listener needs a PostgreSQL store), each a one-line refusal."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from brokerd.cluster.address import RedisAddress, parse
from brokerd.cluster.seal import Sealer, read_secret_file
from brokerd.errors import ConfigurationError
from brokerd.compose import node_name
from brokerd.tap import Options, StartupError
from tests.support.redis import cluster_secret


@pytest.mark.parametrize("url, expected", [
    ("redis://127.0.0.1:7000", RedisAddress("redis", host="127.0.0.1", port=7000)),
    ("redis://h/3", RedisAddress("redis", host="h", port=6379, db=3)),
    ("rediss://user:p%40ss@h:6380/1", RedisAddress("rediss", host="h", port=6380, db=1, username="user",
                                                   password="p@ss")),
    ("unix:///run/redis.sock?db=2", RedisAddress("unix", path="/run/redis.sock", db=2)),
])
def test_urls(url: str, expected: RedisAddress) -> None:
    assert parse(url) == expected


@pytest.mark.parametrize("url", ["http://h:1", "redis://", "redis://h/x", "unix://"])
def test_bad_urls_are_one_line_errors(url: str) -> None:
    with pytest.raises(ConfigurationError, match="^--cluster "):
        parse(url)


def test_the_password_is_not_logged() -> None:
    assert str(parse("redis://:secret@h:1/2")) == "redis://h:1/2"
    with pytest.raises(ConfigurationError) as caught:
        parse("redis://:secret@h:1/x")
    assert "secret" not in str(caught.value)


def options(tmp_path: Path, *args: str) -> Options:
    """Options parsed from ``args``; with --cluster and no --cluster-secret-file, the test secret's."""
    if "--cluster" in args and "--cluster-secret-file" not in args:
        args = (*args, "--cluster-secret-file", str(cluster_secret(tmp_path / "cluster.secret")))
    opts = Options()
    opts.parseOptions(["--data-dir", str(tmp_path), *args])
    return opts


def test_cluster_with_smqp_and_no_postgresql_store_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(StartupError) as caught:
        options(tmp_path, "--cluster", "redis://127.0.0.1:1", "--smqp", "tcp:0")
    assert str(caught.value) == (
        "brokerd: --cluster with an SMQP listener needs --store postgresql://... (durable state shared by every node)")
    with pytest.raises(StartupError, match="needs --store postgresql"):
        options(tmp_path, "--cluster", "redis://127.0.0.1:1")  # no listener option: SMQP listens too


def test_cluster_without_smqp_is_accepted_and_names_the_node(tmp_path: Path) -> None:
    opts = options(tmp_path, "--cluster", "redis://127.0.0.1:1", "--ssmp", "tcp:8788:interface=127.0.0.1")
    assert opts.settings.cluster == "redis://127.0.0.1:1"
    assert node_name(opts.settings).endswith(":8788")
    named = options(tmp_path, "--cluster", "redis://127.0.0.1:1", "--ssmp", "tcp:0", "--node-name", "east-1")
    assert node_name(named.settings) == "east-1"


def test_an_unreadable_password_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="--cluster-password-file"):
        options(tmp_path, "--cluster", "redis://127.0.0.1:1", "--ssmp", "tcp:0",
                "--cluster-password-file", str(tmp_path / "missing"))


def test_makeservice_with_settings_also_refuses_smqp_without_postgresql(tmp_path: Path) -> None:
    from brokerd.config import Settings
    from brokerd.tap import makeService

    settings = Settings(listeners={"smqp": ["tcp:0:interface=127.0.0.1"]}, data_dir=tmp_path,
                        cluster="redis://127.0.0.1:1", event_log=False,
                        cluster_secret_file=cluster_secret(tmp_path / "cluster.secret"))
    with pytest.raises(StartupError, match="needs --store postgresql"):
        makeService(settings)
    settings.listeners = {"ssmp": ["tcp:0:interface=127.0.0.1"]}
    service = makeService(settings)  # accepted without SMQP (not started: nothing connects)
    assert service.runtime.broker.engine.shared


@pytest.mark.parametrize("url, warned", [
    ("redis://192.0.2.7:6379", True),
    ("redis://redis.example.net:6379/2", True),
    ("redis://127.0.0.1:6379", False),
    ("redis://localhost:6379", False),
    ("redis://[::1]:6379", False),
    ("unix:///run/redis.sock", False),
    ("redis://:a-password@192.0.2.7:6379", False),
    ("rediss://192.0.2.7:6380", False),
])
def test_a_redis_others_can_reach_without_password_or_tls_is_warned_about_at_start(
        tmp_path: Path, url: str, warned: bool) -> None:
    from twisted.logger import formatEvent, globalLogPublisher

    from brokerd.config import Settings
    from brokerd.tap import makeService

    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        makeService(Settings(listeners={"ssmp": ["tcp:0:interface=127.0.0.1"]}, data_dir=tmp_path, cluster=url,
                             event_log=False, cluster_secret_file=cluster_secret(tmp_path / "cluster.secret")))
    finally:
        globalLogPublisher.removeObserver(events.append)
    lines = [formatEvent(event) for event in events]
    assert any(line.startswith("Cluster: node ") for line in lines)  # the start was logged either way
    warnings = [line for line in lines if "without a password or TLS" in line]
    if warned:
        assert warnings == [f"Cluster: Redis at {parse(url)} is not on this machine and is used without a password "
                            "or TLS: anyone who reaches it can deny service to the cluster (docs/cluster.md, threat "
                            "model)"]
    else:
        assert warnings == []


def test_the_control_message_limit_reaches_the_engine_and_bounds_both_ways(tmp_path: Path) -> None:
    from twisted.logger import capturedLogs

    from brokerd.cluster import directory as control
    from brokerd.cluster.redis_engine import CONTROL_CHANNEL
    from brokerd.tap import makeService

    opts = options(tmp_path, "--cluster", "redis://127.0.0.1:1", "--ssmp", "tcp:0:interface=127.0.0.1",
                   "--cluster-max-control", "300", "--no-event-log")
    assert opts.settings.cluster_max_control == 300
    broker = makeService(opts.settings).runtime.broker
    engine = broker.engine
    assert engine.max_control == 300
    engine.broker = broker  # what starting the engine does (not started: nothing connects)
    origin = "0707070707070707"
    small = control.encode(origin, "n2", control.JOIN, **control.member_fields(b"t", "ssmp", b"m", False))
    large = control.encode(origin, "n2", control.STATE, members=[["t", "ssmp", "m%d" % i, False] for i in range(20)])
    assert len(small) <= 300 < len(large)
    peer = Sealer(read_secret_file(opts.settings.cluster_secret_file), os.urandom(8), 15.0)  # another node
    engine.received(CONTROL_CHANNEL, peer.seal(CONTROL_CHANNEL, large))
    assert engine.stats.bad_envelopes == 1 and engine.members(b"t") == []
    engine.received(CONTROL_CHANNEL, peer.seal(CONTROL_CHANNEL, small))
    assert engine.stats.bad_envelopes == 1 and [m.name for m, _ in engine.members(b"t")] == [b"m"]

    engine.shards = type("Up", (), {"up": True})()  # as if connected: announcements are queued
    with capturedLogs() as events:
        engine._announce(control.STATE, members=[["t", "ssmp", "m%d" % i, False] for i in range(20)])
        engine._announce(control.BEAT)
    assert [data for _, data in engine._raw] == [control.encode(engine.origin, engine.node_name, control.BEAT)]
    assert [event["log_format"].split(":")[0] for event in events] == ["Cluster"]
    assert "over --cluster-max-control" in events[0]["log_format"]
    engine._raw.clear()
    if engine._flush_call is not None:
        engine._flush_call.cancel()


def test_a_cluster_node_without_a_store_says_it_keeps_nothing_for_durable_subscribers(tmp_path: Path) -> None:
    """One line at start: the other nodes' SMQP subscribers get nothing stored from a node
    without --store.  One node on its own has nobody to warn about."""
    from twisted.logger import formatEvent, globalLogPublisher

    from brokerd.config import Settings
    from brokerd.tap import makeService

    def lines_of(**fields: object) -> list[str]:
        events: list[dict] = []
        globalLogPublisher.addObserver(events.append)
        try:
            makeService(Settings(listeners={"ssmp": ["tcp:0:interface=127.0.0.1"]}, event_log=False,
                                 **fields))  # type: ignore[arg-type]
        finally:
            globalLogPublisher.removeObserver(events.append)
        return [formatEvent(event) for event in events if "keeps nothing for durable" in formatEvent(event)]

    clustered = lines_of(data_dir=tmp_path / "a", cluster="redis://127.0.0.1:6379",
                         cluster_secret_file=cluster_secret(tmp_path / "cluster.secret"))
    assert clustered == ["Cluster: this node has no --store, so it keeps nothing for durable subscribers; give "
                         "every node the cluster's --store postgresql://... (docs/cluster.md)"]
    assert lines_of(data_dir=tmp_path / "b") == []
