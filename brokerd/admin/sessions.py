"""The sessions and topics the admin API lists, and closing one session.

Sessions are named by an id only this process gives (the object's id in hex): it survives
as long as the session and is never reused while the session lives.
"""
from __future__ import annotations

from typing import Any

import json
import math

from brokerd.core.broker import Broker
from brokerd.core.keepout import MAX_SECONDS
from brokerd.core.principal import ANONYMOUS, SERVICE
from brokerd.events.log import transport_source
from brokerd.events.schema import text as _text
from brokerd.interfaces import ISubscriber
from brokerd.twistedio import queued_bytes


def session_id(session: ISubscriber) -> str:
    return format(id(session), "x")


def describe_session(broker: Broker, session: ISubscriber) -> dict[str, Any]:
    transport = getattr(session, "transport", None)
    principal = getattr(session, "principal", None)
    return {
        "id": session_id(session),
        "protocol": session.protocol,
        "name": _text(session.name),
        "principal": None if principal is None else _text(getattr(principal, "name", principal)),
        "address": _text(session.address),
        "source": transport_source(transport),
        "subscriptions": sorted(_text(topic) or "" for topic in broker.subscriptions(session)),
        "queued_bytes": queued_bytes(transport),
        "dropped": getattr(session, "dropped", 0),
    }


def list_sessions(broker: Broker) -> list[dict[str, Any]]:
    described = [describe_session(broker, session) for session in broker.sessions()]
    return sorted(described, key=lambda s: (s["protocol"], s["name"] or "", s["id"]))


def list_topics(broker: Broker) -> list[dict[str, Any]]:
    topics = []
    for name in broker.active_topics():
        topic = broker.topics.get(name)
        if topic is None:
            continue
        by_protocol: dict[str, int] = {}
        for member in topic.members:
            by_protocol[member.protocol] = by_protocol.get(member.protocol, 0) + 1
        topics.append({"name": _text(name), "subscribers": len(topic.members), "by_protocol": by_protocol})
    return sorted(topics, key=lambda t: (-t["subscribers"], t["name"]))


def find_session(broker: Broker, wanted: str) -> ISubscriber | None:
    for session in broker.sessions():
        if session_id(session) == wanted:
            return session
    return None


def close_session(session: ISubscriber) -> bool:
    """Close a session's connection (its queued output is written first); False when the
    session has no connection of its own (a broker-internal one)."""
    close = getattr(session, "close_transport", None)
    if close is not None:
        close()
        return True
    transport = getattr(session, "transport", None)
    if transport is None:
        return False
    transport.loseConnection()
    return True


MAX_CLOSE_BODY = 1024
"""Bytes of a close request's JSON body read at most."""
UNNAMED_REALMS = frozenset({ANONYMOUS, SERVICE})
"""Realms whose principal names nobody in particular: keeping it out would keep out everyone."""


def keep_out_seconds(body: bytes) -> float:
    """The ``for`` of a close request's body (``{}`` or ``{"for": SECONDS}``): 0 for none;
    ValueError, with the reason, for anything else."""
    if len(body) > MAX_CLOSE_BODY:
        raise ValueError(f"the body is over {MAX_CLOSE_BODY} bytes")
    if not body.strip():
        return 0.0
    try:
        given = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # arrays nested past Python's stack
        raise ValueError("the body is not JSON") from None
    if not isinstance(given, dict) or set(given) - {"for"}:
        raise ValueError('the body is {} or {"for": SECONDS}')
    seconds = given.get("for", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or not 0 <= seconds <= MAX_SECONDS:
        raise ValueError(f'"for" is a number of seconds from 0 to {MAX_SECONDS}')
    return float(seconds)
