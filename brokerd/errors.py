"""Errors shared across brokerd's layers.

Protocol codecs raise their own subclasses of :class:`ProtocolError`; each carries the reply the
peer deserves, so the thin Protocol classes only have to write it and close.
"""
from __future__ import annotations


class BrokerError(Exception):
    """Base class of every error brokerd raises on purpose."""


class ProtocolError(BrokerError):
    """The peer broke the wire grammar; ``reply`` (bytes or None) is what the spec says to answer."""

    reply: bytes | None = None

    def __init__(self, message: str, reply: bytes | None = None) -> None:
        super().__init__(message)
        if reply is not None:
            self.reply = reply


class AlreadySubscribed(BrokerError):
    """The session is already subscribed to that topic."""


class NotSubscribed(BrokerError):
    """The session is not subscribed to that topic."""


class SubscriptionLimit(BrokerError):
    """The session has reached the configured number of subscriptions."""


INSTALL_CLUSTER = "pip install '.[cluster]' in brokerd's checkout"
"""How to install the ``cluster`` extra, as README.md installs brokerd (``pip install .``); the
one hint every "needs the cluster extra" error gives."""


class ConfigurationError(BrokerError):
    """The broker's settings are unusable (bad file, bad value, unreadable certificate...)."""


class Busy(BrokerError):
    """Too much blocking work (password checks, OpenPGP) is already waiting: refused now, so a
    flood is turned away at once instead of queued; the client may try again later."""


class Forbidden(BrokerError):
    """The access policy does not let the session's principal do that on that topic."""
