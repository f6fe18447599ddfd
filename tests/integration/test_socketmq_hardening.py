"""socket.mq under attack, on real sockets: each test plays one attack against a live broker
and checks the documented answer (a result, a close code, an HTTP status) while an innocent
client on another connection keeps being served."""
from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.logger import globalLogPublisher

from brokerd.protocols.socketmq.api import Client
from tests.integration.test_socketmq_pubsub import raw_ws
from tests.protocols.socketmq.support import LiveBrokerd, Waiter


@pytest.fixture
def brokerd(tmp_path: Any) -> Any:
    broker = LiveBrokerd(tmp_path)
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.start()))
    yield broker
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.stop()))


@pytest.fixture
def failures() -> Any:
    """Every logged failure (a traceback in the broker's log) while the test runs."""
    seen: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_failure") is not None:
            seen.append(event)

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


async def innocent_subscriber(brokerd: LiveBrokerd, event: str) -> Waiter:
    """A well-behaved WebSocket client subscribed to ``event``; its Waiter collects events."""
    client = brokerd.track(Client(brokerd.url))
    await client.connect()
    events = Waiter()
    await client.subscribe(event, events)
    return events


async def innocent_is_served(brokerd: LiveBrokerd, events: Waiter, event: str, text: bytes) -> None:
    """An SSMP publish reaches the innocent subscriber."""
    sam = await brokerd.ssmp(b"sam")
    sam.send(b"MCAST " + event.encode() + b" " + text)
    await events.until(lambda items: any(item.data == text for item in items))


# ---------------------------------------------------------------------- lone surrogates


def results(ws: Any) -> list[dict[str, Any]]:
    return [json.loads(payload) for payload, _binary in ws.messages.items[1:]]


@pytest.mark.parametrize(
    "auth",
    [
        {"method": "secret", "identity": "\ud800", "secret": "s"},
        {"method": "secret", "identity": "app", "secret": "\udfff"},
        {"method": "open", "identity": "a\ud800b"},
    ],
)
@pytest_twisted.ensureDeferred
async def test_lone_surrogate_in_auth_is_a_400_result(brokerd: LiveBrokerd, failures: list, auth: dict) -> None:
    innocent = await innocent_subscriber(brokerd, "calm")
    ws = await raw_ws(brokerd)
    ws.sendMessage(json.dumps({"type": "auth", "id": 1, **auth}).encode())  # ensure_ascii: \ud800 escapes
    ws.sendMessage(json.dumps({"type": "subscribe", "id": 2, "event": "after"}).encode())
    await ws.messages.count(3)
    first, second = results(ws)
    assert (first["id"], first["status"]) == (1, 400)
    assert "not valid Unicode" in first["reason"]
    assert (second["id"], second["status"]) == (2, 200)  # the connection stays usable
    await innocent_is_served(brokerd, innocent, "calm", b"still here")
    assert failures == []


@pytest_twisted.ensureDeferred
async def test_lone_surrogate_as_request_id_is_a_400_result_with_null_id(brokerd: LiveBrokerd, failures: list) -> None:
    ws = await raw_ws(brokerd)
    ws.sendMessage(json.dumps({"type": "subscribe", "id": "x\ud800", "event": "hijack"}).encode())
    ws.sendMessage(json.dumps({"type": "subscribe", "id": 2, "event": "allowed"}).encode())
    await ws.messages.count(3)
    refused, accepted = results(ws)
    assert refused["id"] is None and refused["status"] == 400 and "id must be" in refused["reason"]
    assert (accepted["id"], accepted["status"]) == (2, 200)
    (session,) = brokerd.broker.sessions()
    assert brokerd.broker.is_subscribed(session, b"allowed")
    assert not brokerd.broker.is_subscribed(session, b"hijack")  # refused requests change nothing
    assert failures == []
