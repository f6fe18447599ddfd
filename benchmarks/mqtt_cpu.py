"""CPU per MQTT delivery on the broker's hot path, in process, revisions side by side.

    python benchmarks/mqtt_cpu.py --commit main --commit HEAD            # q1-ack and q0-1, 5 rounds
    python benchmarks/mqtt_cpu.py --commit main --commit HEAD --instructions   # callgrind's count

Why: mqtt_bench.py's CPU per delivery includes the reactor, the kernel and the machine's other
work; this measures what a change does to brokerd's own work, as ssmp_cpu.py does for SSMP.
An MQTT server factory with StringTransport connections (no sockets, no reactor), one
publisher and one subscriber (MQTT 3.1.1, 64-byte payloads, the event log off):

* ``q1-ack``: QoS 1, one PUBLISH per read, the subscriber answering each delivery with its
  PUBACK in a read of its own (mqtt_bench.py's q1-ack shape);
* ``q1-win``: QoS 1, reads of 16 PUBLISHes, the subscriber answering each read's deliveries
  with their PUBACKs in one read;
* ``q0-1``: QoS 0, reads of 16 PUBLISHes (pbload's batch).

It prints the process CPU time per delivery (``time.process_time``, the best of several
repetitions) or, with ``--instructions``, the instructions callgrind counts for one measured
repetition, per delivery (load-independent; slow to start).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import main
from ssmp_cpu import _dump_number, _instructions

MEASURE = r'''
import json, os, sys, time
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from brokerd.auth.realm import build_portal
from brokerd.config import Settings
from brokerd.core.broker import Broker
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import MQTT_311, Connect, Publish, Subscribe, Subscription
from brokerd.protocols.mqtt.server import MQTTServerFactory
from brokerd.protocols.mqtt.sessions import MQTTSessions

config = json.loads(sys.argv[1])


class Transport(StringTransport):
    def setTcpNoDelay(self, enabled):
        pass


def connection(factory, clock, port, client_id):
    address = IPv4Address("TCP", "127.0.0.1", port)
    protocol = factory.buildProtocol(address)
    transport = Transport(peerAddress=address)
    protocol.makeConnection(transport)
    protocol.dataReceived(encode(Connect(client_id), MQTT_311))
    clock.advance(0)
    assert transport.value()[:1] == b"\x20", transport.value()
    transport.clear()
    return protocol, transport


def pair(qos):
    settings = Settings(max_output_buffer=10**12)
    broker, clock = Broker(), Clock()
    factory = MQTTServerFactory(broker, build_portal(open_login=True, secret=None), settings, clock,
                                MQTTSessions(broker, settings, clock))
    factory.startFactory()
    subscriber = connection(factory, clock, 40001, "sub")
    subscriber[0].dataReceived(encode(Subscribe(1, (Subscription("t", qos=qos),)), MQTT_311))
    assert subscriber[1].value()[:1] == b"\x90", subscriber[1].value()
    subscriber[1].clear()
    return connection(factory, clock, 40002, "pub"), subscriber


def pubacks(delivered):
    """The subscriber's PUBACKs of the QoS 1 PUBLISHes in ``delivered`` (topic "t", 64 bytes)."""
    size = 2 + 2 + 1 + 2 + 64
    return b"".join(b"\x40\x02" + delivered[at + 5:at + 7] for at in range(0, len(delivered), size))


def measure(kind, messages, repeat, marks):
    qos, per_read = {"q1-ack": (1, 1), "q1-win": (1, 16), "q0-1": (0, 16)}[kind]
    (publisher, publisher_out), (subscriber, subscriber_out) = pair(qos)
    reads = [b"".join(encode(Publish("t", b"x" * 64, qos=qos, packet_id=(n * per_read + i) % 65535 + 1 if qos else None),
                             MQTT_311) for i in range(per_read)) for n in range(messages // per_read)]
    best = None
    for repetition in range(repeat):
        marked = marks and repetition == repeat - 1
        if marked:
            os.getppid()
        started = time.process_time()
        for data in reads:
            publisher.dataReceived(data)
            publisher_out.clear()
            delivered = subscriber_out.value()
            subscriber_out.clear()
            if qos:
                subscriber.dataReceived(pubacks(delivered))
        cost = (time.process_time() - started) / (len(reads) * per_read) * 1e9
        if marked:
            os.getpgrp()
        best = cost if best is None else min(best, cost)
    return best, len(reads) * per_read


results = {kind: measure(kind, config["messages"], config["repeat"], config["marks"]) for kind in config["kinds"]}
print(json.dumps({kind: ns for kind, (ns, _sent) in results.items()}))
print(json.dumps({"sent": {kind: sent for kind, (_ns, sent) in results.items()}}))
'''


def run_tree(tree: Path, kinds: list[str], messages: int, counting: bool) -> dict[str, float]:
    """One fresh process measuring ``kinds`` with the brokerd of ``tree``: ns per delivery, or
    (``counting``) instructions per delivery under callgrind."""
    config = json.dumps({"kinds": kinds, "messages": messages, "repeat": 2 if counting else 5, "marks": counting})
    command = [sys.executable, "-c", MEASURE, config]
    env = {"PYTHONPATH": str(tree), "PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"}
    if not counting:
        out = subprocess.run(command, cwd=tree, check=True, capture_output=True, text=True, env=env).stdout
        return json.loads(out.splitlines()[0])
    with tempfile.TemporaryDirectory(prefix="mqtt-cpu-callgrind-") as dumps:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dumps}/out",
                   "--zero-before=getppid", "--dump-before=getpgrp", *command]
        out = subprocess.run(command, cwd=tree, check=True, capture_output=True, text=True, env=env).stdout
        sent = json.loads(next(line for line in out.splitlines() if '"sent"' in line))["sent"]
        counts = [_instructions(path) for path in sorted(Path(dumps).glob("out.*"), key=_dump_number)]
    return {kind: count / sent[kind] for kind, count in zip(kinds, counts)}


if __name__ == "__main__":
    main(__doc__, run_tree, "q1-ack,q0-1", (16000, 2000), also="; also q1-win", per="deliveries")
