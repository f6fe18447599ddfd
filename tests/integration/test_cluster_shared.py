"""MQTT shared subscriptions across a cluster of three ``twistd brokerd`` processes sharing a
real redis-server and PostgreSQL store, driven by paho-mqtt over real sockets.

A group (``$share/{group}/{filter}``) with members on three nodes gets each message once in
the whole cluster, whichever node accepted it, while a plain subscriber gets every one; two
groups with one filter are independent; and a node killed with SIGKILL stops being chosen: the
messages the publishing node had sent it and that it never answered go to the surviving
members once it is declared dead (docs/cluster.md, "Shared subscriptions across nodes")."""
from __future__ import annotations

import queue
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from paho.mqtt.client import MQTTv5, MQTTv311

from tests.integration.test_mqtt_paho import BOUND, MQTTClient
from tests.support.broker import RunningBroker, start_broker
from tests.support.postgres import postgres_server, postgres_url  # noqa: F401 - the fixtures
from tests.support.redis import RedisServer, cluster_secret, redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

NODE_TIMEOUT = 4.0
HEARTBEAT = 1.0
MQTT_LISTENER = {"mqtt": "tcp:{port}:interface=127.0.0.1"}


def start_node(tmp_path: Path, name: str, redis: RedisServer, store: str) -> RunningBroker:
    directory = tmp_path / name
    directory.mkdir()
    return start_broker(directory, "--open-login", "--no-event-log", "--cluster", redis.url, "--store", store,
                        "--cluster-secret-file", str(cluster_secret(tmp_path / f"{name}.secret")),
                        "--node-name", name, "--cluster-heartbeat", str(HEARTBEAT),
                        "--cluster-node-timeout", str(NODE_TIMEOUT), listeners=MQTT_LISTENER)


@pytest.fixture
def three_nodes(tmp_path: Path, redis_server: RedisServer, postgres_url: str) -> Iterator[list[RunningBroker]]:
    nodes: list[RunningBroker] = []
    try:
        for index in (1, 2, 3):
            nodes.append(start_node(tmp_path, f"node{index}", redis_server, postgres_url))
        yield nodes
    finally:
        for node in nodes:
            node.stop(signal.SIGKILL)


class Clients:
    """paho clients, disconnected at the end (one of a killed node is only stopped)."""

    def __init__(self) -> None:
        self.all: list[MQTTClient] = []

    def connect(self, node: RunningBroker, client_id: str, version: int = MQTTv5) -> MQTTClient:
        client = MQTTClient(node.ports["mqtt"], version, client_id)
        self.all.append(client)
        return client

    def close(self) -> None:
        for client in self.all:
            try:
                client.disconnect()
            except (AssertionError, queue.Empty, OSError):
                client.stop()


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    try:
        yield made
    finally:
        made.close()


class Inbox:
    """What a set of members receives, in one queue of (member index, payload): every wait is
    a bounded ``Queue.get``."""

    def __init__(self, members: list[MQTTClient]) -> None:
        self.members = members
        self.queue: queue.Queue[tuple[int, bytes]] = queue.Queue()
        self.others: list[bytes] = []
        """What :meth:`receive` read and was not waiting for."""
        for index, member in enumerate(members):
            member.client.on_message = lambda c, u, message, index=index: self.queue.put((index, message.payload))

    def next(self, deadline: float) -> tuple[int, bytes]:
        """The next (member, payload); queue.Empty once ``deadline`` (monotonic) passed."""
        return self.queue.get(timeout=max(0.0, deadline - time.monotonic()))

    def receive(self, wanted: set[bytes], deadline: float) -> dict[int, list[bytes]]:
        """Wait until the members together received every payload of ``wanted`` (bounded by
        ``deadline``); each member's payloads among ``wanted``, in arrival order (probes are
        left out)."""
        got: dict[int, list[bytes]] = {index: [] for index in range(len(self.members))}
        seen: set[bytes] = set()
        while not wanted <= seen:
            try:
                index, payload = self.next(deadline)
            except queue.Empty:
                raise AssertionError(f"missing after the bound: {sorted(wanted - seen)[:10]} "
                                     f"({len(wanted - seen)} of {len(wanted)})") from None
            if payload in wanted:
                got[index].append(payload)
                seen.add(payload)
            else:
                self.others.append(payload)
        return got

    def rest(self) -> list[tuple[int, bytes]]:
        """What arrived and was not read yet."""
        found = []
        while True:
            try:
                found.append(self.queue.get_nowait())
            except queue.Empty:
                return found

    def settle(self, publishers: list[MQTTClient], topic: str) -> None:
        """Publish probes from each publisher until every member got one from it: then every
        publishing node knows every node's members (their ``share`` announcements arrived).
        Each probe waits at most a moment for its delivery before the next is sent."""
        for number, publisher in enumerate(publishers):
            reached: set[int] = set()
            deadline = time.monotonic() + BOUND
            tag = f"probe-{number}-".encode()
            for probe in range(1000):
                if reached == set(range(len(self.members))):
                    break
                assert time.monotonic() < deadline, f"publisher {number} reached only members {reached}"
                publisher.publish(topic, tag + str(probe).encode(), qos=1)
                try:
                    index, payload = self.next(min(deadline, time.monotonic() + 0.5))
                except queue.Empty:
                    continue
                if payload.startswith(tag):
                    reached.add(index)
        self.rest()


def assert_each_once(got: dict[int, list[bytes]], wanted: set[bytes]) -> None:
    counts = Counter(payload for payloads in got.values() for payload in payloads)
    assert set(counts) == wanted
    assert [payload for payload, count in counts.items() if count > 1] == []


def test_a_group_spanning_three_nodes_gets_each_message_once_and_a_plain_subscriber_all(
        three_nodes: list[RunningBroker], clients: Clients) -> None:
    workers = [clients.connect(node, f"worker{index}", MQTTv5 if index % 2 else MQTTv311)
               for index, node in enumerate(three_nodes)]
    auditors = [clients.connect(node, f"auditor{index}") for index, node in enumerate(three_nodes[::2])]
    for worker in workers:
        assert worker.subscribe("$share/pool/jobs/#", 1) == 1
    for auditor in auditors:  # a second group with the same filter: on nodes 1 and 3 only
        assert auditor.subscribe("$share/audit/jobs/#", 1) == 1
    watcher = clients.connect(three_nodes[1], "watcher")
    assert watcher.subscribe("jobs/#", 1) == 1
    pool, audit, everything = Inbox(workers), Inbox(auditors), Inbox([watcher])
    publishers = [clients.connect(node, f"publisher{index}") for index, node in enumerate(three_nodes)]
    pool.settle(publishers, "jobs/probe")
    audit.settle(publishers, "jobs/probe")

    wanted = set()
    for number in range(60):  # from each node in turn, to five topics the filter matches
        payload = f"job-{number}".encode()
        wanted.add(payload)
        publishers[number % 3].publish(f"jobs/{number % 5}", payload, qos=1)
    deadline = time.monotonic() + BOUND
    by_worker = pool.receive(wanted, deadline)
    by_auditor = audit.receive(wanted, deadline)
    assert sorted(everything.receive(wanted, deadline)[0]) == sorted(wanted)  # the positive control

    assert_each_once(by_worker, wanted)
    assert_each_once(by_auditor, wanted)
    assert all(by_worker.values()), {index: len(got) for index, got in by_worker.items()}  # every node served
    assert all(by_auditor.values())
    # A duplicate would come from another node than the first copy; a last message sent after
    # all of them, once it arrived, shows what was on its way has arrived too.
    publishers[2].publish("jobs/last", b"last", qos=1)
    pool.receive({b"last"}, time.monotonic() + BOUND)
    assert [payload for _index, payload in pool.rest() if payload in wanted] == []


def test_a_killed_node_s_members_stop_being_chosen_and_what_it_never_answered_goes_to_the_others(
        three_nodes: list[RunningBroker], clients: Clients) -> None:
    workers = [clients.connect(node, f"worker{index}") for index, node in enumerate(three_nodes)]
    for worker in workers:
        assert worker.subscribe("$share/pool/tasks/+", 1) == 1
    watcher = clients.connect(three_nodes[1], "watcher")
    assert watcher.subscribe("tasks/+", 1) == 1
    pool, everything = Inbox(workers), Inbox([watcher])
    publisher = clients.connect(three_nodes[0], "publisher")
    pool.settle([publisher], "tasks/probe")

    before = {f"before-{number}".encode() for number in range(30)}
    for payload in sorted(before):
        publisher.publish("tasks/a", payload, qos=1)
    got = pool.receive(before, time.monotonic() + BOUND)
    assert_each_once(got, before)
    assert got[2], "the third node's member got its share before the kill"

    three_nodes[2].process.send_signal(signal.SIGKILL)
    three_nodes[2].process.wait(timeout=BOUND)
    workers[2].stop()
    # Published while node1 still takes node3 for alive: a third of these are sent to node3,
    # which never answers; once node3 is declared dead they go to the surviving members.
    after = {f"after-{number}".encode() for number in range(30)}
    for payload in sorted(after):
        publisher.publish("tasks/b", payload, qos=1)
    got = pool.receive(after, time.monotonic() + NODE_TIMEOUT + BOUND)
    assert_each_once(got, after)
    assert not got[2]
    assert sorted(everything.receive(before | after, time.monotonic() + BOUND)[0]) == sorted(before | after)
    # Declared dead: new messages go to the survivors only, both of them.
    last = {f"last-{number}".encode() for number in range(6)}
    for payload in sorted(last):
        publisher.publish("tasks/c", payload, qos=1)
    got = pool.receive(last, time.monotonic() + BOUND)
    assert_each_once(got, last)
    assert got[0] and got[1] and not got[2]
    # What node3 had answered for before the kill was not placed again, nor anything twice.
    again = [payload for payload in pool.others + [p for _index, p in pool.rest()] if payload in before | after]
    assert again == []
