"""Sequential acknowledgements through the SQLite store, in process: the store's share of one
subscriber's two-phase round trip.

    python benchmarks/store_roundtrip.py                 # 3000 messages, 3 runs
    python benchmarks/store_roundtrip.py --messages 5000 --runs 5

Why: an acknowledged SMQP delivery to one subscriber waits for the commit that records the
acknowledgement before the next notification may go (docs/performance-history.md).  This measures
that wait alone, without sockets or a client: a real reactor, a fresh SQLite store
(synchronous=FULL) in a temporary directory, ``--messages`` messages published with one
pending delivery each, then acknowledged one after the other, each waiting for the
previous one's Deferred (reactor -> writer thread -> commit -> reactor).  Prints the
acknowledgements per second and the p50/p90 of one round trip per run, with the load.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from twisted.internet import defer, reactor  # noqa: E402

from brokerd.store.records import MessageRecord  # noqa: E402
from brokerd.store.sqlite import SQLiteStore  # noqa: E402


@defer.inlineCallbacks
def one_run(messages: int):
    store = SQLiteStore(Path(tempfile.mkdtemp(prefix="store-roundtrip-")) / "smqp.sqlite3", reactor)
    yield store.open()
    first = yield store.next_seq()
    published = [store.publish(MessageRecord(f"bench/{first + i}", "bench", "alice:p", f"c{i}", time.time(),
                                             None, 1, b"x" * 300, first + i), [("bob:sub", "ADD")])
                 for i in range(messages)]
    yield defer.gatherResults(published)
    took = []
    started = time.perf_counter()
    for i in range(messages):
        at = time.perf_counter()
        yield store.acknowledge("bob:sub", first + i)
        took.append(time.perf_counter() - at)
    elapsed = time.perf_counter() - started
    yield store.close()
    took.sort()
    return {"acks_per_s": round(messages / elapsed), "p50_us": round(took[len(took) // 2] * 1e6),
            "p90_us": round(took[len(took) * 9 // 10] * 1e6), "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=3000, help="acknowledgements per run [3000]")
    parser.add_argument("--runs", type=int, default=3, help="runs [3]")
    options = parser.parse_args()

    @defer.inlineCallbacks
    def runs():
        try:
            for _ in range(options.runs):
                result = yield one_run(options.messages)
                print(json.dumps(result), flush=True)
        finally:
            reactor.stop()

    reactor.callWhenRunning(runs)
    reactor.run()


if __name__ == "__main__":
    main()
