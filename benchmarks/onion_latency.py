"""SSMP round trips over an onion listener beside the same round trips on loopback.

Builds the tests' private Tor network (tests/support/tor.py: 3 authorities, 2 relays, a client
and a service tor, all on 127.0.0.1), starts one broker with an SSMP listener on loopback and
one published as an onion service (through the service tor's control port), and times
``--trips`` round trips of ``UCAST`` to oneself (the event, then ``200``) on each: one
connection through the client tor's SOCKS port, one straight to the loopback port.  Prints
the median, p90 and max of each, and the time to connect through Tor (the rendezvous).

    python benchmarks/onion_latency.py                 # ~1 minute, most of it the network's bootstrap
    python benchmarks/onion_latency.py --trips 500
"""
from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.broker import LineClient, free_port  # noqa: E402
from tests.support.tor import socks_connect, start_network, start_onion_broker  # noqa: E402


def trips(client: LineClient, name: str, count: int) -> list[float]:
    """Seconds of each UCAST round trip (event and reply) on one connection logged in as ``name``."""
    seconds = []
    for number in range(count):
        started = time.perf_counter()
        client.send(f"UCAST {name} t{number}\n")
        assert client.line().startswith(f"000 {name} UCAST".encode()), "no event"
        assert client.line() == b"200", "no reply"
        seconds.append(time.perf_counter() - started)
    return seconds


def summary(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    return (f"{name:9} median {statistics.median(ordered) * 1000:8.2f} ms   p90 "
            f"{ordered[int(len(ordered) * 0.9)] * 1000:8.2f} ms   max {ordered[-1] * 1000:8.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onion-latency-") as directory:
        root = Path(directory)
        network = start_network(root / "tor")
        print(f"private Tor network up in {network.bootstrap_seconds:.1f} s")
        try:
            assert network.service is not None and network.client is not None
            port = free_port()
            broker = start_onion_broker(root / "broker", "--open-login", "--ping-interval", "600",
                                        "--ssmp", f"tcp:{port}:interface=127.0.0.1",
                                        "--tor-control", network.service.control_endpoint,
                                        listeners={"ssmp": "onion:8787"})
            try:
                started = time.perf_counter()
                over_tor = LineClient(socks_connect(network.client.socks_port, *broker.addresses["ssmp"]), timeout=60)
                print(f"first connection through Tor: {(time.perf_counter() - started) * 1000:.0f} ms")
                loopback = LineClient(socket.create_connection(("127.0.0.1", port), timeout=10), timeout=10)
                for client, name in ((over_tor, "onion"), (loopback, "loopback")):
                    assert client.request(f"LOGIN {name} open") == b"200"
                    trips(client, name, 10)  # warm-up
                print(summary("loopback", trips(loopback, "loopback", args.trips)))
                print(summary("onion", trips(over_tor, "onion", args.trips)))
            finally:
                broker.stop()
        finally:
            network.stop()


if __name__ == "__main__":
    main()
