"""The SSMP codec: examples from the spec, round trips, and hypothesis over any bytes and any
chunking (requests or SSMPProtocolError, nothing else)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.protocols.ssmp import codec
from brokerd.protocols.ssmp.codec import (
    MAX_LINE,
    SSMPClientParser,
    SSMPParser,
    SSMPProtocolError,
    encode_event,
    encode_payload,
    encode_request,
    encode_response,
    parse_request,
    parse_server_line,
    payload_content,
)
from brokerd.protocols.ssmp.events import Event, Request, Response
from tests.support.examples import examples

ID_ALPHABET = codec.ID_CHARS.decode()


def binary(data: bytes) -> bytes:
    return bytes(((len(data) - 1) >> 8, (len(data) - 1) & 0xFF)) + data


def feed_all(data: bytes, chunk: int = 0):
    parser = SSMPParser()
    if chunk <= 0:
        return parser.feed(data)
    requests = []
    for i in range(0, len(data), chunk):
        got, error = parser.feed(data[i:i + chunk])
        requests.extend(got)
        if error is not None:
            return requests, error
    return requests, None


# ------------------------------------------------------------------ examples

def test_spec_binary_example_is_hello():
    assert encode_payload(b"Hello", binary=True) == bytes.fromhex("00 04 48 65 6C 6C 6F")
    assert payload_content(bytes.fromhex("00 04 48 65 6C 6C 6F")) == (b"Hello", True)


@pytest.mark.parametrize(
    "line, expected",
    [
        (b"LOGIN alice open", Request(b"LOGIN", b"alice", None, b"open")),
        (b"LOGIN alice secret s3cr3t", Request(b"LOGIN", b"alice", b"s3cr3t", b"secret")),
        (b"SUBSCRIBE news", Request(b"SUBSCRIBE", b"news")),
        (b"SUBSCRIBE news PRESENCE", Request(b"SUBSCRIBE", b"news", None, b"PRESENCE")),
        (b"UNSUBSCRIBE news", Request(b"UNSUBSCRIBE", b"news")),
        (b"UCAST bob hi there", Request(b"UCAST", b"bob", b"hi there")),
        (b"MCAST a/b  two  spaces ", Request(b"MCAST", b"a/b", b" two  spaces ")),
        (b"BCAST hello all", Request(b"BCAST", None, b"hello all")),
        (b"PING", Request(b"PING")),
        (b"PONG", Request(b"PONG")),
        (b"CLOSE", Request(b"CLOSE")),
        (b"FROB", Request(b"FROB", known=False)),
        (b"FROB thing", Request(b"FROB", known=False)),
        (b"FROB thing some payload", Request(b"FROB", known=False)),
    ],
)
def test_parse_request_examples(line, expected):
    assert parse_request(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"login alice open",  # verbs are upper case
        b"LOGIN alice",  # no scheme
        b"LOGIN al ice open",  # 'ice' is the scheme, 'open' a credential: fine; see next
        b"SUBSCRIBE",
        b"SUBSCRIBE news presence",
        b"SUBSCRIBE bad\x7fid",
        b"UNSUBSCRIBE",
        b"MCAST topic",
        b"MCAST topic ",
        b"UCAST " + b"x" * 65 + b" hi",
        b"MCAST t " + b"x" * 1025,
        b"PING now",
        b"CLOSE please",
        b"ABCDEFGHIJKLMNOPQ",  # 17-letter verb
        b"000 alice MCAST t hi",
        b"MCAST t \x00\x05short",  # binary length says 6, 5 given
    ],
)
def test_grammar_violations(line):
    if line == b"LOGIN al ice open":
        assert parse_request(line) == Request(b"LOGIN", b"al", b"open", b"ice")
        return
    with pytest.raises(SSMPProtocolError):
        parse_request(line)


def test_limits():
    assert parse_request(b"MCAST t " + b"x" * 1024).payload == b"x" * 1024
    assert parse_request(b"UCAST " + b"i" * 64 + b" hi").target == b"i" * 64
    full = binary(b"\n" * 1024)
    assert parse_request(b"MCAST t " + full).payload == full
    with pytest.raises(SSMPProtocolError):
        parse_request(b"MCAST t " + bytes((4, 0)) + b"x" * 1025)


def test_binary_payload_with_lf_is_framed_by_length():
    data = b"MCAST t " + binary(b"a\nb\n") + b"\nPING\n"
    requests, error = feed_all(data)
    assert error is None
    assert requests == [Request(b"MCAST", b"t", binary(b"a\nb\n")), Request(b"PING")]


def test_binary_payload_must_end_with_lf():
    requests, error = feed_all(b"PING\nMCAST t " + binary(b"ab") + b"X\n")
    assert requests == [Request(b"PING")]
    assert isinstance(error, SSMPProtocolError)


def test_binary_credential_on_login():
    requests, error = feed_all(b"LOGIN alice secret " + binary(b"s\ne\x00") + b"\n")
    assert error is None
    assert requests == [Request(b"LOGIN", b"alice", binary(b"s\ne\x00"), b"secret")]


def test_text_payload_may_hold_control_bytes_after_the_first():
    requests, error = feed_all(b"MCAST t x\x00\x01\x02\x03y\n")
    assert error is None
    assert requests[0].payload == b"x\x00\x01\x02\x03y"


def test_overlong_line_without_lf_is_an_error():
    parser = SSMPParser()
    requests, error = parser.feed(b"MCAST t " + b"x" * MAX_LINE)
    assert requests == [] and isinstance(error, SSMPProtocolError)
    # once broken, it stays broken
    assert parser.feed(b"PING\n") == ([], error)


def test_requests_before_a_violation_are_returned():
    requests, error = feed_all(b"PING\nPONG\nbogus\nPING\n")
    assert requests == [Request(b"PING"), Request(b"PONG")]
    assert isinstance(error, SSMPProtocolError)
    assert error.reply == b"400\n"


def test_partial_line_waits():
    parser = SSMPParser()
    assert parser.feed(b"MCAST t hel") == ([], None)
    assert parser.buffered == len(b"MCAST t hel")
    assert parser.feed(b"lo\n") == ([Request(b"MCAST", b"t", b"hello")], None)


# ------------------------------------------------------------------ server side lines

@pytest.mark.parametrize(
    "line, expected",
    [
        (b"200", Response(b"200")),
        (b"401 open secret", Response(b"401", b"open secret")),
        (b"000 . PING", Event(b".", b"PING")),
        (b"000 . PONG", Event(b".", b"PONG")),
        (b"000 alice MCAST t hi there", Event(b"alice", b"MCAST", b"t", b"hi there")),
        (b"000 alice UCAST bob hi", Event(b"alice", b"UCAST", b"bob", b"hi")),
        (b"000 alice BCAST hi", Event(b"alice", b"BCAST", None, b"hi")),
        (b"000 alice SUBSCRIBE t PRESENCE", Event(b"alice", b"SUBSCRIBE", b"t", None, b"PRESENCE")),
        (b"000 alice UNSUBSCRIBE t", Event(b"alice", b"UNSUBSCRIBE", b"t")),
    ],
)
def test_parse_server_lines(line, expected):
    assert parse_server_line(line) == expected


@pytest.mark.parametrize("line", [b"20", b"abc", b"000", b"000 alice", b"000 alice FROB x", b"000 a LOGIN b c"])
def test_bad_server_lines(line):
    with pytest.raises(SSMPProtocolError):
        parse_server_line(line)


def test_client_parser_frames_binary_events():
    parser = SSMPClientParser()
    data = b"000 alice MCAST t " + binary(b"x\ny") + b"\n200\n"
    messages, error = parser.feed(data)
    assert error is None
    assert messages == [Event(b"alice", b"MCAST", b"t", binary(b"x\ny")), Response(b"200")]


def test_encoders():
    assert encode_response(b"200") == b"200\n"
    assert encode_response(b"401", b"open cert") == b"401 open cert\n"
    assert encode_event(b"alice", b"MCAST", b"t", b"hi") == b"000 alice MCAST t hi\n"
    assert encode_request(b"SUBSCRIBE", b"t", b"PRESENCE") == b"SUBSCRIBE t PRESENCE\n"
    assert encode_payload(b"") is None
    assert encode_payload(b"x" * 1025) is None
    assert encode_payload(b"\x01abc") == b"\x00\x03\x01abc"
    assert encode_payload(b"a\nb") == b"\x00\x02a\nb"


# ------------------------------------------------------------------ properties

ids = st.text(alphabet=ID_ALPHABET, min_size=1, max_size=64).map(str.encode)
text_payloads = st.binary(min_size=1, max_size=1024).filter(lambda b: b[0] > 3 and b"\n" not in b)
any_content = st.binary(min_size=1, max_size=1024)


@st.composite
def requests(draw):
    kind = draw(st.sampled_from(["LOGIN", "SUB", "UNSUB", "UCAST", "MCAST", "BCAST", "PING", "PONG", "CLOSE", "X"]))
    if kind == "LOGIN":
        payload = draw(st.none() | any_content.map(lambda c: encode_payload(c, draw(st.booleans()))))
        req = Request(b"LOGIN", draw(ids), payload, draw(ids))
    elif kind == "SUB":
        req = Request(b"SUBSCRIBE", draw(ids), None, draw(st.sampled_from([None, b"PRESENCE"])))
    elif kind == "UNSUB":
        req = Request(b"UNSUBSCRIBE", draw(ids))
    elif kind in ("UCAST", "MCAST"):
        req = Request(kind.encode(), draw(ids), encode_payload(draw(any_content), draw(st.booleans())))
    elif kind == "BCAST":
        req = Request(b"BCAST", None, encode_payload(draw(any_content), draw(st.booleans())))
    elif kind == "X":
        req = Request(draw(st.sampled_from([b"FROB", b"HELLO", b"QUIT"])), known=False)
    else:
        req = Request(kind.encode())
    return req


def encode(req: Request) -> bytes:
    if req.verb == b"LOGIN":
        args = [req.target, req.option]
    else:
        args = [req.target] if req.target is not None else []
    if req.payload is not None:
        args.append(req.payload)
    if req.verb == b"SUBSCRIBE" and req.option:
        args.append(req.option)
    return encode_request(req.verb, *args)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(requests(), max_size=20), st.integers(min_value=0, max_value=50))
def test_round_trip_under_any_chunking(reqs, chunk):
    data = b"".join(encode(r) for r in reqs)
    got, error = feed_all(data, chunk)
    assert error is None
    assert got == reqs


@settings(max_examples=examples(500), deadline=None)
@given(st.binary(max_size=3000), st.integers(min_value=0, max_value=64))
def test_any_bytes_give_requests_or_our_error(data, chunk):
    whole, whole_error = feed_all(data)
    chunked, chunked_error = feed_all(data, chunk)
    assert all(isinstance(r, Request) for r in whole)
    assert whole_error is None or isinstance(whole_error, SSMPProtocolError)
    # Chunking never changes what is parsed before a violation is seen.
    shorter = min(len(whole), len(chunked))
    assert whole[:shorter] == chunked[:shorter]
    if whole_error is None and chunked_error is None:
        assert whole == chunked


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=40))
def test_client_parser_any_bytes(data, chunk):
    parser = SSMPClientParser()
    for i in range(0, len(data), chunk):
        messages, error = parser.feed(data[i:i + chunk])
        assert all(isinstance(m, (Response, Event)) for m in messages)
        assert error is None or isinstance(error, SSMPProtocolError)


@given(any_content, st.booleans())
def test_payload_round_trip(content, as_binary):
    wire = encode_payload(content, as_binary)
    codec.check_payload(wire)
    assert payload_content(wire) == (content, wire[0] <= 3)


# ------------------------------------------------------------------ what a refusal says, and the edges

@pytest.mark.parametrize(
    "line, message",
    [
        (b"PING now", "PING takes no arguments"),
        (b"LOGIN alice", "LOGIN needs an identifier and a scheme"),
        (b"LOGIN al!ce open", "LOGIN needs an identifier and a scheme"),
        (b"LOGIN alice open ", "empty payload"),
        (b"SUBSCRIBE", "SUBSCRIBE needs a topic and at most the PRESENCE flag"),
        (b"SUBSCRIBE news LATER", "SUBSCRIBE needs a topic and at most the PRESENCE flag"),
        (b"UNSUBSCRIBE", "UNSUBSCRIBE needs a topic"),
        (b"UNSUBSCRIBE no!", "UNSUBSCRIBE needs a topic"),
        (b"MCAST news", "MCAST needs an id and a payload"),
        (b"BCAST", "BCAST needs a payload"),
        (b"MCAST news " + b"x" * 1025, "text payload of 1025 bytes (at most 1024)"),
        (b"MCAST news \x00\x05ab", "binary payload length does not match its length bytes"),
        (b"MCAST news \x03\x00abc", "binary payload length does not match its length bytes"),
        (b"FROB!", "not an SSMP request"),
        (b"FROB " + b"x" * 1025, "malformed arguments"),
    ],
)
def test_a_malformed_request_is_refused_with_what_is_wrong(line: bytes, message: str) -> None:
    with pytest.raises(SSMPProtocolError) as refused:
        parse_request(line)
    assert str(refused.value) == message


def test_payload_edges_text_up_to_1024_bytes_and_the_binary_marker_bytes_0_to_3() -> None:
    assert parse_request(b"MCAST news " + b"x" * 1024).payload == b"x" * 1024
    assert parse_request(b"MCAST news \x04text").payload == b"\x04text"  # 4 starts a text payload
    assert encode_payload(b"hi") == b"hi"
    assert encode_payload(b"x" * 1024) == b"x" * 1024
    assert encode_payload(b"\x04abc") == b"\x04abc"
    assert encode_payload(b"\x03abc") == b"\x00\x03\x03abc"  # 3 would read as a binary marker
    assert encode_payload(b"y" * 300, binary=True)[:2] == bytes((1, 43))  # 299 = 0x012B
    wire = bytes((3, 0)) + b"y" * 769  # a binary payload whose first length byte is 3
    assert payload_content(wire) == (b"y" * 769, True)
    assert payload_content(b"\x04text") == (b"\x04text", False)
