"""The subscription counts: the ``top_subscribers`` and ``cross_protocol`` tables
(brokerd.pipeline.tables defines them), from the merged summaries.

A subscription's messages are counted at each endpoint
(start, end), the running sums of the whole hours before the endpoint's hour (``publishing``)
plus the part of its own hour before it (``before_topic``, ``before_own``).  The endpoints are
``rare`` records (subscriptions, unsubscriptions, logouts: few), so they are walked in Python;
the per-hour sums are numpy running sums looked up by binary search.
"""
from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from brokerd.events import schema
from brokerd.pipeline.arrowbase import (
    RANKING, Summaries, conform, is_in, longs, ranked, run_starts, sort_by, strings,
)
from brokerd.pipeline.summaries import HOUR_US, filter_matches, group, is_filter, sums

HOURLY = [("messages", "sum", "n"), ("bytes", "sum", "nb")]
FAR_FUTURE_US = 1 << 62
"""Stands for "still subscribed at the end of the log"."""


_K = TypeVar("_K", bound=Hashable)


def _add(totals: dict[_K, list[int]], key: _K, n: int, nb: int) -> None:
    """Add a count of messages and bytes to ``totals[key]``."""
    counted = totals.setdefault(key, [0, 0])
    counted[0] += n
    counted[1] += nb


def _rare(s: Summaries, kinds: Sequence[str]) -> Any:
    return s["rare"].filter(is_in(s["rare"].column("kind"), kinds))


def internal_sessions(s: Summaries) -> set[tuple[str, str]]:
    """(session, protocol) of the broker's own sessions: a ``login`` without ``source``."""
    logins = _rare(s, [schema.LOGIN])
    logins = logins.filter(pc.is_null(logins.column("source")))
    return set(zip(logins.column("session").to_pylist(), logins.column("protocol").to_pylist()))


def subscriptions(s: Summaries) -> list[dict[str, Any]]:
    """One dict per subscription (session, protocol, topic, start,
    end; FAR_FUTURE_US when it lasted to the end), the broker's own sessions left out.  A
    subscription ends at the first ``unsubscribed`` of its session, protocol and topic after
    it or its session's first ``logout`` after it; nulls match nothing, as in Spark's joins."""
    ends = _rare(s, [schema.SUBSCRIBED, schema.UNSUBSCRIBED, schema.LOGOUT]).select(["kind", "session", "protocol", "topic", "ts"])
    leaves: dict[tuple[Any, ...], list[int]] = {}
    logouts: dict[tuple[Any, ...], list[int]] = {}
    subs = set()
    for kind, session, protocol, topic, ts in zip(*[ends.column(n).to_pylist() for n in ends.column_names]):
        if kind == schema.SUBSCRIBED:
            subs.add((session, protocol, topic, ts))
        elif kind == schema.UNSUBSCRIBED and session is not None and topic is not None:
            leaves.setdefault((session, protocol, topic), []).append(ts)
        elif kind == schema.LOGOUT and session is not None:
            logouts.setdefault((session, protocol), []).append(ts)
    for found in (*leaves.values(), *logouts.values()):
        found.sort()

    def first_after(times: list[int] | None, start: int) -> int | None:
        if not times:
            return None
        index = bisect.bisect_right(times, start)
        return times[index] if index < len(times) else None

    internal = internal_sessions(s)
    result = []
    for session, protocol, topic, start in sorted(subs, key=lambda sub: (sub[3], str(sub))):
        if session is not None and (session, protocol) in internal:
            continue
        candidates = [found for found in (
            first_after(leaves.get((session, protocol, topic)), start), first_after(logouts.get((session, protocol)), start),
        ) if found is not None]
        end = min(candidates) if candidates else FAR_FUTURE_US
        result.append({"session": session, "protocol": protocol, "topic": topic, "start": start, "end": end})
    return result


class _Cumulative:
    """Running sums of (messages, bytes) per group and hour, to count the hours before one."""

    def __init__(self, table: Any, keys: Sequence[str]) -> None:
        self.groups: dict[tuple[Any, ...], tuple[list[int], Any, Any]] = {}
        table = sort_by(table, [*[(k, "ascending") for k in keys], ("hour_index", "ascending")])
        if not len(table):
            return
        starts = np.flatnonzero(run_starts(table, keys)).tolist() + [len(table)]
        hours = table.column("hour_index").to_numpy()
        n, nb = table.column("n").to_numpy(), table.column("nb").to_numpy()
        firsts = table.take(starts[:-1]).select(list(keys)).to_pylist()
        for first, start, stop in zip(firsts, starts[:-1], starts[1:]):
            self.groups[tuple(first[k] for k in keys)] = (
                hours[start:stop].tolist(), np.concatenate(([0], np.cumsum(n[start:stop]))),
                np.concatenate(([0], np.cumsum(nb[start:stop]))),
            )

    def before(self, key: tuple[Any, ...], hour: int) -> tuple[int, int]:
        """The sums of the group's hours before ``hour``."""
        found = self.groups.get(key)
        if found is None:
            return 0, 0
        hours, n, nb = found
        index = bisect.bisect_left(hours, hour)
        return int(n[index]), int(nb[index])


def routed(s: Summaries, intervals: list[dict[str, Any]]) -> dict[tuple[int, str], list[int]]:
    """Per (subscription index, publishing protocol), [messages, bytes]
    of the multicast messages accepted on its topic in [start, end), its session's own
    excluded: at each endpoint, the whole hours before its hour (``publishing``) plus the
    part of its hour before it (``before_topic``, ``before_own``)."""
    publishing = s["publishing"]
    multicast = publishing.filter(pc.and_(pc.fill_null(pc.equal(publishing.column("message"), "multicast"), False),
                                          pc.is_valid(publishing.column("topic"))))
    hourly = group(multicast, ["topic", "protocol", "hour_index"], HOURLY)
    protocols: dict[str, list[str]] = {}
    for topic, protocol in set(zip(hourly.column("topic").to_pylist(), hourly.column("protocol").to_pylist())):
        protocols.setdefault(topic, []).append(protocol)
    by_topic = _Cumulative(hourly, ["topic", "protocol"])
    owners = {(i["session"], i["protocol"], i["topic"]) for i in intervals}
    own = multicast.filter(is_in(multicast.column("session"), sorted({o[0] for o in owners if o[0] is not None})))
    own = _Cumulative(group(own, ["session", "protocol", "topic", "hour_index"], HOURLY),
                      ["session", "protocol", "topic"])
    instants = pa.array(sorted({i[edge] for i in intervals for edge in ("start", "end")}), pa.int64())
    before_topic: dict[tuple[int, str], list[tuple[str, int, int]]] = {}
    table = s["before_topic"].filter(pc.is_in(s["before_topic"].column("at"), value_set=instants))
    for at, topic, publishing_protocol, n, nb in zip(*[table.column(c).to_pylist() for c in ("at", "topic", "publishing", "n", "nb")]):
        before_topic.setdefault((at, topic), []).append((publishing_protocol, n, nb))
    before_own: dict[tuple[Any, ...], list[int]] = {}
    table = s["before_own"].filter(pc.is_in(s["before_own"].column("at"), value_set=instants))
    for row in zip(*[table.column(c).to_pylist() for c in ("at", "session", "protocol", "topic", "n", "nb")]):
        _add(before_own, row[:4], row[4], row[5])
    result: dict[tuple[int, str], list[int]] = {}

    for index, interval in enumerate(intervals):
        session, protocol = interval["session"], interval["protocol"]
        for topic in _reached(interval, protocols):
            for edge, sign in (("start", -1), ("end", 1)):
                at = interval[edge]
                hour = at // HOUR_US
                for publishing_protocol in protocols.get(topic, []):
                    n, nb = by_topic.before((topic, publishing_protocol), hour)
                    _add(result, (index, publishing_protocol), sign * n, sign * nb)
                for publishing_protocol, n, nb in before_topic.get((at, topic), []):
                    _add(result, (index, publishing_protocol), sign * n, sign * nb)
                if session is None:
                    continue
                key = (session, protocol, topic)
                if key in own.groups:
                    n, nb = own.before(key, hour)
                    _add(result, (index, protocol), -sign * n, -sign * nb)
                if (at, *key) in before_own:
                    n, nb = before_own[(at, *key)]
                    _add(result, (index, protocol), -sign * n, -sign * nb)
    return result


def _reached(interval: dict[str, Any], published: dict[str, Any]) -> list[str]:
    """The topics a subscription's messages come from: its topic, or for an MQTT filter
    (``#``, ``sensors/+``) every topic with multicast messages that the filter matches."""
    topic = interval["topic"]
    if topic is None:
        return []
    if not is_filter(interval["protocol"], topic):
        return [topic]
    return [name for name in published if filter_matches(topic, name)]


def routes_of(s: Summaries) -> tuple[list[dict[str, Any]], dict[tuple[int, str], list[int]]]:
    intervals = subscriptions(s)
    return intervals, routed(s, intervals)


def top_subscribers(s: Summaries, top: int = 100, routing: Any = None) -> Any:
    """Per session, the messages routed to its subscriptions plus
    the ``delivered`` events naming it; the broker's own sessions left out.  A null session
    matches nothing (as in a join): its subscriptions make one row per protocol and its
    deliveries another."""
    intervals, routed_by = routing or routes_of(s)
    found: dict[tuple[Any, ...], list[Any]] = {}  # row key -> [messages, bytes, topics]

    def add(session: Any, protocol: Any, source: str, n: int, nb: int, topic: Any = None) -> None:
        row = found.setdefault((session, protocol) if session is not None else (None, protocol, source), [0, 0, set()])
        row[0] += n
        row[1] += nb
        if topic is not None:
            row[2].add(topic)

    for interval in intervals:  # first: a row for every subscriber, in this order
        add(interval["session"], interval["protocol"], "subscribed", 0, 0, interval["topic"])
    for (index, _publishing), (n, nb) in routed_by.items():
        add(intervals[index]["session"], intervals[index]["protocol"], "subscribed", n, nb)
    delivered = group(s["delivered"], ["session", "protocol"], sums("n", "bytes"))
    for session, protocol, n, nb in zip(*[delivered.column(c).to_pylist() for c in ("session", "protocol", "n", "bytes")]):
        add(session, protocol, "delivered", n, nb)
    internal = internal_sessions(s)
    kept = [(key, row) for key, row in found.items() if key[0] is None or key[:2] not in internal]
    frame = pa.table({
        "session": strings(k[0] for k, _r in kept), "protocol": strings(k[1] for k, _r in kept),
        "messages": longs(r[0] for _k, r in kept), "bytes": longs(r[1] for _k, r in kept),
        "topics": longs(len(r[2]) for _k, r in kept),
    })
    return conform(ranked(frame, RANKING, top), "top_subscribers")


def cross_protocol(s: Summaries, top: int = 0, routing: Any = None) -> Any:
    """Publishing x receiving protocol, copies routed (> 0)."""
    intervals, routed_by = routing or routes_of(s)
    pairs: dict[tuple[str, str], list[int]] = {}
    for (index, publishing), (n, nb) in routed_by.items():
        _add(pairs, (publishing, intervals[index]["protocol"]), n, nb)
    found = sorted((key, value) for key, value in pairs.items() if value[0] > 0)
    return conform(pa.table({
        "publishing": strings(k[0] for k, _v in found), "receiving": strings(k[1] for k, _v in found),
        "messages": longs(v[0] for _k, v in found), "bytes": longs(v[1] for _k, v in found),
    }), "cross_protocol")
