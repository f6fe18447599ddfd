"""Synthetic event logs in the broker's layout, for benchmarks and demonstrations.

``generate(data_dir, events)`` writes about ``events`` records spread over ``hours`` hourly
partitions, deterministically from ``seed``: logins and subscriptions first, then accepted
messages from all four protocols (with fan-out from the subscriptions), SMQP acknowledgements
with latencies, a few drops, expiries, trashed messages and auth failures.  The hours are
written by ``workers`` processes in parallel.  Records go through ``schema.encode``, so the
files are exactly what a broker writes.
"""
from __future__ import annotations

import os
import random
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from brokerd.events import schema

DEFAULT_START_US = 1_714_521_600_000_000
"""2024-05-01T00:00:00Z."""
PROTOCOLS = ("ssmp", "mcchat", "smqp", "socketmq")
TOPICS = 100
PUBLISHERS = 200
SUBSCRIBERS = 500


def _subscriptions(seed: int) -> dict[int, list[int]]:
    """Subscriber index -> topics, the same in every worker."""
    rng = random.Random(seed)
    return {s: rng.sample(range(TOPICS), rng.randint(1, 5)) for s in range(SUBSCRIBERS)}


def _hour(args: tuple[Path, int, int, int, int, str]) -> int:
    data_dir, hour, count, start_us, seed, broker = args
    rng = random.Random(seed * 1_000_003 + hour)
    subscriptions = _subscriptions(seed)
    fanout = [0] * TOPICS
    for topics in subscriptions.values():
        for topic in topics:
            fanout[topic] += 1
    hour_start = start_us + hour * schema.HOUR_US
    directory = data_dir / schema.EVENTS_DIR / schema.partition_path(hour_start)
    directory.mkdir(parents=True, exist_ok=True)
    encode = schema.encode
    lines: list[str] = []
    base = {"v": schema.SCHEMA_VERSION, "broker": broker}
    if hour == 0:
        for s, topics in subscriptions.items():
            protocol = PROTOCOLS[s % 4]
            name = f"sub-{s}"
            lines.append(encode({**base, "ts": hour_start + s, "protocol": protocol, "kind": schema.LOGIN,
                                 "session": name, "outcome": "ok", "source": f"10.0.{s // 250}.{s % 250}:4{s:04d}"}))
            for topic in topics:
                lines.append(encode({**base, "ts": hour_start + s, "protocol": protocol, "kind": schema.SUBSCRIBED,
                                     "session": name, "topic": f"t/{topic}"}))
    remaining = count - len(lines)
    step = schema.HOUR_US / max(1, remaining)
    for i in range(remaining):
        ts = hour_start + int(i * step)
        roll = rng.random()
        publisher = rng.randrange(PUBLISHERS)
        protocol = PROTOCOLS[publisher % 4]
        topic = rng.randrange(TOPICS)
        if roll < 0.90:
            dropped = 1 if rng.random() < 0.01 else None
            record = {**base, "ts": ts, "protocol": protocol, "kind": schema.ACCEPTED,
                      "session": f"pub-{publisher}", "topic": f"t/{topic}", "message": "multicast",
                      "bytes": rng.randint(10, 1024), "fanout": fanout[topic], "dropped": dropped,
                      "outcome": "partial" if dropped else ("routed" if fanout[topic] else "unrouted")}
        elif roll < 0.97:
            record = {**base, "ts": ts, "protocol": "smqp", "kind": schema.ACKED,
                      "session": f"sub-{rng.randrange(SUBSCRIBERS)}", "sender": f"pub-{publisher}",
                      "topic": f"t/{topic}", "message_id": f"m{hour}-{i}", "bytes": rng.randint(10, 1024),
                      "outcome": "acked", "latency_us": int(rng.lognormvariate(7, 1))}
        elif roll < 0.985:
            record = {**base, "ts": ts, "protocol": PROTOCOLS[rng.randrange(4)], "kind": schema.DROPPED,
                      "session": f"sub-{rng.randrange(SUBSCRIBERS)}", "topic": f"t/{topic}",
                      "reason": rng.choice((schema.SLOW_CONSUMER, schema.QUEUE_FULL, schema.NO_RECIPIENT)),
                      "outcome": "dropped"}
        elif roll < 0.995:
            kind = schema.EXPIRED if rng.random() < 0.5 else schema.TRASHED
            record = {**base, "ts": ts, "protocol": "smqp", "kind": kind,
                      "session": f"sub-{rng.randrange(SUBSCRIBERS)}", "sender": f"pub-{publisher}",
                      "topic": f"t/{topic}", "message_id": f"m{hour}-{i}", "bytes": rng.randint(10, 1024),
                      "reason": "expired" if kind == schema.EXPIRED else "undeliverable", "outcome": kind}
        else:
            record = {**base, "ts": ts, "protocol": PROTOCOLS[rng.randrange(4)], "kind": schema.AUTH_FAILURE,
                      "session": f"intruder-{rng.randrange(20)}", "source": f"192.0.2.{rng.randrange(16)}:{rng.randrange(1024, 65535)}",
                      "scheme": "secret", "outcome": "refused", "reason": "bad credentials"}
        lines.append(encode(record))
        if len(lines) >= 100_000:
            _append(directory, broker, lines)
            lines = []
    _append(directory, broker, lines)
    return count


def _append(directory: Path, broker: str, lines: list[str]) -> None:
    with open(directory / f"events-{broker}-generated-1{schema.FILE_SUFFIX}", "a", encoding="utf-8") as handle:
        handle.write("".join(lines))


def generate(
    data_dir: Path | str,
    events: int,
    *,
    hours: int = 10,
    seed: int = 1,
    start_us: int = DEFAULT_START_US,
    broker: str = "generated",
    workers: int | None = None,
) -> int:
    """Write about ``events`` records (the exact number is returned) under ``data_dir``."""
    data_dir = Path(data_dir)
    hours = max(1, min(hours, events // max(1, SUBSCRIBERS * 4) or 1))
    per_hour = [events // hours + (1 if h < events % hours else 0) for h in range(hours)]
    per_hour[0] = max(per_hour[0], SUBSCRIBERS * 6)
    jobs = [(data_dir, h, per_hour[h], start_us, seed, broker) for h in range(hours)]
    workers = workers or min(hours, os.cpu_count() or 1)
    if workers == 1:
        return sum(map(_hour, jobs))
    with ProcessPoolExecutor(workers) as pool:
        return sum(pool.map(_hour, jobs))
