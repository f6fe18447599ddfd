"""The cluster engine's figures (brokerd.cluster.redis_engine counts them, its shards too)."""
from __future__ import annotations


class ClusterStats:
    """The engine's figures, plain ints on the hot path (the metrics collector reads them)."""

    __slots__ = ("connected", "outages", "envelopes_sent", "messages_sent", "envelopes_received",
                 "envelopes_decoded", "messages_received", "dropped_unreachable", "dropped_backlog", "bad_envelopes",
                 "shards", "redirects")
    connected: int
    outages: int
    envelopes_sent: int
    messages_sent: int
    envelopes_received: int
    envelopes_decoded: int
    messages_received: int
    dropped_unreachable: int
    dropped_backlog: int
    bad_envelopes: int
    shards: int
    redirects: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}
