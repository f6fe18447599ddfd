"""The protocol-neutral message the core routes.

A Message is created once by the front end that accepted it and then only read: each wire
format renders it (once per format) for its recipients.  It uses ``__slots__`` because one is
made for every publish on the hot path.
"""
from __future__ import annotations

from typing import Any

from brokerd.core.principal import Principal

MULTICAST = "multicast"
"""Sent to a topic; ``target`` is the topic name."""
UNICAST = "unicast"
"""Sent to one session; ``target`` is its address."""
BROADCAST = "broadcast"
"""Sent to every session sharing a topic with the sender; ``target`` is None."""


class Message:
    """One message on its way through the broker.

    ``payload`` is the content, never a wire encoding of it (an SSMP binary payload arrives
    here without its two length bytes).  ``binary`` records that the sender marked the content
    as binary; a renderer may still need to choose a binary form for text it cannot carry.
    ``headers`` holds protocol attributes a richer protocol wants to carry across (SMQP).
    ``principal`` is who sent it (the access policy checks it); None for the broker itself
    and programs embedding it.
    """

    __slots__ = ("kind", "target", "payload", "binary", "protocol", "sender_name", "headers", "principal")

    def __init__(
        self,
        kind: str,
        target: bytes | None,
        payload: bytes,
        protocol: str,
        sender_name: bytes,
        binary: bool = False,
        headers: dict[str, Any] | None = None,
        principal: Principal | None = None,
    ) -> None:
        self.kind = kind
        self.target = target
        self.payload = payload
        self.binary = binary
        self.protocol = protocol
        self.sender_name = sender_name
        self.headers = headers
        self.principal = principal

    def __repr__(self) -> str:
        return (
            f"<Message {self.kind} to {self.target!r} from {self.protocol}:{self.sender_name!r} "
            f"{len(self.payload)} bytes>"
        )
