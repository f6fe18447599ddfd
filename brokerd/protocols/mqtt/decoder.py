"""The incremental MQTT decoder: bytes in, in any chunking, packets out (sans-IO).

Framing is the fixed header of section 2.1 (both versions): a byte of packet type and flags,
then the Remaining Length, a Variable Byte Integer of at most four bytes (1.5.5; a fourth byte
with its continuation bit set is malformed at once, without waiting for a fifth).  Everything
that can be refused from the fixed header is refused before a byte of the body is kept:

* a reserved packet type (0; 15 in 3.1.1), flag bits other than the fixed ones (0010 for
  PUBREL, SUBSCRIBE and UNSUBSCRIBE, 0000 for all but PUBLISH; 2.1.3): 0x81 Malformed Packet;
* a packet the peer's side never sends (a server getting a SUBACK), a first packet that is not
  CONNECT, a second CONNECT ([MQTT-3.1.0-1], [MQTT-3.1.0-2]): 0x82 Protocol Error;
* a packet larger than ``max_packet_size`` (fixed header included, as the Maximum Packet Size
  of 3.1.2.11.4 counts it): 0x95 Packet too large.

So memory per connection is bounded by ``max_packet_size``: at most one incomplete packet is
kept, and its size was checked first.  The body is read by :mod:`.decoding`.

``feed`` returns ``(packets, error)`` like brokerd's other codecs: the packets completed before
the stream broke, then the :class:`~.reasons.MQTTProtocolError` (or None), which every later call
repeats.  No other exception escapes.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from brokerd.protocols.mqtt.decoding import PARSERS
from brokerd.protocols.mqtt.packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MQTT_5,
    PACKET_NAMES,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    VERSIONS,
    Packet,
)
from brokerd.protocols.mqtt.reasons import (
    PACKET_TOO_LARGE,
    MQTTProtocolError,
    malformed,
    protocol_error,
)

MAX_PACKET_SIZE = 1_048_576
"""The default largest packet a decoder accepts (1 MiB, fixed header included)."""
SPEC_MAX_PACKET_SIZE = 1 + 4 + 268_435_455
"""The largest packet the fixed header can describe."""

_FIXED_FLAGS = {PUBREL: 0x02, SUBSCRIBE: 0x02, UNSUBSCRIBE: 0x02}
"""Flag bits of the packets whose flags are not 0000 (PUBLISH's are its own; 2.1.3)."""

_FROM_CLIENTS = frozenset((CONNECT, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT))
_FROM_SERVERS = frozenset((CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, PINGRESP))


class _Decoder(ABC):
    """What both sides share: framing, the size bound, and dispatch to the body readers."""

    def __init__(self, max_packet_size: int, version: int | None) -> None:
        if not 2 <= max_packet_size <= SPEC_MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be 2-{SPEC_MAX_PACKET_SIZE}, not {max_packet_size}")
        self.max_packet_size = max_packet_size
        self.version = version
        """The protocol level in force: 4 (3.1.1) or 5; None until a server reads the CONNECT."""
        self.failed: MQTTProtocolError | None = None
        self._head = b""
        """An incomplete fixed header (at most four bytes)."""
        self._body: bytearray | None = None
        """The packet in progress, fixed header included."""
        self._need = 0
        self._header_size = 0

    @property
    def buffered(self) -> int:
        """Bytes held for the packet in progress (never more than ``max_packet_size``)."""
        return len(self._head) + (len(self._body) if self._body is not None else 0)

    def feed(self, data: bytes) -> tuple[list[Packet], MQTTProtocolError | None]:
        """The packets ``data`` completes and, if the stream then broke MQTT, the error."""
        if self.failed is not None:
            return [], self.failed
        packets: list[Packet] = []
        try:
            self._feed(data if type(data) is bytes else bytes(data), packets)
        except MQTTProtocolError as exc:
            self.failed = exc
            self._head = b""
            self._body = None
            return packets, exc
        return packets, None

    def _feed(self, data: bytes, packets: list[Packet]) -> None:
        pos = 0
        body = self._body
        if body is not None:
            take = self._need - len(body)
            if len(data) < take:
                body += data
                return
            body += memoryview(data)[:take]
            self._body = None
            self._packet(body[0], bytes(body), self._header_size, self._need, packets)
            pos = take
        elif self._head:
            data = self._head + data
            self._head = b""
        size = len(data)
        limit = self.max_packet_size
        while pos < size:
            first = data[pos]
            if not self._first_ok[first]:
                raise self._fixed_header_error(first)
            # The Remaining Length, inline: read once per packet.
            index = pos + 1
            remaining = 0
            shift = 0
            while True:
                if index >= size:
                    self._head = data[pos:]
                    return
                byte = data[index]
                index += 1
                remaining |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
                if shift == 28:
                    raise self._at(malformed("Remaining Length longer than four bytes"), first)
            if byte == 0 and index - pos > 2:
                raise self._at(malformed("Remaining Length not in its shortest form"), first)
            total = index - pos + remaining
            if total > limit:
                raise self._at(
                    MQTTProtocolError(f"a packet of {total} bytes (at most {limit})", PACKET_TOO_LARGE), first
                )
            end = index + remaining
            if end > size:
                self._body = bytearray(memoryview(data)[pos:])
                self._need = total
                self._header_size = index - pos
                return
            self._packet(first, data, index, end, packets)
            pos = end

    def _at(self, exc: MQTTProtocolError, first: int) -> MQTTProtocolError:
        exc.packet_type = first >> 4
        if exc.version is None:
            exc.version = self.version
        return exc

    def _set_receives(self, packet_types: frozenset[int]) -> None:
        """Expect these packet types from now on; ``_first_ok[byte]`` says whether a fixed
        header may start with that byte (one lookup per packet instead of the checks)."""
        self._receives = packet_types
        self._first_ok = tuple(
            first >> 4 in packet_types and (first >> 4 == PUBLISH or first & 0x0F == _FIXED_FLAGS.get(first >> 4, 0))
            for first in range(256)
        )

    def _fixed_header_error(self, first: int) -> MQTTProtocolError:
        """What is wrong with a first byte that ``_first_ok`` refused."""
        packet_type = first >> 4
        if packet_type not in self._receives:
            if packet_type == 0 or (packet_type == AUTH and self.version != MQTT_5):
                return self._at(malformed(f"reserved packet type {packet_type}"), first)
            return self._at(self._unexpected(packet_type), first)
        flags = first & 0x0F
        return self._at(malformed(f"{PACKET_NAMES[packet_type]} with flag bits {flags:04b}"), first)

    def _packet(self, first: int, data: bytes, pos: int, end: int, packets: list[Packet]) -> None:
        try:
            packet = PARSERS[first >> 4](first & 0x0F, data, pos, end, self.version)
        except MQTTProtocolError as exc:
            raise self._at(exc, first) from None
        if first == 0x10:  # CONNECT: "\x00\x04MQTT" and then the protocol level
            self.version = data[pos + 6]
            self._set_receives(self._receives_in(self.version))
        elif self._from_clients and first >> 4 == PUBLISH:
            if packet.properties.subscription_identifiers:
                raise self._at(protocol_error("a client's PUBLISH with a Subscription Identifier"), first)
        packets.append(packet)

    _receives: frozenset[int]
    _first_ok: tuple[bool, ...]
    _from_clients = False
    """Whether the peer is a client: a client never sends Subscription Identifiers
    ([MQTT-3.3.4-6]); a server sends one per matching subscription."""

    @abstractmethod
    def _unexpected(self, packet_type: int) -> MQTTProtocolError:
        """The error for a packet type this side never receives."""

    @abstractmethod
    def _receives_in(self, version: int) -> frozenset[int]:
        """The packet types this side receives once ``version`` is known."""


_SERVER_RECEIVES = {4: _FROM_CLIENTS - {CONNECT}, 5: (_FROM_CLIENTS | {AUTH}) - {CONNECT}}
_CLIENT_RECEIVES = {4: _FROM_SERVERS, 5: _FROM_SERVERS | {DISCONNECT, AUTH}}
_BEFORE_CONNECT = frozenset((CONNECT,))


class MQTTServerDecoder(_Decoder):
    """A server's decoder: what clients send.  The first packet must be CONNECT; its protocol
    level (4 or 5) sets :attr:`version` for the rest of the stream."""

    _from_clients = True

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE) -> None:
        super().__init__(max_packet_size, None)
        self._set_receives(_BEFORE_CONNECT)

    def _receives_in(self, version: int) -> frozenset[int]:
        return _SERVER_RECEIVES[version]

    def _unexpected(self, packet_type: int) -> MQTTProtocolError:
        name = PACKET_NAMES[packet_type]
        if self.version is None:
            return protocol_error(f"{name} before CONNECT")
        if packet_type == CONNECT:
            return protocol_error("a second CONNECT")
        return protocol_error(f"a client sent {name}")


class MQTTClientDecoder(_Decoder):
    """A client's decoder: what servers send, in the ``version`` the client's CONNECT asked for."""

    def __init__(self, version: int, max_packet_size: int = MAX_PACKET_SIZE) -> None:
        if version not in VERSIONS:
            raise ValueError(f"MQTT protocol level 4 or 5, not {version!r}")
        super().__init__(max_packet_size, version)
        self._set_receives(_CLIENT_RECEIVES[version])

    def _receives_in(self, version: int) -> frozenset[int]:
        return self._receives

    def _unexpected(self, packet_type: int) -> MQTTProtocolError:
        return protocol_error(f"a server sent {PACKET_NAMES[packet_type]}")
