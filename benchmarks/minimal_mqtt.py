"""A minimal MQTT 3.1.1 server on Twisted: the Python floor brokerd's MQTT figures are read against.

Just what mqtt_bench.py's workloads need: CONNECT, SUBSCRIBE to exact topics (no wildcards),
PUBLISH at QoS 0 and 1 (answered PUBACK at once), the subscriber's PUBACKs (taken and
forgotten), PINGREQ and DISCONNECT.  Each read is split into packets at once, the publisher's
PUBACKs of one read go out as one write and each subscriber gets one write per read.  No
sessions, no retained messages, no limits, no validation, no flow control, idiomatic
``transport.write``: what CPython and Twisted cost per message, not a server to copy.

    python benchmarks/minimal_mqtt.py PORT
"""
from __future__ import annotations

import sys

from twisted.internet import reactor
from twisted.internet.protocol import Factory, Protocol

CONNACK = b"\x20\x02\x00\x00"
PINGRESP = b"\xd0\x00"


class MinimalMQTT(Protocol):
    def __init__(self, factory: MinimalFactory) -> None:
        self.factory = factory
        self.buffer = b""
        self.granted: dict[bytes, int] = {}
        self.next_id = 0

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)

    def connectionLost(self, reason: object = None) -> None:
        for topic in self.granted:
            self.factory.topics.get(topic, {}).pop(self, None)

    def dataReceived(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        replies: list[bytes] = []
        out: dict[MinimalMQTT, list[bytes]] = {}
        start, end = 0, len(buffer)
        while end - start >= 2:
            length, shift, at = 0, 0, start + 1
            while at < end:  # the Remaining Length, 1 to 4 bytes
                byte = buffer[at]
                length |= (byte & 0x7F) << shift
                at += 1
                if not byte & 0x80:
                    break
                shift += 7
            if buffer[at - 1] & 0x80 or at + length > end:
                break  # the rest comes with the next read
            self.packet(buffer[start], buffer[at:at + length], replies, out)
            start = at + length
        self.buffer = buffer[start:]
        if replies:
            self.transport.write(b"".join(replies))
        for subscriber, packets in out.items():
            subscriber.transport.write(b"".join(packets))

    def packet(self, first: int, body: bytes, replies: list[bytes], out: dict) -> None:
        kind = first >> 4
        if kind == 3:
            self.publish(first, body, replies, out)
        elif kind == 4:  # the subscriber's PUBACK: nothing is kept to resend
            pass
        elif kind == 1:
            replies.append(CONNACK)
        elif kind == 8:
            self.subscribe(body, replies)
        elif kind == 12:
            replies.append(PINGRESP)
        elif kind == 14:
            self.transport.loseConnection()

    def publish(self, first: int, body: bytes, replies: list[bytes], out: dict) -> None:
        qos = first >> 1 & 3
        topic_end = 2 + int.from_bytes(body[:2], "big")
        topic = body[2:topic_end]
        payload_at = topic_end + (2 if qos else 0)
        if qos:
            replies.append(b"\x40\x02" + body[topic_end:payload_at])
        topic_field = body[:topic_end]
        payload = body[payload_at:]
        for subscriber, granted in self.factory.topics.get(topic, {}).items():
            delivered = min(qos, granted)
            if delivered:
                subscriber.next_id = subscriber.next_id % 65535 + 1
                rest = topic_field + subscriber.next_id.to_bytes(2, "big") + payload
            else:
                rest = topic_field + payload
            out.setdefault(subscriber, []).append(bytes((0x30 | delivered << 1,)) + _length(len(rest)) + rest)

    def subscribe(self, body: bytes, replies: list[bytes]) -> None:
        codes = bytearray()
        at = 2
        while at < len(body):
            end = at + 2 + int.from_bytes(body[at:at + 2], "big")
            topic, granted = body[at + 2:end], min(body[end] & 3, 1)
            self.factory.topics.setdefault(topic, {})[self] = granted
            self.granted[topic] = granted
            codes.append(granted)
            at = end + 1
        replies.append(b"\x90" + _length(2 + len(codes)) + body[:2] + bytes(codes))


def _length(n: int) -> bytes:
    encoded = bytearray()
    while True:
        n, digit = divmod(n, 128)
        encoded.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(encoded)


class MinimalFactory(Factory):
    def __init__(self) -> None:
        self.topics: dict[bytes, dict[MinimalMQTT, int]] = {}

    def buildProtocol(self, addr: object) -> MinimalMQTT:
        return MinimalMQTT(self)


if __name__ == "__main__":
    reactor.listenTCP(int(sys.argv[1]), MinimalFactory(), interface="127.0.0.1", backlog=1024)
    reactor.run()
