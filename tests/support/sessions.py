"""A stand-in for a front end's session in tests that drive the Broker directly."""
from __future__ import annotations

from typing import Any

from zope.interface import implementer

from brokerd.core.principal import NOBODY
from brokerd.interfaces import ISubscriber


@implementer(ISubscriber)
class RecordingSession:
    """A session of ``wire``'s protocol, addressable by its name, anonymous, that keeps every
    write the broker hands it in ``received``."""

    def __init__(self, name: bytes, wire: Any) -> None:
        self.protocol = wire.protocol
        self.name = self.address = name
        self.wire_format = wire
        self.principal = NOBODY
        self.received: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.received.append(data)

    def replaced(self) -> None:
        pass
