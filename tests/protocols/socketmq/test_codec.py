"""The socket.mq message codec: examples, round trips of every message, framing, and
hypothesis: any bytes in a text or binary message decode to a message or raise our
FrameError/InvalidMessage, nothing else."""
from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.errors import ProtocolError
from brokerd.protocols.socketmq.codec import (
    FrameError,
    InvalidMessage,
    decode_client,
    decode_server,
    encode,
    frame,
    is_application_name,
    is_event_name,
)
from brokerd.protocols.socketmq.events import (
    Auth,
    Dropped,
    Event,
    Hello,
    Publish,
    Register,
    Request,
    Respond,
    Result,
    Subscribe,
    Unregister,
    Unsubscribe,
)
from tests.support.examples import examples

ids = st.one_of(st.none(), st.integers(-(2**53), 2**53), st.text(min_size=1, max_size=64))
events = st.text(min_size=1, max_size=60).filter(is_event_name)
applications = st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True).filter(is_application_name)
payloads = st.binary(max_size=300)
texts = st.text(max_size=50)
statuses = st.integers(100, 599)

pairs = st.lists(st.tuples(texts, texts), max_size=4).map(tuple)
optional_bytes = st.one_of(st.none(), st.binary(max_size=40))
optional_content_type = st.one_of(st.none(), st.text(max_size=40))
optional_event = st.one_of(st.none(), events)

client_messages = st.one_of(
    st.builds(Auth, ids, st.just("OpenPGP"), proof=texts),
    st.builds(Auth, ids, st.just("secret"), identity=st.text(max_size=64), secret=texts),
    st.builds(Auth, ids, st.just("open"), identity=st.text(max_size=64)),
    st.builds(Subscribe, ids, events),
    st.builds(Unsubscribe, ids, events),
    st.builds(Publish, ids, events, payloads, st.booleans()),
    st.builds(Publish, ids, events, payloads, st.booleans(), optional_content_type, optional_event, optional_bytes,
              pairs),
    st.builds(Register, ids, applications),
    st.builds(Unregister, ids, applications),
    st.builds(Respond, ids, st.text(min_size=1, max_size=20), statuses, payloads, st.booleans(), st.one_of(st.none(), texts)),
)
server_messages = st.one_of(
    st.builds(Hello, st.integers(1, 9), st.sampled_from(["disabled", "enabled", "required"]), texts, st.one_of(st.none(), texts)),
    st.builds(Result, ids, statuses, texts, st.one_of(st.none(), texts), st.one_of(st.none(), texts)),
    st.builds(Event, events, payloads, st.booleans(), st.one_of(st.none(), texts), st.one_of(st.none(), texts)),
    st.builds(Event, events, payloads, st.booleans(), st.one_of(st.none(), texts), st.one_of(st.none(), texts),
              optional_content_type, optional_event, optional_bytes, pairs),
    st.builds(Request, st.text(min_size=1, max_size=20), applications, st.text(max_size=40), payloads, st.one_of(st.none(), texts), st.one_of(st.none(), texts), st.one_of(st.none(), texts)),
    st.builds(Dropped, st.integers(0, 10**9)),
)


def normalized(message: object) -> object:
    """What a decoder gives back: text payloads sent as binary stay binary; a binary flag on
    a payload that is not UTF-8 is implied."""
    data = getattr(message, "data", None)
    if isinstance(message, Request):
        return message
    if data is not None and hasattr(message, "binary") and not message.binary:  # type: ignore[attr-defined]
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return type(message)(**{**{f: getattr(message, f) for f in message.__slots__}, "binary": True})  # type: ignore[attr-defined]
    return message


@given(client_messages)
def test_client_messages_round_trip(message: object) -> None:
    payload, binary = encode(message)  # type: ignore[arg-type]
    assert decode_client(payload, binary) == normalized(message)


@given(server_messages)
def test_server_messages_round_trip(message: object) -> None:
    payload, binary = encode(message)  # type: ignore[arg-type]
    assert decode_server(payload, binary) == normalized(message)


@settings(max_examples=examples(500))
@given(st.binary(max_size=200), st.booleans())
def test_any_bytes_decode_or_raise_our_errors(data: bytes, binary: bool) -> None:
    for decode in (decode_client, decode_server):
        try:
            decode(data, binary)
        except ProtocolError as exc:
            assert isinstance(exc, (FrameError, InvalidMessage))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)


@settings(max_examples=examples(500))
@given(
    st.sampled_from(["auth", "subscribe", "unsubscribe", "publish", "register", "unregister", "respond", "x"]),
    st.dictionaries(st.sampled_from(["id", "event", "data", "method", "proof", "application", "status", "request", "identity", "secret"]), json_values, max_size=5),
    st.one_of(st.none(), st.binary(max_size=20)),
)
def test_any_json_object_is_a_message_or_an_answerable_error(kind: str, fields: dict, data: bytes | None) -> None:
    header = json.dumps({"type": kind, **fields}).encode()
    payload, binary = (header, False) if data is None else (header + b"\n" + data, True)
    try:
        decode_client(payload, binary)
    except InvalidMessage as exc:
        result = json.loads(exc.reply)  # type: ignore[arg-type]
        assert result["type"] == "result" and result["status"] in (400, 501)


def test_examples() -> None:
    assert decode_client(b'{"type":"subscribe","id":7,"event":"a/b"}', False) == Subscribe(7, "a/b")
    assert decode_client(b'{"type":"publish","event":"a/b","data":"hi"}', False) == Publish(None, "a/b", b"hi", False)
    assert decode_client(b'{"type":"publish","event":"a/b"}\n\x00\n\xff', True) == Publish(None, "a/b", b"\x00\n\xff", True)
    assert encode(Event("a/b", b"hi", False, "sam", "ssmp")) == (
        b'{"type":"event","event":"a/b","from":"sam","protocol":"ssmp","data":"hi"}',
        False,
    )
    assert encode(Event("a/b", b"\xff", False)) == (b'{"type":"event","event":"a/b"}\n\xff', True)
    assert encode(Result(None, 404, "nope")) == (b'{"type":"result","id":null,"status":404,"reason":"nope"}', False)


@pytest.mark.parametrize(
    "payload, binary",
    [
        (b"not json", False),
        (b"[1, 2]", False),
        (b"\xff\xfe", False),
        (b'{"type": "publish"', False),
        (b"no newline", True),
        (b"[" * 100_000 + b"]" * 100_000, False),
        (b'{"type":"subscribe","event":"a","id":NaN}', False),
        (b'{"a":1}' + b" " * 5000 + b"\nx", True),
    ],
)
def test_frame_errors(payload: bytes, binary: bool) -> None:
    with pytest.raises(FrameError) as error:
        decode_client(payload, binary)
    assert error.value.close_code == 1007


@pytest.mark.parametrize(
    "message, status, id",
    [
        ({"type": "teleport", "id": 1}, 501, 1),
        ({"id": 2}, 400, 2),
        ({"type": "subscribe", "id": 3}, 400, 3),
        ({"type": "subscribe", "id": 4, "event": "a\x00b"}, 400, 4),
        ({"type": "subscribe", "id": 5, "event": "x" * 256}, 400, 5),
        ({"type": "register", "id": 6, "application": "public-key"}, 400, 6),
        ({"type": "register", "id": 7, "application": "a/b"}, 400, 7),
        ({"type": "respond", "id": 8, "request": "1", "status": 99}, 400, 8),
        ({"type": "respond", "id": 9, "request": "1", "status": True}, 400, 9),
        ({"type": "publish", "id": 10, "event": "a", "data": 5}, 400, 10),
        ({"type": "auth", "id": 11, "method": "kerberos"}, 400, 11),
        ({"type": "publish", "id": 12, "event": "a", "data": "", "user_properties": [["a"]]}, 400, 12),
        ({"type": "publish", "id": 13, "event": "a", "data": "", "user_properties": {"a": "b"}}, 400, 13),
        ({"type": "publish", "id": 14, "event": "a", "data": "", "correlation": "not base64!"}, 400, 14),
        ({"type": "publish", "id": 15, "event": "a", "data": "", "response_topic": "a\x00b"}, 400, 15),
        ({"type": "publish", "id": 16, "event": "a", "data": "", "content_type": 7}, 400, 16),
        ({"type": "subscribe", "id": True, "event": "a"}, 400, None),
        ({"type": "subscribe", "id": 2**60, "event": "a"}, 400, None),
        ({"type": "subscribe", "id": "x" * 65, "event": "a"}, 400, None),
    ],
)
def test_invalid_messages_carry_their_result(message: dict, status: int, id: object) -> None:
    with pytest.raises(InvalidMessage) as error:
        decode_client(json.dumps(message).encode(), False)
    assert (error.value.status, error.value.id) == (status, id)
    assert json.loads(error.value.reply)["status"] == status  # type: ignore[arg-type]


def test_binary_message_may_not_also_carry_data() -> None:
    with pytest.raises(InvalidMessage):
        decode_client(b'{"type":"publish","event":"a","data":"x"}\nbytes', True)


@pytest.mark.parametrize("size, header", [(0, b"\x81\x00"), (125, b"\x81\x7d"), (126, b"\x81\x7e\x00\x7e"), (65536, b"\x81\x7f" + struct.pack("!Q", 65536))])
def test_frame_lengths(size: int, header: bytes) -> None:
    data = frame(b"a" * size, False)
    assert data == header + b"a" * size
    assert frame(b"", True)[0] == 0x82


def test_names() -> None:
    assert is_event_name("a/b") and is_event_name("ü" * 127) and not is_event_name("ü" * 128)
    assert not is_event_name("") and not is_event_name("a\nb") and not is_event_name(5)
    assert is_application_name("echo-1.v2_x") and not is_application_name("ws")
    assert not is_application_name("..") and not is_application_name("a b") and not is_application_name("x" * 65)


@pytest.mark.parametrize(
    "message, id, field",
    [
        ({"type": "auth", "id": 1, "method": "secret", "identity": "\ud800", "secret": "s"}, 1, "identity"),
        ({"type": "auth", "id": 1, "method": "OpenPGP", "proof": "\udc00"}, 1, "proof"),
        ({"type": "respond", "id": 3, "request": "\ud800", "status": 200}, 3, "request"),
        ({"type": "subscribe", "id": "a\ud800", "event": "e"}, None, "id"),
    ],
)
def test_lone_surrogates_are_invalid_messages(message: dict, id: object, field: str) -> None:
    with pytest.raises(InvalidMessage) as invalid:
        decode_client(json.dumps(message).encode(), False)
    assert (invalid.value.status, invalid.value.id) == (400, id)
    assert invalid.value.reason.startswith(field)
    json.loads(invalid.value.reply)  # the answer itself encodes
