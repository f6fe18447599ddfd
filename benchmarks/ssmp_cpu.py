"""CPU per SSMP message on the broker's hot path, in process, revisions side by side.

    python benchmarks/ssmp_cpu.py --commit main --commit HEAD        # (a), (b), (c), (d); 5 rounds
    python benchmarks/ssmp_cpu.py --commit HEAD --minimal --only a,c,d   # HEAD beside the minimal server
    python benchmarks/ssmp_cpu.py --commit HEAD --tree variant=/tmp/variant   # HEAD beside a prepared tree
    python benchmarks/ssmp_cpu.py --commit HEAD --profile /tmp/prof --only d  # py-spy's stacks instead
    python benchmarks/ssmp_cpu.py --commit main --commit HEAD --per-read 1 --instructions  # callgrind's count

Why: on a machine shared with other work, the wall-clock throughput of run_ssmp.py swings
by tens of per cent from run to run.  This measures what a change does to the broker's own
work instead: an SSMP server factory with StringTransport connections (no sockets, no
reactor), the shapes of workloads (a) 1 -> 1, (b) 1 -> 50, (c) 10 pairs on own topics (reads of
16 pipelined 64-byte MCASTs) and (d) 50 senders each sending UCASTs to its own receiver
(reads of 16 100-byte UCASTs), and (r), not a pbload workload, 100 connections each sending
UCASTs to random others (the shape of ssmperf's load, the issue's lipwig comparison: runs of
one), fed to ``dataReceived``, and the process CPU time
(``time.process_time``, all threads) per message, the best of several repetitions.  The
broker's observer is what brokerd.tap makes it (the operator log in front of the event log,
which is off unless ``--event-log``).  ``--minimal`` runs benchmarks/minimal_ssmp.py in the
same harness: the in-process floor the socket comparison (compare_ssmp.py) measures against.
The revisions run in turn, round after round, in fresh processes, so they share the
machine's state.  It leaves out what the kernel does for sockets, so a change shows here
larger than in run_ssmp.py.  (Before the (d) workload was added, (c) here was 10 topics of
10 subscribers each, not pbload's 10 pairs: figures of (c) from then are not comparable.)

``--per-read 1`` sends one message per read instead of 16, so each goes through the core on its
own (``Broker.publish``, ``Broker.unicast``) rather than as a run.  ``--instructions`` counts
instead of timing: each revision runs once under ``valgrind --tool=callgrind``, which counts
the instructions of one measured repetition (after one unmeasured), per message.  The count
does not depend on what else the machine runs, so it shows changes of a few per cent that
the CPU time of a shared machine hides; it is slow (about half a minute per revision to
start Python under valgrind, then about 50 times the run's time).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MEASURE = r'''
import json, os, sys, tempfile, time
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

config = json.loads(sys.argv[1])
SHAPES = {"a": (1, 1), "b": (1, 50), "c": (10, 1), "d": (50, 1), "r": (100, 0)}
"""(publishers, receivers each)."""
PAYLOAD = {"d": 100, "r": 100}


class Transport(StringTransport):
    """Keeps what is written until ``quiet`` (a receiver once it is set up: its deliveries
    are dropped, as a socket's send() would take them; a bound ``write`` a server kept
    behaves the same)."""

    quiet = False

    def setTcpNoDelay(self, enabled):
        pass

    def write(self, data):
        if not self.quiet:
            StringTransport.write(self, data)


def brokerd_factory():
    from brokerd.auth.realm import build_portal
    from brokerd.config import Settings
    from brokerd.core.broker import Broker
    from brokerd.events.log import NULL_EVENT_LOG
    from brokerd.protocols.ssmp.server import SSMPServerFactory
    events = NULL_EVENT_LOG
    if config["event_log"]:
        from brokerd.events.log import EventLog
        events = EventLog(tempfile.mkdtemp(prefix="ssmp-cpu-events-"), reactor=Clock())
        events.startService()
    broker = Broker()
    try:  # what brokerd.tap makes the broker's observer (the event log behind the operator log)
        from brokerd.admin.oplog import OperatorLog
        broker.observer = OperatorLog(events)
    except ImportError:  # revisions before the operator log
        broker.observer = events if config["event_log"] else None
    settings = Settings(max_output_buffer=10**12)
    factory = SSMPServerFactory(broker, build_portal(open_login=True, secret=None), settings, Clock(), events)
    factory.startFactory()
    return factory


def minimal_factory():
    sys.path.insert(0, config["benchmarks"])
    from minimal_ssmp import MinimalFactory
    return MinimalFactory()


def sessions(kind):
    factory = minimal_factory() if config["server"] == "minimal" else brokerd_factory()
    ports = iter(range(40000, 50000))

    def login(name, topic=None, quiet=False):
        address = IPv4Address("TCP", "127.0.0.1", next(ports))
        protocol = factory.buildProtocol(address)
        transport = Transport(peerAddress=address)
        protocol.makeConnection(transport)
        protocol.dataReceived(b"LOGIN " + name + b" open\n")
        if topic is not None:
            protocol.dataReceived(b"SUBSCRIBE " + topic + b"\n")
        transport.quiet = quiet
        transport.clear()
        return protocol, transport

    senders, receivers = SHAPES[kind]
    publishers = []
    if kind == "r":  # (r): 100 connections, each sends UCASTs to random others (ssmperf's shape)
        return [(*login(b"u%d" % i, quiet=True), None) for i in range(senders)]
    for t in range(senders):
        if kind == "d":  # (d): sender i sends UCASTs to receiver i, which subscribes to nothing
            login(b"s%d" % t, quiet=True)
            publishers.append((*login(b"p%d" % t), b"UCAST s%d " % t))
            continue
        topic = b"t%d" % t
        for s in range(receivers):
            login(b"s%d_%d" % (t, s), topic, quiet=True)
        publishers.append((*login(b"p%d" % t), b"MCAST " + topic + b" "))
    return publishers


def measure(kind, messages, per_read, repeat, marks):
    """The best CPU time per message in ns, and how many messages one repetition sends.  With
    ``marks``, the last repetition calls getppid() before and getpgrp() after, where callgrind
    zeroes and dumps its counts (--zero-before, --dump-before)."""
    publishers = sessions(kind)
    payload = b"x" * PAYLOAD.get(kind, 64)
    if kind == "r":
        import random
        pick = random.Random(14)
        others = lambda i: pick.choice([j for j in range(len(publishers)) if j != i])
        reads = [b"".join(b"UCAST u%d " % others(i) + payload + b"\n" for _ in range(per_read))
                 for i in range(len(publishers))]
    else:
        reads = [b"".join(head + payload + b"\n" for _ in range(per_read)) for (_p, _t, head) in publishers]
    rounds = max(1, messages // (per_read * len(publishers)))
    best = None
    sent = rounds * per_read * len(publishers)
    for repetition in range(repeat):
        marked = marks and repetition == repeat - 1
        if marked:
            os.getppid()
        started = time.process_time()
        for _ in range(rounds):
            for (protocol, transport, _head), data in zip(publishers, reads):
                protocol.dataReceived(data)
                transport.clear()
        cost = (time.process_time() - started) / sent * 1e9
        if marked:
            os.getpgrp()
        best = cost if best is None else min(best, cost)
    return best, sent


results = {kind: measure(kind, config["messages"], config["per_read"], config["repeat"], config["marks"])
           for kind in config["kinds"]}
print(json.dumps({kind: ns for kind, (ns, _sent) in results.items()}))
print(json.dumps({"sent": {kind: sent for kind, (_ns, sent) in results.items()}}))
'''


def export(revision: str) -> Path:
    tree = Path(tempfile.mkdtemp(prefix="ssmp-cpu-"))
    archive = subprocess.run(["git", "archive", revision, "brokerd"], cwd=REPO, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def run_tree(tree: Path, server: str, options: argparse.Namespace, kinds: list[str],
             profile: Path | None = None, event_log: bool = False) -> dict[str, float]:
    """One fresh process measuring ``kinds`` with the brokerd of ``tree`` (or the minimal
    server); under ``py-spy record`` into ``profile`` (raw collapsed stacks) when given."""
    counting = options.instructions
    config = json.dumps({"server": server, "messages": options.messages, "kinds": kinds,
                         "event_log": event_log, "benchmarks": str(REPO / "benchmarks"),
                         "per_read": options.per_read, "repeat": 2 if counting else 5, "marks": counting})
    command = [sys.executable, "-c", MEASURE, config]
    if profile is not None:
        command = ["py-spy", "record", "--format", "raw", "--rate", str(options.profile_rate), "--nonblocking",
                   "-o", str(profile), "--", *command]
    env = {"PYTHONPATH": str(tree), "PATH": os.environ.get("PATH", "")}
    if not counting:
        out = subprocess.run(command, cwd=tree, check=True, capture_output=True, text=True, env=env).stdout
        lines = [line for line in out.splitlines() if line.startswith("{") and '"sent"' not in line]
        return json.loads(lines[-1])  # py-spy adds lines
    with tempfile.TemporaryDirectory(prefix="ssmp-cpu-callgrind-") as dumps:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dumps}/out",
                   "--zero-before=getppid", "--dump-before=getpgrp", *command]
        env["PYTHONHASHSEED"] = "0"  # the same hashes, so the same work, in every run
        out = subprocess.run(command, cwd=tree, check=True, capture_output=True, text=True, env=env).stdout
        sent = json.loads(next(line for line in out.splitlines() if '"sent"' in line))["sent"]
        counts = [_instructions(path) for path in sorted(Path(dumps).glob("out.*"), key=_dump_number)]
    return {kind: count / sent[kind] for kind, count in zip(kinds, counts)}


def _dump_number(path: Path) -> int:
    """Callgrind numbers its dumps out.1, out.2, ... in the order they were taken."""
    return int(path.name.rsplit(".", 1)[1])


def _instructions(dump: Path) -> int:
    """The instructions counted in one callgrind dump (its ``summary:`` or ``totals:`` line)."""
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError(f"{dump}: no instruction count")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", metavar="REV", action="append", help="repeatable [the working tree]")
    parser.add_argument("--tree", metavar="LABEL=DIR", action="append",
                        help="a prepared source tree (DIR/brokerd) to run beside the commits, e.g. a variant"
                             " of HEAD with some lines removed; repeatable")
    parser.add_argument("--minimal", action="store_true",
                        help="also measure benchmarks/minimal_ssmp.py in the same harness (the floor)")
    parser.add_argument("--event-log", action="store_true",
                        help="brokerd with the event log on (files in a temporary directory) [off, as"
                             " compare_ssmp.py runs it]")
    parser.add_argument("--event-log-too", action="store_true",
                        help="also the first revision with the event log on, as '<label> +event log'")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over all revisions [5]")
    parser.add_argument("--messages", type=int, default=32000, help="messages per repetition [32000]")
    parser.add_argument("--only", default="a,b,c,d", help="workloads [a,b,c,d]")
    parser.add_argument("--per-read", type=int, default=16,
                        help="messages per read [16]; 1 sends every message through the core alone")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per message under callgrind instead of timing (the"
                             " figures are then instructions, not ns; one round is enough)")
    parser.add_argument("--profile", metavar="DIR",
                        help="instead of measuring: one run per revision and workload under py-spy, raw"
                             " collapsed stacks into DIR/<label>-<workload>.txt")
    parser.add_argument("--profile-rate", type=int, default=1000, help="py-spy samples per second [1000]")
    options = parser.parse_args()
    log = options.event_log
    trees: dict[str, tuple[Path, str, bool]] = {rev: (export(rev), "brokerd", log) for rev in options.commit or []}
    for label, _eq, directory in (spec.partition("=") for spec in options.tree or []):
        trees[label] = (Path(directory).resolve(), "brokerd", log)
    if not options.commit and not options.tree:
        trees["working tree"] = (REPO, "brokerd", log)
    if options.event_log_too:
        label, (tree, _server, _log) = next(iter(trees.items()))
        trees[f"{label} +event log"] = (tree, "brokerd", True)
    if options.minimal:
        trees["minimal"] = (REPO, "minimal", False)
    kinds = options.only.split(",")
    if options.profile:
        out_dir = Path(options.profile)
        out_dir.mkdir(parents=True, exist_ok=True)
        for rev, (tree, server, event_log) in trees.items():
            for kind in kinds:
                target = out_dir / f"{''.join(c if c.isalnum() else '_' for c in rev)}-{kind}.txt"
                result = run_tree(tree, server, options, [kind], profile=target, event_log=event_log)
                print(f"{rev} ({kind}) {result[kind]:.0f} ns under py-spy -> {target}", flush=True)
        return
    seen: dict[str, dict[str, list[float]]] = {rev: {kind: [] for kind in kinds} for rev in trees}
    unit = "instructions" if options.instructions else "ns"
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for round_ in range(options.rounds):
        for rev, (tree, server, event_log) in trees.items():
            result = run_tree(tree, server, options, kinds, event_log=event_log)
            for kind, ns in result.items():
                seen[rev][kind].append(ns)
            print(f"round {round_ + 1} {rev}: " + ", ".join(f"({k}) {v:.0f} {unit}" for k, v in result.items()),
                  flush=True)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    base = next(iter(trees))
    for kind in kinds:
        cells = []
        for rev in trees:
            best = min(seen[rev][kind])
            median = statistics.median(seen[rev][kind])
            change = "" if rev == base else f" ({(best / min(seen[base][kind]) - 1) * 100:+.1f} %)"
            cells.append(f"{rev} best {best:.0f} {unit}, median {median:.0f} {unit}{change}")
        print(f"({kind}) " + " | ".join(cells))


if __name__ == "__main__":
    main()
