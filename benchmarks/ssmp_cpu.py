"""CPU per SSMP message on the broker's hot path, in process, revisions side by side.

    python benchmarks/ssmp_cpu.py --commit main --commit HEAD        # (a), (b), (c); 5 rounds
    python benchmarks/ssmp_cpu.py --commit HEAD --tree variant=/tmp/variant   # HEAD beside a prepared tree

Why: on a machine shared with other work, the wall-clock throughput of run_ssmp.py swings
by tens of per cent from run to run.  This measures what a change does to the broker's own
work instead: an SSMP server factory with StringTransport connections (no sockets, no
reactor), the shapes of workloads (a) 1 -> 1, (b) 1 -> 50 and (c) 10 x 10 own topics, reads
of 16 pipelined 64-byte MCASTs fed to ``dataReceived``, and the process CPU time
(``time.process_time``) per message, the best of several repetitions.  The revisions run in
turn, round after round, in fresh processes, so they share the machine's state.  It leaves
out what the kernel does for sockets, so a change shows here larger than in run_ssmp.py.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MEASURE = r'''
import json, sys, time
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from brokerd.auth.realm import build_portal
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.events.log import NULL_EVENT_LOG
from brokerd.protocols.ssmp.server import SSMPServerFactory


class Discard(StringTransport):
    def write(self, data):
        pass


def sessions(kind):
    settings = Settings(max_output_buffer=10**12)
    factory = SSMPServerFactory(Broker(), build_portal(open_login=True, secret=None), settings, Clock(),
                                NULL_EVENT_LOG)
    factory.startFactory()
    ports = iter(range(40000, 50000))

    def login(name, topic=None):
        address = IPv4Address("TCP", "127.0.0.1", next(ports))
        protocol = factory.buildProtocol(address)
        transport = StringTransport(peerAddress=address)
        protocol.makeConnection(transport)
        protocol.dataReceived(b"LOGIN " + name + b" open\n")
        if topic is not None:
            protocol.dataReceived(b"SUBSCRIBE " + topic + b"\n")
            transport.__class__ = Discard
        transport.clear()
        return protocol, transport

    shape = {"a": (1, 1), "b": (1, 50), "c": (10, 10)}[kind]
    publishers = []
    for t in range(shape[0]):
        topic = b"t%d" % t
        for s in range(shape[1]):
            login(b"s%d_%d" % (t, s), topic)
        publishers.append((*login(b"p%d" % t), topic))
    return publishers


def measure(kind, messages, per_read=16, repeat=5):
    publishers = sessions(kind)
    reads = [b"".join(b"MCAST " + topic + b" " + b"x" * 64 + b"\n" for _ in range(per_read))
             for (_p, _t, topic) in publishers]
    rounds = max(1, messages // (per_read * len(publishers)))
    best = None
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(rounds):
            for (protocol, transport, _topic), data in zip(publishers, reads):
                protocol.dataReceived(data)
                transport.clear()
        cost = (time.process_time() - started) / (rounds * per_read * len(publishers)) * 1e9
        best = cost if best is None else min(best, cost)
    return best


print(json.dumps({kind: measure(kind, int(sys.argv[1])) for kind in sys.argv[2:]}))
'''


def export(revision: str) -> Path:
    tree = Path(tempfile.mkdtemp(prefix="ssmp-cpu-"))
    archive = subprocess.run(["git", "archive", revision, "brokerd"], cwd=REPO, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", metavar="REV", action="append", help="repeatable [the working tree]")
    parser.add_argument("--tree", metavar="LABEL=DIR", action="append",
                        help="a prepared source tree (DIR/brokerd) to run beside the commits, e.g. a variant"
                             " of HEAD with some lines removed; repeatable")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over all revisions [5]")
    parser.add_argument("--messages", type=int, default=32000, help="messages per repetition [32000]")
    parser.add_argument("--only", default="a,b,c", help="workloads [a,b,c]")
    options = parser.parse_args()
    trees = {rev: export(rev) for rev in options.commit or []}
    for label, _eq, directory in (spec.partition("=") for spec in options.tree or []):
        trees[label] = Path(directory).resolve()
    if not trees:
        trees["working tree"] = REPO
    kinds = options.only.split(",")
    seen: dict[str, dict[str, list[float]]] = {rev: {kind: [] for kind in kinds} for rev in trees}
    for round_ in range(options.rounds):
        for rev, tree in trees.items():
            out = subprocess.run([sys.executable, "-c", MEASURE, str(options.messages), *kinds], cwd=tree,
                                 check=True, capture_output=True, text=True, env={"PYTHONPATH": str(tree)}).stdout
            for kind, ns in json.loads(out).items():
                seen[rev][kind].append(ns)
            print(f"round {round_ + 1} {rev[:12]}: " + ", ".join(f"({k}) {v:.0f} ns" for k, v in json.loads(out).items()),
                  flush=True)
    print()
    base = next(iter(trees))
    for kind in kinds:
        cells = []
        for rev in trees:
            best = min(seen[rev][kind])
            median = statistics.median(seen[rev][kind])
            change = "" if rev == base else f" ({(best / min(seen[base][kind]) - 1) * 100:+.1f} %)"
            cells.append(f"{rev[:12]} best {best:.0f} ns, median {median:.0f} ns{change}")
        print(f"({kind}) " + " | ".join(cells))


if __name__ == "__main__":
    main()
