"""A receipt SMQP could not store (the local one a subscriber's acknowledgement made due, or
the one another domain's server sent over a link) is logged as the failure it is: its text
and its traceback, not an event nobody can read."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from twisted.internet.defer import fail
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from brokerd.protocols.smqp.delivery import MessageService
from brokerd.protocols.smqp.events import Body
from brokerd.protocols.smqp.links import Link, LinkSpec
from brokerd.store.records import ReceiptDue


def failing_service() -> MessageService:
    """A MessageService whose store fails every publication with a bug (a RuntimeError)."""
    durable = SimpleNamespace(clock=Clock(), index=None, sessions={}, server_id="node", next_seq=lambda: 7,
                              topics=SimpleNamespace(timeout_for=lambda key: None))
    service = MessageService(durable, broker=None, wire=None, display=lambda key: "/" + key)  # type: ignore[arg-type]
    service.publish = lambda *args, **kwargs: fail(RuntimeError("a bug in the store"))  # type: ignore[method-assign]
    return service


def the_failure(events: list[dict[str, Any]]) -> dict[str, Any]:
    [event] = events
    assert event["log_level"] == LogLevel.critical and event["log_failure"].check(RuntimeError)
    return event


def test_a_local_receipt_that_cannot_be_stored_is_logged_with_its_traceback() -> None:
    service = failing_service()
    with capturedLogs() as events:
        service.send_receipt(ReceiptDue(3, "news", "alice:c1", "c-1", b"", 1, 1))
    event = the_failure(events)
    assert event["log_format"] == "Storing a receipt for {p}" and event["p"] == "alice:c1"


def test_a_receipt_from_another_domain_that_cannot_be_stored_is_logged_with_its_traceback() -> None:
    factory = SimpleNamespace(service=failing_service(), clock=Clock())
    link = Link(factory, LinkSpec("example.org", "tcp:example.org:2510"), "link", None)
    link.receipts["remote-7"] = ("alice:c1", "node/3", "news")
    with capturedLogs() as events:
        link._receipt(Body((("Smuid", "remote-7"), ("Topic", "/example.org/news")), ()))
    event = the_failure(events)
    assert event["log_format"] == "Storing a receipt from {domain}" and event["domain"] == "example.org"
