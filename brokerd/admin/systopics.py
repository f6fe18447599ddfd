"""Statistics topics, in the manner of Mosquitto's ``$SYS``: every figure of
:meth:`Figures.snapshot` published every ``--sys-interval`` seconds under ``~sys/brokerd/``,
so a client of any protocol can watch the broker with the tools it already has (an MQTT client
subscribes to ``~sys/brokerd/#``).

The tree starts with ``~`` because SSMP topics are ID characters only (``$`` is not one);
MCCHAT and socket.mq take the same names, SMQP topics live in its own tree and cannot name
them.  A figure is published only while it has a subscriber (a topic's member, or a filter
that matches it: :meth:`Broker.watched`), so an unwatched broker pays a lookup or two per
figure per interval.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from brokerd.admin.figures import Figures
from brokerd.core.message import MULTICAST, Message
from brokerd.core.principal import BROKER
from brokerd.core.publication import Multicast
from brokerd.store.base import log_unless_outage

_log = Logger(namespace="brokerd.admin")
"""Module-level, as brokerd.admin.oplog's is (why: there)."""

PREFIX = "~sys/brokerd"
PROTOCOL = "sys"
"""The sending protocol the statistics messages carry (SSMP shows the sender as ``sys:brokerd``)."""
SENDER = b"brokerd"


def leaves(figures: dict[str, Any], path: str = PREFIX) -> Iterator[tuple[str, Any]]:
    """``(topic, value)`` for every number and string in ``figures`` (nested dictionaries
    become topic levels; lists are left out)."""
    for key, value in figures.items():
        topic = f"{path}/{key}"
        if isinstance(value, dict):
            yield from leaves(value, topic)
        elif isinstance(value, bool):
            yield topic, int(value)
        elif isinstance(value, (int, float, str)):
            yield topic, value


class StatisticsTopics(Service):
    """Publishes the figures every ``interval`` seconds while running."""


    def __init__(self, figures: Figures, interval: float, clock: IReactorTime) -> None:
        self.setName("sys-topics")  # Twisted's Service declares ``name = None`` untyped
        self.figures = figures
        self.interval = interval
        self.clock = clock
        self._loop: LoopingCall | None = None

    def startService(self) -> None:
        super().startService()
        self._loop = LoopingCall(self.publish)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=False).addErrback(
            lambda failure: _log.failure("$SYS-style statistics stopped", failure))

    def stopService(self) -> None:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def publish(self) -> Deferred[int]:
        """Publish the watched figures now: the store's queue figures are asked first."""
        return self.figures.queues().addCallback(self._publish)

    def _publish(self, queues: dict[str, Any] | None) -> int:
        snapshot = self.figures.snapshot()
        if queues is not None:
            snapshot["smqp_queues"] = queues
        broker = self.figures.broker
        sent = 0
        for topic, value in leaves(snapshot):
            name = topic.encode("utf-8")
            if not broker.watched(name):
                continue
            message = Message(MULTICAST, name, str(value).encode("utf-8"), PROTOCOL, SENDER, principal=BROKER)
            publication = Multicast([message])
            broker.route(publication)  # a stored MQTT session's subscription takes it from the store
            if publication.kept is not None:
                publication.kept.addErrback(log_unless_outage, _log, "Storing a statistics message")
            sent += 1
        return sent
