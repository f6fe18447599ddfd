"""The pure parts of SMQP messaging: header checks, identifiers, stored bodies, id ranges,
the subscription index, and decode_body as the inverse of encode_body (hypothesis)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokerd.core import stored
from brokerd.core.message import MULTICAST, Details, Message
from brokerd.protocols.smqp.codec import decode_body, encode_body
from brokerd.protocols.smqp.mapping import stored_body as row_body, to_body, to_message
from brokerd.protocols.smqp.events import Body, Section
from brokerd.protocols.smqp.messages import (
    ABSENT,
    first_text,
    read_publication,
    receipt_body,
    smuid_number,
    stored_body,
)
from brokerd.protocols.smqp.queue_commands import format_ranges, parse_ids
from brokerd.core.subscriptions import SubscriptionIndex, split_topic, stored_topic
from brokerd.store.records import SubscriptionRecord

CREATED = ("Created", "D20010815T08341245Z")


def body(*attributes, sections=()) -> Body:
    return Body((CREATED, *attributes), tuple(sections))


def test_publication_defaults_and_values():
    p = read_publication(body())
    assert (p.priority, p.timeout, p.receipt, p.guarantee, p.delivery) == (1, ABSENT, "NONE", True, "ALL")
    p = read_publication(body(("Pri", "10"), ("Timeout", "INF"), ("Receipt", "yes"), ("Guar", "no"),
                              ("Delivery", "one"), ("Depth", "-1"), ("Seq", "34"), ("MIME-Version", "1.0"),
                              ("Smuid", "h/1"), ("Cmuid", "a:b@h/1"), ("X-Any", "thing")))
    assert (p.priority, p.timeout, p.receipt, p.guarantee, p.delivery) == (10, None, "ONE", False, "ONE")
    assert p.smuids == ("h/1",) and p.cmuids == ("a:b@h/1",)
    assert read_publication(body(("Timeout", "00:01:00"))).timeout == 60.0


@pytest.mark.parametrize("attribute", [
    ("Priority", "0"), ("Priority", "x"), ("Receipt", "SOME"), ("Reply", "maybe"), ("Timeout", "1:99:00"),
    ("Depth", "-2"), ("Sequence", "0"), ("Guarantee", "1"), ("Delivery", "NONE"), ("MIME-Version", "one"),
    ("Name", "n" * 129), ("Created", "yesterday"),
])
def test_bad_header_values(attribute):
    with pytest.raises(ValueError):
        read_publication(body(attribute))


def test_created_is_required_and_sections_are_checked():
    with pytest.raises(ValueError, match="Created"):
        read_publication(Body())
    with pytest.raises(ValueError, match="Content-Type"):
        read_publication(body(sections=[Section((("Content-Type", "plain"),), b"x")]))
    with pytest.raises(ValueError, match="Content-Encryption"):
        read_publication(body(sections=[Section((("Content-Type", "a/b"), ("Content-Encryption", "PGP")), b"")]))


def test_identifiers_and_ranges():
    assert smuid_number("www.host.com/8342156-1835") is None
    assert smuid_number("host/abc/1835(D2002)") == 1835 and smuid_number("1865") == 1865
    assert parse_ids("*") is None and parse_ids("1865") == [1865] and parse_ids("h/x/7(D1)") == [7]
    assert parse_ids("1845-1847,1905") == [1845, 1846, 1847, 1905]
    for bad in ("a-b", "5-3", "1-999999", ","):
        with pytest.raises(ValueError):
            parse_ids(bad)
    assert format_ranges([1812, 1809, 1810, 1811, 1845, 1850, 1851]) == "1809-1812,1845,1850-1851"
    assert format_ranges([]) == ""


def test_stored_body_order_and_history():
    original = Body((("Name", "n"), CREATED, ("Smuid", "old/1"), ("Cmuid", "x:y@h/A1"), ("X-K", "v")),
                    (Section((("Content-Type", "text/plain"),), b"d"),))
    new = stored_body(original, "me/2", "a:b@h/B(D)", history=True)
    assert [k for k, _v in new.attributes] == ["Created", "Smuid", "Smuid", "Cmuid", "Cmuid", "Name", "X-K"]
    assert new.get_all("Smuid") == ["old/1", "me/2"]
    plain = stored_body(original, "me/2", "a:b@h/B(D)", history=False)
    assert plain.get_all("Smuid") == ["me/2"] and plain.sections == original.sections
    receipt = receipt_body(new, 4, 6, "/t", "D1")
    assert receipt.get("Receipt") == "4/6" and receipt.get("Topic") == "/t" and receipt.sections == ()


def test_first_text_for_other_protocols():
    text = Section((("Content-Type", "text/html"),), b"<b>")
    binary = Section((("Content-Type", "image/gif"),), b"\x00" * 10)
    big = Section((("Content-Type", "image/gif"),), b"\x00" * 2000)
    assert first_text(Body((), (binary, text))) == (b"<b>", False)
    assert first_text(Body((), (binary,))) == (b"\x00" * 10, True)
    assert first_text(Body((), (big,))) is None and first_text(Body()) is None


def test_subscription_index_matching():
    index = SubscriptionIndex()
    index.add(SubscriptionRecord("a:1", "MESSAGE", "stocks/quotes/ibm", ("ADD",)))
    index.add(SubscriptionRecord("b:1", "MESSAGE", stored_topic("stocks", "ib*"), ("ADD",)))
    index.add(SubscriptionRecord("c:1", "TOPIC", stored_topic("stocks", "*"), ("ADD",)))
    index.add(SubscriptionRecord("d:1", "TOPIC", stored_topic("", "*"), ("ADD",)))
    assert split_topic("/*") == ("", "*") and split_topic("a/b") == ("a/b", None)
    assert sorted(s.subscriber for s in index.matching("MESSAGE", "stocks/quotes/ibm")) == ["a:1", "b:1"]
    assert [s.subscriber for s in index.matching("MESSAGE", "stocks/ibm")] == ["b:1"]
    assert index.matching("MESSAGE", "stocks") == []
    assert sorted(s.subscriber for s in index.matching("TOPIC", "stocks")) == ["c:1", "d:1"]
    assert index.exact_count("stocks/quotes/ibm") == 1
    index.add(SubscriptionRecord("a:1", "MESSAGE", "stocks/quotes/xyz", ("ADD",)))
    assert index.exact_subscribers(["stocks/quotes/ibm", "stocks/quotes/xyz", "stocks"]) == {"a:1"}
    assert index.remove("a:1", "MESSAGE", "stocks/quotes/xyz") is not None
    assert index.remove("a:1", "MESSAGE", "stocks/quotes/ibm") is not None
    assert index.exact_count("stocks/quotes/ibm") == 0 and index.of("a:1") == []
    assert index.account_channels("b") == {"b:1"}


_text = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF).filter(str.isprintable).filter(lambda c: c.strip() == c),
                min_size=1, max_size=20)
_names = st.from_regex(r"X-[A-Za-z][A-Za-z0-9-]{0,10}", fullmatch=True)


@given(st.lists(st.tuples(_names, _text), max_size=5),
       st.lists(st.tuples(st.sampled_from(["text/plain", "image/gif"]), st.binary(max_size=200)), max_size=4))
def test_decode_body_inverts_encode_body(attributes, sections):
    original = Body(tuple(attributes), tuple(
        Section((("Content-Type", kind), ("Content-Length", str(len(data)))), data) for kind, data in sections))
    assert decode_body(encode_body(original)) == original


@given(st.binary(max_size=300))
def test_decode_body_of_any_bytes_is_a_body_or_value_error(data):
    try:
        decoded = decode_body(data)
    except ValueError:
        return
    assert isinstance(decoded, Body)


@given(st.lists(st.tuples(_names, _text), max_size=5),
       st.lists(st.tuples(st.sampled_from(["text/plain", "image/gif"]), st.binary(max_size=200)), max_size=4),
       st.sampled_from(["smqp", "ssmp"]))
def test_a_stored_row_renders_as_its_whole_message_does(attributes, sections, protocol):
    """stored_body reads only the attributes and parts of a stored message that has them:
    the same Body as rendering the decoded Message (to_body), for every shape of message,
    and the whole Message for one that has neither."""
    body = Body(tuple(attributes), tuple(
        Section((("Content-Type", kind), ("Content-Length", str(len(data)))), data) for kind, data in sections))
    message = to_message(body, "news", "alice:1", message_id="srv/1/5(D20010815T08341245Z)", created=5.0,
                         priority=2, expires=None, principal=None)
    message = Message(MULTICAST, message.target, message.payload, protocol, message.sender_name, message.binary,
                      details=message.details)
    data = stored.encode(message)
    assert row_body(data, "example.org") == to_body(stored.decode(data), "example.org")
    assert encode_body(row_body(data, "example.org")) == encode_body(to_body(stored.decode(data), "example.org"))


def test_a_corrupt_stored_row_is_a_value_error_for_the_renderer_too():
    data = stored.encode(Message(MULTICAST, b"news", b"hi", "ssmp", b"sam", False,
                                 details=Details(attributes=(("Created", "D1"),))))
    for bad in (data[:-1], data + b"x", stored.TAG + b"\x00\x00\x00\x02{}",
                data.replace(b'"a":[["Created","D1"]]', b'"a":5'),
                data.replace(b'"a":[["Created","D1"]]', b'"z":[["Created","D1"]]')):
        with pytest.raises(ValueError):
            row_body(bad, "example.org")
