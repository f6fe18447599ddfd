"""A fault-injection run of a brokerd cluster (docs/cluster.md, "Fault-injection run").

    python -m tests.faults [--minutes 3] [--redis-cluster] [--node-timeout 6] [--directory DIR] [--keep]

Starts, in a temp dir on loopback ports, a redis-server (or a 3-master Redis Cluster), a
PostgreSQL server and three ``twistd -n brokerd`` nodes sharing them (``--cluster``,
``--store``, ``--cluster-secret-file``); runs traffic in all four protocols through them
(tests/faults/clients.py) while a schedule of faults repeats: a forger on Redis
(tests/faults/forger.py), a PostgreSQL restart, a Redis restart, a node frozen (SIGSTOP) for
longer than ``--cluster-node-timeout`` then thawed, a node killed (SIGKILL) and restarted.
Then it checks, prints, and exits 1 if any check failed (0 otherwise):

* acknowledged SMQP messages lost: 0;
* SMQP duplicates after a completed 310 exchange: 0;
* per-publisher order violations seen by any subscriber connection: 0;
* messages no publisher sent, delivered to a subscriber (forgeries): 0;
* presence the same on every node, and naming exactly the subscribers connected, within the
  node timeout (plus PRESENCE_TOLERANCE) of the last fault's end (the killed node listening
  again);
* each killed node's sessions gone from the others' presence within the node timeout (plus
  PRESENCE_TOLERANCE) of the kill;
* traffic after the last fault reaches every subscriber;
* the forger captured, replayed and damaged the nodes' messages in every round (its
  positive control: a forger that saw nothing proves nothing);
* no node died (other than those the run killed), every node alive at the end;
* no unhandled error, traceback or critical line in any node's log.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet import task, threads
from twisted.internet.defer import Deferred, ensureDeferred

from tests.faults import clients
from tests.faults.forger import Forgery, forge
from tests.faults.processes import NodeProcess, write_accounts_file, write_secret_file
from tests.faults.tally import Signal, Tally

PRESENCE_TOLERANCE = 2.0
"""Seconds allowed past the node timeout for presence checks.  The documented bound is the
timeout counted from the last message heard of the dead node; observed from outside, add 0.5 s
between two observations of presence (a fresh ``SUBSCRIBE faults PRESENCE`` on each node),
the observation's own round trips, and the lateness of that last message's transit and of
the nodes' reactors on a loaded 2-core machine running 3 nodes, Redis, PostgreSQL and this
run's 14 clients (1.5 s: the run's own load, not the broker's bound)."""
HEARTBEAT_FRACTION = 3
"""``--cluster-heartbeat`` is the node timeout over this (the documented advice)."""
WARM_UP = 10.0
CYCLE = 75.0
"""Seconds of one round of the five faults (see :meth:`Run.cycle`)."""
DRAIN_TIMEOUT = 120.0
STARTUP_TIMEOUT = 60.0
ERROR_MARKERS = ("Traceback (most recent call last)", "Unhandled Error", "#critical]", "Unable to format event",
                 "Unhandled error")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


class Run:
    def __init__(self, reactor: Any, options: argparse.Namespace, directory: Path) -> None:
        self.reactor = reactor
        self.options = options
        self.directory = directory
        self.signal = Signal(reactor)
        self.tally = Tally(self.signal)
        self.node_timeout: float = options.node_timeout
        self.stall = 3.0
        """Seconds a client waits for an answer before it takes its node for dead."""
        self.smqp_stall = max(20.0, self.node_timeout * 2)
        """The same for SMQP, whose answers wait for the store (a PostgreSQL restart)."""
        self.interval = 0.05
        self.smqp_interval = 0.1
        self.notes: deque[str] = deque(maxlen=40)
        self.deaths: list[str] = []
        self.faults: list[str] = []
        self.nodes: list[NodeProcess] = []
        self.redis: Any = None
        self.postgres: Any = None
        self.forgeries: list[Forgery] = []
        self.started = time.monotonic()
        self.last_fault_at = 0.0
        self.presence_seconds: float | None = None
        self.presence_detail = ""
        self.expiries: list[tuple[str, float | None, str]] = []
        """Per kill: the node, seconds from the kill until its sessions left presence on the
        others (None: it had none), what was seen."""
        self.watchers = 0

    # ------------------------------------------------------------------ servers

    def start_servers(self) -> None:
        from tests.support.postgres import PostgresServer, require_binaries
        from tests.support.redis import RedisCluster, RedisServer

        if self.options.redis_cluster:
            self.redis = RedisCluster(self.directory / "redis").start()
            url = self.redis.url
        else:
            self.redis = RedisServer(self.directory / "redis").start()
            url = self.redis.url
        self.postgres = PostgresServer(require_binaries())
        self.postgres.start()
        store = self.postgres.create_database()
        secret = write_secret_file(self.directory / "cluster.secret")
        accounts = write_accounts_file(self.directory / "accounts")
        heartbeat = self.node_timeout / HEARTBEAT_FRACTION
        options = ["--cluster", url, "--store", store, "--accounts", str(accounts), "--open-login", "--no-event-log",
                   "--cluster-heartbeat", f"{heartbeat:g}", "--cluster-node-timeout", f"{self.node_timeout:g}",
                   "--cluster-secret-file", str(secret)]
        for index in range(3):
            node = NodeProcess(self.directory / f"node{index + 1}", f"node{index + 1}", options)
            self.nodes.append(node)
            node.start()

    def stop_servers(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.destroy()

    def redis_servers(self) -> list[Any]:
        return list(self.redis.servers) if self.options.redis_cluster else [self.redis]

    # ------------------------------------------------------------------ what clients ask

    def node_order(self, home: int) -> list[int]:
        return [home, *[(home + step) % len(self.nodes) for step in range(1, len(self.nodes))]]

    def note(self, text: str) -> None:
        self.notes.append(f"{time.monotonic() - self.started:7.1f}s {text}")

    def log(self, text: str) -> None:
        print(f"{time.monotonic() - self.started:7.1f}s {text}", flush=True)

    def watch_nodes(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is not None and not node.expected_exit:
                node.expected_exit = True  # reported once
                self.deaths.append(f"{node.name} exited with {node.process.returncode}:\n{node.tail(15)}")
                self.log(f"{node.name} DIED with {node.process.returncode}")

    # ------------------------------------------------------------------ the schedule

    async def at(self, start: float, offset: float) -> None:
        delay = start + offset - time.monotonic()
        if delay > 0:
            await clients.pause(self.reactor, delay)

    def fault(self, text: str) -> None:
        self.faults.append(text)
        self.log(text)

    async def cycle(self, number: int) -> None:
        """The five faults, 15 s apart (with the default node timeout)."""
        start = time.monotonic()
        servers = self.redis_servers()
        self.fault(f"forger writes garbage and replays on Redis for 12 s (round {number + 1})")
        ports = [server.port for server in servers]
        self.forgeries.append(await threads.deferToThread(forge, ports, 12.0, number))
        await self.at(start, 15)
        self.fault("PostgreSQL restart (immediate stop, 3 s down)")
        await threads.deferToThread(self.postgres.stop)
        await clients.pause(self.reactor, 3.0)
        await threads.deferToThread(self.postgres.start)
        await self.at(start, 30)
        victim = servers[number % len(servers)]
        self.fault(f"Redis restart (kill -9 of redis on {victim.port}, 2 s down)")
        victim.kill()
        await clients.pause(self.reactor, 2.0)
        await threads.deferToThread(victim.start)
        await self.at(start, 45)
        frozen = self.nodes[(number + 1) % 3]
        seconds = self.node_timeout + 4
        self.fault(f"SIGSTOP {frozen.name} for {seconds:g} s")
        frozen.freeze()
        await clients.pause(self.reactor, seconds)
        frozen.thaw()
        self.fault(f"SIGCONT {frozen.name}")
        await self.at(start, 45 + seconds + 5)
        index = number % 3
        killed = self.nodes[index]
        ghosts = {c.presence_name for c in self.subscribers
                  if c.node == index and c.kind in ("ssmp", "mcchat") and c.presence_name}
        self.fault(f"kill -9 {killed.name}, restarted 3 s later")
        killed.kill()
        killed_at = time.monotonic()
        watching = ensureDeferred(self.ghosts_leave(index, ghosts, killed_at))
        await clients.pause(self.reactor, 3.0)
        await threads.deferToThread(killed.start)
        self.last_fault_at = time.monotonic()
        self.log(f"{killed.name} restarted, {self.last_fault_at - killed_at:.1f} s after the kill")
        await watching

    # ------------------------------------------------------------------ presence

    async def ghosts_leave(self, index: int, ghosts: set[str], killed_at: float) -> None:
        """Observe presence on the surviving nodes every 0.5 s until none names a session of
        the killed node (``ghosts``); note how long after the kill that was."""
        survivors = [other for other in range(3) if other != index]
        if not ghosts:
            self.expiries.append((self.nodes[index].name, None, "no subscriber was on it"))
            return
        while True:
            seen = []
            for other in survivors:
                try:
                    seen.append(await self.presence_on(other))
                except Exception as exc:  # noqa: BLE001 - observed again next round
                    seen.append({f"unreachable ({type(exc).__name__})"} | ghosts)
            elapsed = time.monotonic() - killed_at
            if not any(ghosts & members for members in seen):
                self.expiries.append((self.nodes[index].name, elapsed, f"{len(ghosts)} sessions"))
                self.log(f"{self.nodes[index].name}'s sessions left presence {elapsed:.1f} s after the kill")
                return
            if elapsed > self.node_timeout + PRESENCE_TOLERANCE + 30:
                self.expiries.append((self.nodes[index].name, elapsed,
                                      f"still present: {sorted(ghosts & set().union(*seen))}"))
                return
            await clients.pause(self.reactor, 0.5)

    async def presence_on(self, index: int) -> set[str]:
        line = await clients.ssmp_connect(self.reactor, self.nodes[index].ports["ssmp"])
        members: set[str] = set()
        prefix, suffix = b"000 ", b" SUBSCRIBE " + clients.TOPIC.encode()

        def event(data: bytes) -> None:
            if data.startswith(prefix) and data.endswith(suffix):
                members.add(data[len(prefix):-len(suffix)].decode("utf-8", "replace"))

        line.on_event = event
        self.watchers += 1
        try:
            name = b"watch-%d-%d" % (index, self.watchers)
            for request in (b"LOGIN " + name + b" open", b"SUBSCRIBE " + clients.TOPIC.encode() + b" PRESENCE"):
                answer = await line.request(request).addTimeout(self.stall, self.reactor)
                if answer != b"200":
                    raise RuntimeError(f"{request!r} answered {answer!r}")
            await line.ping().addTimeout(self.stall, self.reactor)  # the current members came before
        finally:
            line.transport.abortConnection()
        return {member for member in members if not member.startswith("watch-")}

    def expected_presence(self) -> set[str]:
        return {c.presence_name for c in self.subscribers if c.kind in ("ssmp", "mcchat") and c.presence_name}

    async def presence_agrees(self) -> None:
        """Observe presence on every node every 0.5 s until every node names the same members
        and the SSMP and MCCHAT ones are exactly the subscribers connected, or the bound passes."""
        bound = self.node_timeout + PRESENCE_TOLERANCE
        while True:
            seen: list[Any] = []
            for index in range(3):
                try:
                    seen.append(await self.presence_on(index))
                except Exception as exc:  # noqa: BLE001 - a node not back yet
                    seen.append(f"unreachable ({type(exc).__name__})")
            elapsed = time.monotonic() - self.last_fault_at
            expected = self.expected_presence()
            sets = [s for s in seen if isinstance(s, set)]
            if len(sets) == 3 and sets[0] == sets[1] == sets[2] and \
                    {m for m in sets[0] if not m.startswith("socketmq")} == expected:
                self.presence_seconds = elapsed
                self.presence_detail = f"{len(sets[0])} members on every node"
                return
            if elapsed > bound:
                self.presence_detail = "\n".join(
                    [f"expected (ssmp + mcchat subscribers): {sorted(expected)}"]
                    + [f"node{i + 1}: {sorted(s) if isinstance(s, set) else s}" for i, s in enumerate(seen)])
                return
            await clients.pause(self.reactor, 0.5)

    # ------------------------------------------------------------------ the run

    async def setup_durable_subscription(self) -> None:
        from twisted.internet import endpoints

        endpoint = endpoints.TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.nodes[0].ports["smqp"])
        client = await clients.smqp_connect(endpoint).addTimeout(STARTUP_TIMEOUT, self.reactor)
        await client.login("bob", "durable", "bobpw").addTimeout(STARTUP_TIMEOUT, self.reactor)
        await client.create_topic(clients.SMQP_TOPIC).addTimeout(STARTUP_TIMEOUT, self.reactor)
        await client.subscribe(clients.SMQP_TOPIC).addTimeout(STARTUP_TIMEOUT, self.reactor)
        await client.quit().addTimeout(STARTUP_TIMEOUT, self.reactor)

    async def main(self) -> list[Check]:
        total = self.options.minutes * 60
        self.log(f"starting servers in {self.directory}")
        await threads.deferToThread(self.start_servers)
        monitor = task.LoopingCall(self.watch_nodes)
        monitor.start(1.0)
        await self.setup_durable_subscription()
        self.subscribers: list[clients.Client] = []
        for index in range(3):
            self.subscribers += [clients.SSMPSubscriber(self, f"ssmp-sub-{index + 1}", index),
                                 clients.MCChatSubscriber(self, f"mcchat-sub-{index + 1}", index),
                                 clients.SocketMQSubscriber(self, f"socketmq-sub-{index + 1}", index)]
        self.durable = clients.SMQPDurableSubscriber(self, "smqp-durable", 2)
        self.publishers: list[clients.Client] = [
            clients.SSMPPublisher(self, "ssmp-pub", 0), clients.MCChatPublisher(self, "mcchat-pub", 1),
            clients.SocketMQPublisher(self, "socketmq-pub", 2), clients.SMQPPublisher(self, "smqp-pub", 0)]
        for client in [*self.subscribers, self.durable]:
            client.start()
        await self.signal.until(lambda: all(c.presence_name for c in self.subscribers), STARTUP_TIMEOUT)
        for client in self.publishers:
            client.start()
        self.log("traffic started")
        start = time.monotonic()
        await self.at(start, WARM_UP)
        settle = self.node_timeout + PRESENCE_TOLERANCE + 15
        cycles = max(1, int((total - WARM_UP - settle) // self.cycle_length()))
        for number in range(cycles):
            await self.cycle(number)
        await self.presence_agrees()
        self.log(f"presence agreed after {self.presence_seconds} s" if self.presence_seconds is not None
                 else "presence did NOT agree")

        # Positive control: messages published from now on reach every subscriber.
        before = dict(self.tally.delivered)
        names = [c.name for c in self.subscribers]
        try:
            await self.signal.until(lambda: all(self.tally.delivered.get(n, 0) > before.get(n, 0) for n in names),
                                    STARTUP_TIMEOUT)
            flowing = Check("traffic after the last fault reaches every subscriber", True, f"{len(names)} subscribers")
        except Exception:  # noqa: BLE001 - the wait's bound
            flowing = Check("traffic after the last fault reaches every subscriber", False, "silent: " + ", ".join(
                n for n in names if self.tally.delivered.get(n, 0) <= before.get(n, 0)))
        for client in self.publishers:
            await client.stop().addTimeout(self.smqp_stall + 5, self.reactor)
        self.log("publishers stopped; draining the durable subscriber")
        lost_wait = time.monotonic()
        try:
            await self.signal.until(lambda: not self.tally.smqp_lost(), DRAIN_TIMEOUT)
        except Exception:  # noqa: BLE001 - the wait's bound: what is missing is lost
            pass
        self.log(f"drained in {time.monotonic() - lost_wait:.1f} s")
        for client in [*self.subscribers, self.durable]:
            await client.stop().addTimeout(self.smqp_stall + 5, self.reactor)
        monitor.stop()
        self.watch_nodes()
        return self.checks(flowing)

    def cycle_length(self) -> float:
        return 45 + (self.node_timeout + 4) + 5 + 3 + 7

    def checks(self, flowing: Check) -> list[Check]:
        tally = self.tally
        lost = tally.smqp_lost()
        checks = [
            Check("acknowledged SMQP messages lost", not lost,
                  f"{len(lost)} of {len(tally.smqp_acknowledged)}" + (f": {lost[:10]}" if lost else "")),
            Check("SMQP duplicates after a completed 310 exchange", not tally.smqp_duplicates,
                  f"{len(tally.smqp_duplicates)} in {tally.smqp_notifications} notifications"
                  + (f": {tally.smqp_duplicates[:10]}" if tally.smqp_duplicates else "")),
            Check("per-publisher order violations seen by a subscriber", not tally.order_violations,
                  f"{len(tally.order_violations)}" + (f": {tally.order_violations[:10]}" if tally.order_violations else "")),
            Check("messages no publisher sent, delivered", not tally.foreign,
                  f"{len(tally.foreign)}" + (f": {tally.foreign[:5]}" if tally.foreign else "")),
            Check(f"presence equal on every node within {self.node_timeout:g} s + {PRESENCE_TOLERANCE:g} s of the last fault's end",
                  self.presence_seconds is not None,
                  (f"after {self.presence_seconds:.1f} s: " if self.presence_seconds is not None else "not agreed: ")
                  + self.presence_detail),
            flowing,
        ]
        bound = self.node_timeout + PRESENCE_TOLERANCE
        late = [e for e in self.expiries if e[1] is not None and e[1] > bound]
        checks.append(Check(f"a killed node's sessions leave presence within {self.node_timeout:g} s + "
                            f"{PRESENCE_TOLERANCE:g} s of the kill", bool(self.expiries) and not late,
                            "; ".join(f"{name}: " + (f"{seconds:.1f} s" if seconds is not None else "-") + f" ({what})"
                                      for name, seconds, what in self.expiries)))
        forged = [f"captured {f.captured}, replayed {f.replayed}, damaged {f.damaged}" for f in self.forgeries]
        checks.append(Check("the forger captured and replayed the nodes' messages in every round (positive control)",
                            bool(self.forgeries) and all(f.captured and f.replayed and f.damaged for f in self.forgeries),
                            "; ".join(forged) + "".join(f" errors: {f.errors[:3]}" for f in self.forgeries if f.errors)))
        alive = [node.name for node in self.nodes if not node.alive()]
        checks.append(Check("no node died", not self.deaths and not alive,
                            "; ".join(self.deaths) + (f" not running at the end: {alive}" if alive else "") or "3 alive"))
        errors = []
        for node in self.nodes:
            lines = node.log().splitlines()
            for number, text in enumerate(lines):
                if any(marker in text for marker in ERROR_MARKERS):
                    errors.append(f"{node.name}: " + " | ".join(lines[number:number + 4])[:600])
        checks.append(Check("no unhandled error or traceback logged", not errors,
                            f"{len(errors)} lines" + ("".join(f"\n    {e}" for e in errors[:8]) if errors else "")))
        return checks

    def report(self, checks: list[Check]) -> None:
        tally = self.tally
        mode = "a 3-master Redis Cluster" if self.options.redis_cluster else "one redis-server"
        print(f"\nfault-injection run: 3 nodes on {mode} and PostgreSQL, "
              f"{time.monotonic() - self.started:.0f} s, node timeout {self.node_timeout:g} s")
        print("faults: " + "; ".join(self.faults))
        print(f"published: {tally.published}  acknowledged: {tally.acknowledged}")
        print(f"delivered: {dict(sorted(tally.delivered.items()))}")
        print(f"reconnections: {dict(sorted(tally.reconnects.items()))}")
        print(f"SMQP: {len(tally.smqp_acknowledged)} acknowledged, {len(tally.smqp_received)} received, "
              f"{tally.smqp_notifications} notifications, {len(tally.smqp_completed)} completed 310 exchanges")
        for forgery in self.forgeries:
            print(f"forger: captured {forgery.captured}, replayed {forgery.replayed}, damaged/garbage {forgery.damaged}"
                  + (f", errors {forgery.errors[:3]}" if forgery.errors else ""))
        if self.notes:
            print("last client notes:\n  " + "\n  ".join(list(self.notes)[-12:]))
        for check in checks:
            print(f"{'PASS' if check.ok else 'FAIL'}  {check.name}: {check.detail}")


def parse_options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="length of the run (at least one round of faults)")
    parser.add_argument("--redis-cluster", action="store_true", help="a 3-master Redis Cluster instead of one redis-server")
    parser.add_argument("--node-timeout", type=float, default=6.0,
                        help="the nodes' --cluster-node-timeout (their heartbeat is a third of it)")
    parser.add_argument("--directory", type=Path, help="where the servers keep their data and logs (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the directory (it is kept anyway when a check fails)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(sys.argv[1:] if argv is None else argv)
    directory = options.directory or Path(tempfile.mkdtemp(prefix="brokerd-faults-"))
    directory.mkdir(parents=True, exist_ok=True)
    outcome: dict[str, Any] = {}

    async def body(reactor: Any) -> None:
        run = Run(reactor, options, directory)
        outcome["run"] = run
        try:
            outcome["checks"] = await run.main()
        finally:
            await threads.deferToThread(run.stop_servers)

    def react_main(reactor: Any) -> Deferred:
        return ensureDeferred(body(reactor))

    try:
        task.react(react_main)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            print(f"the run failed before its checks; logs in {directory}", flush=True)
            run = outcome.get("run")
            if run is not None:
                print("last client notes:\n  " + "\n  ".join(run.notes))
            return 2
    run = outcome["run"]
    checks = outcome["checks"]
    run.report(checks)
    failed = [check for check in checks if not check.ok]
    if failed or options.keep:
        print(f"logs kept in {directory}")
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return 1 if failed else 0
