"""The stored form of a Message (brokerd.core.stored): the header of a message without
Details is put together without the json encoder, and must be the very bytes the encoder
writes, so every node and every database reads it as before."""
from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from brokerd.core import stored
from brokerd.core.message import BROADCAST, MULTICAST, PLAIN, UNICAST, Details, Message

names = st.binary(max_size=24)
times = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False), st.integers(-2**40, 2**40))


def generic(message: Message, message_id, created, expires) -> bytes:
    """encode_stamped's generic path: the message with Details equal to PLAIN, not PLAIN."""
    copy = Message(message.kind, message.target, message.payload, message.protocol, message.sender_name,
                   message.binary, display_name=message.display_name, details=Details())
    assert copy.details is not PLAIN
    return stored.encode_stamped(copy, message_id, created, expires)


@given(kind=st.sampled_from([MULTICAST, UNICAST, BROADCAST]), target=names, payload=st.binary(max_size=64),
       protocol=st.text(max_size=8), sender=names, display=st.one_of(st.none(), names), binary=st.booleans(),
       message_id=st.one_of(st.none(), st.text(max_size=40)), created=times, expires=times)
def test_a_plain_message_is_stored_as_the_json_encoder_writes_it(kind, target, payload, protocol, sender, display,
                                                                 binary, message_id, created, expires):
    message = Message(kind, target, payload, protocol, sender, binary, display_name=display)
    fast = stored.encode_stamped(message, message_id, created, expires)
    assert fast == generic(message, message_id, created, expires)
    back = stored.decode(fast)
    assert (back.target, back.payload, back.sender_name, back.display_name, back.binary) == (
        target, payload, sender, display, binary)
    assert (back.message_id, back.created, back.expires) == (message_id, created, expires)


def test_values_json_would_write_otherwise_take_the_generic_path():
    """Infinity or an integer flag is written by the json encoder (as
    before), never by the plain header."""
    message = Message(MULTICAST, b"news", b"hi", "ssmp", b"sam", False)
    for created, expires in ((math.inf, None), (1.5, -math.inf)):
        data = stored.encode_stamped(message, "id", created, expires)
        assert data == generic(message, "id", created, expires)
    for created in (0.0, -0.0, 5.0, 5):
        assert stored.encode_stamped(message, "id", created, None) == generic(message, "id", created, None)
    odd = Message(MULTICAST, b"news", b"hi", "ssmp", b"sam", 1)  # type: ignore[arg-type]
    data = stored.encode_stamped(odd, "id", 1.0, None)
    header = json.loads(data[len(stored.TAG) + 4:-2])
    assert header["b"] == 1 and stored.decode(data).binary is True


def test_sections_or_message_reads_the_header_once_for_either_kind():
    plain = stored.encode_stamped(Message(MULTICAST, b"news", b"hi", "ssmp", b"sam", False), "id", 1.0, None)
    found = stored.sections_or_message(plain)
    assert isinstance(found, Message) and found.payload == b"hi" and stored.sections(plain) is None
    rich = stored.encode(Message(MULTICAST, b"news", b"hi", "smqp", b"a:1", False,
                                 details=Details(attributes=(("Subject", "s"),))))
    assert stored.sections_or_message(rich) == stored.sections(rich) == ((("Subject", "s"),), [])
