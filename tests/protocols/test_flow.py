"""The Twisted internals behind the fast paths (brokerd.twistedio): these tests fail on a Twisted
release nobody checked them on, or when the code they rely on changes, so an upgrade cannot
quietly break them.  When one fails: read the functions named below in the new release, check
that ``_queued``, ``DirectWrites.write_now`` and ``send_now`` still match what they do, then add
the release to twistedio.CHECKED_TWISTED and its digests below.  The oldest release setup.cfg
accepts runs the quick loop in CI too (tox.ini, ``oldest-twisted``)."""
from __future__ import annotations

import hashlib
import inspect

from twisted.internet import abstract, tcp
from twisted.internet.testing import StringTransport

from brokerd import twistedio

RELIED_ON = {
    # dataBuffer, offset, _tempDataBuffer/_tempDataLen and bufferSize are set up here
    abstract.FileDescriptor.__init__: {"6405435a8c04d4c9"},
    # the queue check that limit_output_buffer replaces, and its only caller
    abstract.FileDescriptor._isSendBufferFull: {"9d19c2cb703629f5"},
    abstract.FileDescriptor._maybePauseProducer: {"529bd8438e1a279f"},
    # how queued bytes are kept: write_now writes the socket itself only when both are empty
    abstract.FileDescriptor.write: {"3e46c97fc173bc7e"},
    abstract.FileDescriptor.writeSequence: {"1606f230d318191a"},
    abstract.FileDescriptor.doWrite: {"a986d7b1b1054e43"},
    # recv() takes bufferSize bytes: why the limit does not go through bufferSize
    # (26.4 and 26.10 differ only in its type annotations)
    tcp.Connection.doRead: {"9133d84795c8a70d", "20ac74ffecd6b7f2"},
}


def test_the_installed_twisted_is_a_release_the_fast_paths_were_checked_on() -> None:
    assert twistedio.FAST_PATHS, (
        f"Twisted {twistedio.twisted_release()} is not in twistedio.CHECKED_TWISTED: brokerd falls back to "
        "bufferSize and transport.write (slower); check the internals and add the release"
    )


def test_the_twisted_code_the_fast_paths_rely_on_is_unchanged() -> None:
    changed = [
        function.__qualname__
        for function, digests in RELIED_ON.items()
        if hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16] not in digests
    ]
    assert changed == [], f"Twisted changed {changed}: check brokerd.protocols.flow against them"


def test_on_another_release_only_public_attributes_are_used(monkeypatch) -> None:
    monkeypatch.setattr(twistedio, "FAST_PATHS", False)
    transport = tcp.Connection.__new__(tcp.Connection)  # a TCP transport, never connected
    abstract.FileDescriptor.__init__(transport)
    twistedio.limit_output_buffer(transport, 12345)
    assert transport.bufferSize == 12345
    assert "_isSendBufferFull" not in vars(transport)
    assert not twistedio.direct_writes(transport)
    assert twistedio.queued_bytes(transport) is None


def test_on_a_checked_release_the_queue_check_is_replaced_and_reads_stay_small() -> None:
    transport = tcp.Connection.__new__(tcp.Connection)
    abstract.FileDescriptor.__init__(transport)
    twistedio.limit_output_buffer(transport, 100)
    assert transport.bufferSize == abstract.FileDescriptor.bufferSize  # the recv() size
    assert not transport._isSendBufferFull()
    transport._tempDataBuffer.append(b"x" * 101)
    transport._tempDataLen += 101
    assert transport._isSendBufferFull()
    assert twistedio.queued_bytes(transport) == 101
    assert twistedio.direct_writes(transport)


def test_a_transport_that_is_not_tcp_gets_the_limit_as_its_buffer_size() -> None:
    transport = StringTransport()
    twistedio.limit_output_buffer(transport, 4321)
    assert transport.bufferSize == 4321
    assert not twistedio.direct_writes(transport)
    assert twistedio.queued_bytes(transport) is None


class _Socket:
    """A socket that takes at most ``room`` bytes per send()."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> int:
        taken = bytes(data[: self.room])
        self.sent.append(taken)
        return len(taken)


def _connection(room: int) -> tuple[tcp.Connection, _Socket, list[bytes]]:
    transport = tcp.Connection.__new__(tcp.Connection)
    abstract.FileDescriptor.__init__(transport)
    transport.socket = _Socket(room)
    queued: list[bytes] = []
    transport.write = queued.append  # what Twisted would queue for its doWrite round
    return transport, transport.socket, queued


def test_send_now_writes_an_idle_connection_at_once_and_queues_what_the_kernel_did_not_take() -> None:
    transport, socket, queued = _connection(room=4)
    twistedio.send_now(transport, b"abcdefgh")
    assert socket.sent == [b"abcd"] and queued == [b"efgh"]


def test_send_now_queues_behind_queued_bytes_so_their_order_is_kept() -> None:
    transport, socket, queued = _connection(room=100)
    transport._tempDataBuffer.append(b"first")
    transport._tempDataLen += 5
    twistedio.send_now(transport, b"second")
    assert socket.sent == [] and queued == [b"second"]
    transport, socket, queued = _connection(room=100)
    twistedio.send_now(transport, b"whole")
    assert socket.sent == [b"whole"] and queued == []


def test_send_now_on_another_release_only_uses_transport_write(monkeypatch) -> None:
    monkeypatch.setattr(twistedio, "FAST_PATHS", False)
    transport, socket, queued = _connection(room=100)
    twistedio.send_now(transport, b"data")
    assert socket.sent == [] and queued == [b"data"]


def _writer(room: int) -> tuple[twistedio.DirectWrites, _Socket, list[bytes]]:
    writer = twistedio.DirectWrites()
    writer.transport, socket, queued = _connection(room)
    writer.check_direct_writes()
    return writer, socket, queued


def test_write_now_sends_at_once_while_nothing_is_queued_and_queues_behind_what_is() -> None:
    writer, socket, queued = _writer(room=4)
    writer.write_now(b"abcdefgh")
    assert socket.sent == [b"abcd"] and queued == [b"efgh"]
    writer, socket, queued = _writer(room=100)
    writer.transport._tempDataBuffer.append(b"first")
    writer.transport._tempDataLen += 5
    writer.write_now(b"second")
    assert socket.sent == [] and queued == [b"second"]


def test_write_now_on_another_release_only_uses_transport_write(monkeypatch) -> None:
    monkeypatch.setattr(twistedio, "FAST_PATHS", False)
    writer, socket, queued = _writer(room=100)
    writer.write_now(b"data")
    assert socket.sent == [] and queued == [b"data"]
