"""The broker's counters: what the router bumps on every delivery and an operator (the
admin listener's figures, the metrics) and the tests read.  A module of its own so that the
router, the broker and the cluster's paths name one type."""
from __future__ import annotations

from collections import defaultdict

from brokerd.interfaces import IWireFormat


def _counts() -> defaultdict[IWireFormat, int]:
    return defaultdict(int)


class BrokerStats:
    """Counters an operator (and the tests) can read; plain ints, cheap to bump."""

    __slots__ = (
        "published",
        "delivered",
        "unrenderable",
        "slow_consumer_drops",
        "connections",
        "refused_connections",
        "accepted_by",
        "routed_by",
    )

    def __init__(self) -> None:
        self.published = 0
        self.delivered = 0
        self.unrenderable = 0
        self.slow_consumer_drops = 0
        self.connections = 0
        self.refused_connections = 0
        self.accepted_by: defaultdict[str, int] = defaultdict(int)
        """Messages accepted, by the sending session's protocol."""
        self.routed_by: defaultdict[str, defaultdict[IWireFormat, int]] = defaultdict(_counts)
        """Deliveries by sending protocol, then by the recipients' wire format: one bump per
        wire format of a fan-out, not per recipient (keyed by the format object, whose
        ``protocol`` names the receiving protocol, because hashing it costs nothing)."""

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__ if not name.endswith("_by")}
