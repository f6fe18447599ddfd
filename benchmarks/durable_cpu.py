"""CPU per durable message on the broker's store path, in process, revisions side by side.

    python benchmarks/durable_cpu.py --commit main --commit HEAD                 # 5 rounds, ns
    python benchmarks/durable_cpu.py --commit main --commit HEAD --instructions  # callgrind's count

Why: smqp_bench.py measures durable publish and acknowledged delivery through sockets, a real
reactor and the store's writer thread, whose figures swing with the machine's load; this
measures what a change does to brokerd's own work on the durable path, as ssmp_cpu.py and
mqtt_cpu.py do for live delivery.  The broker is built as ``twistd brokerd`` builds it
(``brokerd.tap.build_service`` with an SMQP and an SSMP listener, never started: no socket),
its store the embedded SQLite file in a temporary data directory (synchronous=FULL as always),
the event log off (as ssmp_cpu.py and mqtt_cpu.py run it); connections are StringTransports
fed to ``dataReceived``, 64-byte payloads:

* ``smqp-pub``: an SMQP session PUBLISHes (guaranteed, one PUBLISH per read) to ``/bench``,
  whose one durable subscriber is offline: the publish and the store's hand-off, per message;
* ``smqp-window``: that subscriber comes back with ``SET NOTIFY WINDOW 64`` (brokerd's
  extension) and drains a stored backlog, answering every read's NOTIFY MESSAGEs with their
  ``310 ACK``s in one read, per delivered message;
* ``ssmp-durable``: an SSMP session MCASTs (one per read) to ``bench``, covered by the offline
  SMQP subscriber's durable subscription, so the core stores each before its ``200``.

The store's writer thread is never started (the store commits on a thread of its own, whose
group commit batches what arrived while the last transaction committed, which depends on
timing): the harness runs the store's queued batches itself, on the measuring thread, after
every read and until none is left, so the transactions are the same in every run and so is
the count (two runs of one revision agree within 0.1 %, separate invocations within 0.4 %).
With ``--instructions`` each workload is reported twice: ``<workload>`` counts everything
(the writer's part, SQLite's statements and commits, included; its fsyncs are the kernel's)
and ``<workload> reactor`` leaves out the writer's part (the store's ``_run_batch``, which the
harness calls through ``operator.call`` so that callgrind's inclusive count of that C function
is the writer's share): the work of the reactor thread, which is what a change of the core
moves.  Time stands still (a Clock that is never advanced: no retry or sweep timer fires).

It prints the process CPU time per message (``time.process_time``, the best of several
repetitions) or, with ``--instructions``, the instructions callgrind counts for one measured
repetition after an unmeasured one, per message (load-independent; slow: about three minutes
per revision).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import main
from ssmp_cpu import _dump_number, _instructions

KINDS = ("smqp-pub", "smqp-window", "ssmp-durable")

MEASURE = r'''
import atexit, json, operator, os, shutil, sys, tempfile, time
from pathlib import Path
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from brokerd.config import Settings
from brokerd.tap import build_service

config = json.loads(sys.argv[1])
PAYLOAD = b"x" * 64
WINDOW = 64


class InlinePool:
    """A thread pool that runs its work at once, on the calling thread (password checks)."""

    def callInThreadWithCallback(self, on_result, f, *args, **kwargs):
        try:
            result = f(*args, **kwargs)
        except BaseException:
            on_result(False, Failure())
        else:
            on_result(True, result)


class Reactor(Clock):
    """The reactor brokerd is built with: time stands still, thread pool work runs inline,
    and nothing runs "when running": the store's writer thread is never started
    (:func:`drain` runs its batches)."""

    running = False

    def callWhenRunning(self, f, *args, **kwargs):
        pass

    def addSystemEventTrigger(self, *args, **kwargs):
        return object()

    def removeSystemEventTrigger(self, trigger):
        pass

    def callFromThread(self, f, *args, **kwargs):
        f(*args, **kwargs)

    def getThreadPool(self):
        return InlinePool()


class Transport(StringTransport):
    def setTcpNoDelay(self, enabled):
        pass


class Broker:
    """brokerd as ``twistd brokerd --smqp ... --ssmp ...`` builds it, in a fresh data dir."""

    def __init__(self):
        data_dir = Path(tempfile.mkdtemp(prefix="durable-cpu-"))
        atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
        # Only settings every revision measured knows (the smqp_* ones that became durable_*
        # keep their defaults).
        settings = Settings(data_dir=data_dir, open_login=True, smqp_guest_permissions="psc",
                            max_output_buffer=10**12, event_log=False,
                            listeners={"smqp": [f"unix:{data_dir}/smqp.sock"], "ssmp": [f"unix:{data_dir}/ssmp.sock"]})
        runtime = build_service(settings, Reactor()).runtime
        # Where the listeners' factories are kept: Runtime.front_ends since the front ends are
        # plugins; before, the runtime's resources dict.
        factories = getattr(runtime, "front_ends", None) or runtime.resources["factories"]
        self.smqp, self.ssmp = factories["smqp"], factories["ssmp"]
        self.store = self.smqp.store
        self.ports = iter(range(40000, 50000))
        for factory in (self.smqp, self.ssmp):
            factory.doStart()  # what a listening port does first
        self.drain()
        assert self.smqp.started.called and self.smqp.start_error is None, self.smqp.start_error

    def drain(self):
        """Run the store's queued batches, as its writer thread would, until none is left; the
        writer's part (``_run_batch``) through ``operator.call``, so that callgrind can tell it."""
        store = self.store
        while store._busy:
            batch = store._inbox.get_nowait()
            store._batch_done(operator.call(store._run_batch, batch), batch)

    def connect(self, factory, data):
        address = IPv4Address("TCP", "127.0.0.1", next(self.ports))
        protocol = factory.buildProtocol(address)
        transport = Transport(peerAddress=address)
        protocol.makeConnection(transport)
        self.send(protocol, data)
        return protocol, transport

    def send(self, protocol, data):
        protocol.dataReceived(data)
        self.drain()

    def smqp_login(self, channel, commands=b""):
        protocol, out = self.connect(self.smqp, b"LOGIN guest:%s CLEAR/1.0\r\nPASS guest\r\n%s" % (channel, commands))
        assert b"200 Suid: " in out.value(), out.value()
        return protocol, out


def publish_command(n):
    return (b"PUBLISH MESSAGE /bench c%08d\r\nCreated: D20261129T00000000Z\r\n\r\n"
            b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s\r\n.\r\n" % (n, len(PAYLOAD), PAYLOAD))


def offline_subscriber(broker):
    """Topic /bench and a durable subscriber of it (guest:sub), gone: its messages are stored."""
    protocol, out = broker.smqp_login(b"sub", b"CREATE TOPIC /bench\r\nSUB MESSAGE /bench\r\n")
    assert out.value().endswith(b"200 OK\r\n200-OK\r\n200 /bench\r\n"), out.value()
    broker.send(protocol, b"QUIT\r\n")
    protocol.connectionLost(Failure(ConnectionDone()))


def repetitions(run, repeat, marks):
    """Call ``run()`` (one repetition, which returns the messages it did) ``repeat`` times; the
    best CPU time per message in ns and the messages of one repetition.  With ``marks``, the
    last repetition calls getppid() before and getpgrp() after, where callgrind zeroes and
    dumps its counts (--zero-before, --dump-before)."""
    best, done = None, 0
    for repetition in range(repeat):
        marked = marks and repetition == repeat - 1
        if marked:
            os.getppid()
        started = time.process_time()
        done = run()
        cost = (time.process_time() - started) / done * 1e9
        if marked:
            os.getpgrp()
        best = cost if best is None else min(best, cost)
    return best, done


def publishing(broker, messages, command, reply):
    """A session that sends ``command(n)`` one per read; each answer holds ``reply`` once."""
    if command is publish_command:
        protocol, out = broker.smqp_login(b"pub")
    else:
        protocol, out = broker.connect(broker.ssmp, b"LOGIN p open\n")
    out.clear()
    sent = [0]

    def run():
        for _ in range(messages):
            broker.send(protocol, command(sent[0]))
            sent[0] += 1
        assert out.value().count(reply) == messages, out.value()[-300:]
        out.clear()
        return messages

    return run


def measure(kind, messages, repeat, marks):
    broker = Broker()
    offline_subscriber(broker)
    if kind == "smqp-pub":
        return repetitions(publishing(broker, messages, publish_command, b"\n200 "), repeat, marks)
    if kind == "ssmp-durable":
        mcast = lambda _n: b"MCAST bench " + PAYLOAD + b"\n"
        return repetitions(publishing(broker, messages, mcast, b"200\n"), repeat, marks)
    # the backlog: each repetition answers whole windows, up to WINDOW more than ``messages``
    publishing(broker, repeat * (messages + WINDOW) + WINDOW, publish_command, b"\n200 ")()
    subscriber, out = broker.smqp_login(
        b"sub", b"SET NOTIFY SUSPEND\r\nSET NOTIFY WINDOW %d\r\nSET NOTIFY RESUME\r\n" % WINDOW)

    def run():
        """Answer the NOTIFYs each read brought, in one read, until ``messages`` were."""
        delivered = 0
        while delivered < messages:
            notified = out.value().count(b"NOTIFY MESSAGE ")
            assert notified, out.value()[-300:]
            out.clear()
            broker.send(subscriber, b"310 ACK\r\n" * notified)
            delivered += notified
        return delivered

    return repetitions(run, repeat, marks)


ns, done = measure(config["kind"], config["messages"], config["repeat"], config["marks"])
print(json.dumps({"ns": ns, "done": done}))
'''


def run_tree(tree: Path, kinds: list[str], messages: int, counting: bool) -> dict[str, float]:
    """Each of ``kinds`` measured in a fresh process of its own with the brokerd of ``tree``:
    ns per message, or (``counting``) instructions per message under callgrind, as
    ``<kind>`` (everything) and ``<kind> reactor`` (the store writer's part left out).  One
    process per workload: after another workload in the same process, the count moved by
    up to 0.7 % from run to run; alone, it repeats to a few instructions."""
    figures: dict[str, float] = {}
    for kind in kinds:
        config = json.dumps({"kind": kind, "messages": messages, "repeat": 2 if counting else 5, "marks": counting})
        command = [sys.executable, "-c", MEASURE, config]
        env = {"PYTHONPATH": str(tree), "PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"}
        if not counting:
            figures[kind] = json.loads(_output(command, tree, env))["ns"]
            continue
        with tempfile.TemporaryDirectory(prefix="durable-cpu-callgrind-") as dumps:
            command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dumps}/out",
                       "--zero-before=getppid", "--dump-before=getpgrp", *command]
            done = json.loads(_output(command, tree, env))["done"]
            dump = min(Path(dumps).glob("out.*"), key=_dump_number)
            count = _instructions(dump)
            figures[kind] = count / done
            figures[f"{kind} reactor"] = (count - _writer_instructions(dump)) / done
    return figures


def _output(command: list[str], tree: Path, env: dict[str, str]) -> str:
    """The measuring process's output; its traceback when it failed (a revision whose
    construction or replies the harness does not know)."""
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"measuring {tree} failed:\n{done.stderr[-4000:]}")
    return done.stdout


def _writer_instructions(dump: Path) -> int:
    """The inclusive instructions of ``operator.call`` in one dump: the store writer's part,
    which the measuring process runs through it and nothing else does."""
    report = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(dump)],
                            check=True, capture_output=True, text=True).stdout
    for line in report.splitlines():
        if re.search(r":_operator_call\b", line):
            return int(line.split()[0].replace(",", ""))
    return 0


if __name__ == "__main__":
    main(__doc__, run_tree, ",".join(KINDS), (2048, 512))
