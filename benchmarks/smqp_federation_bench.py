"""SMQP forwarding over a server link: acknowledged messages per second, end to end.

    python benchmarks/smqp_federation_bench.py                  # 2,000 messages, window 64
    python benchmarks/smqp_federation_bench.py --messages 5000 --runs 3

Two real ``twistd brokerd`` processes on loopback, domains alpha.bench and beta.bench, beta
linked to alpha (docs/smqp.md, Federation).  One publisher on alpha keeps ``--window``
``PUBLISH /news`` (``Depth: 1``) in flight; one durable subscriber of ``/alpha_bench/news``
on beta takes each NOTIFY through ``310 ACK``.  So every message is stored at alpha, sent to
the link, stored at beta, acknowledged to alpha, then delivered at beta.  For comparison
the same subscriber subscribed to ``/news`` on alpha itself (no link) is run first.

Reported per run: messages per second from the first publish to the last acknowledgement at
the subscriber, for the local path and for the forwarded path, with the load average.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.smqp_fixtures import ACCOUNTS, BlockingSMQP, write_test_accounts  # noqa: E402
from tests.support.broker import free_port, start_broker  # noqa: E402

PEER = "peerpw"


def _broker(home: Path, name: str, port: int, *links: str):
    home.mkdir()
    write_test_accounts(home / "accounts", {**ACCOUNTS, "peer": PEER})
    (home / "peer.pw").write_text(PEER + "\n")
    options = ["--accounts", str(home / "accounts"), "--smqp-domain", name, "--smqp", f"tcp:{port}:interface=127.0.0.1",
               "--no-event-log"]
    for link in links:
        options += ["--smqp-link", link, "--smqp-link-account", "peer", "--smqp-link-password-file",
                    str(home / "peer.pw")]
    return start_broker(home, *options, listeners={}, wait_for=(port,))


def _run(publisher: BlockingSMQP, subscriber: BlockingSMQP, count: int, window: int) -> float:
    """Publish ``count`` messages (``window`` in flight) while a thread takes them all at the
    subscriber (NOTIFY, ``310 ACK``); messages per second until the last acknowledgement."""
    done: list[float] = []

    def take() -> None:
        for _ in range(count):
            subscriber.notify()
            subscriber.send(b"310 ACK\r\n")
            assert subscriber.reply().code == 310
        done.append(time.monotonic())

    reader = threading.Thread(target=take)
    start = time.monotonic()
    reader.start()
    sent = replied = 0
    while replied < count:
        while sent < count and sent - replied < window:
            publisher.send(publisher.publish_bytes("/news", f"B{sent}", b"x" * 100, ("Depth", "1")))
            sent += 1
        assert publisher.reply().code == 200
        replied += 1
    reader.join()
    return count / (done[0] - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    local_rates, forwarded_rates = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            root = Path(tmp) / f"run{run}"
            root.mkdir()
            alpha_port, beta_port = free_port(), free_port()
            alpha = _broker(root / "alpha", "alpha.bench", alpha_port)
            beta = _broker(root / "beta", "beta.bench", beta_port, f"alpha.bench=tcp:127.0.0.1:{alpha_port}")
            try:
                publisher = BlockingSMQP(alpha_port, timeout=60)
                publisher.login("alice", "pub")
                assert publisher.command("CREATE TOPIC /news").code == 200
                local = BlockingSMQP(alpha_port, timeout=60)
                local.login("bob", "local")
                assert local.command("SUB MESSAGE /news").code == 200
                local_rates.append(_run(publisher, local, args.messages, args.window))
                assert local.command("UNSUB MESSAGE /news").code == 200
                remote = BlockingSMQP(beta_port, timeout=60)
                remote.login("alice", "admin")
                for topic in ("/alpha_bench", "/alpha_bench/news"):
                    assert remote.command(f"CREATE TOPIC {topic}").code == 200
                assert remote.command("SUB MESSAGE /alpha_bench/news").code == 200
                deadline = time.monotonic() + 30
                while publisher.command("COUNT SUBSCRIBERS /news").lines[-1] != "1":
                    assert time.monotonic() < deadline, "the link did not subscribe"
                forwarded_rates.append(_run(publisher, remote, args.messages, args.window))
            finally:
                alpha.stop(signal.SIGTERM)
                beta.stop(signal.SIGTERM)
    load = os.getloadavg()
    print(f"{args.messages} messages, window {args.window}, {args.runs} run(s), load {load[0]:.1f} {load[1]:.1f}")
    print(f"local (alpha -> subscriber on alpha):     {statistics.median(local_rates):8.0f} msg/s")
    print(f"forwarded (alpha -> link -> beta -> sub): {statistics.median(forwarded_rates):8.0f} msg/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
