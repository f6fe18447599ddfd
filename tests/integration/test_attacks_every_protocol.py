"""The attacks of issue 12 against a broker with all four front ends, each
held in place while an innocent client of every protocol is served
(tests/support/innocent.py).  The attacks' own bounds are asserted where each is tested in
detail (test_mcchat_lists.py, test_smqp_hardening.py, test_socketmq_hardening.py,
test_ssmp_slow_consumer.py); here the question is whether a broker under one of them still
serves everybody else, on every protocol.

The broker runs in process (``makeService``, every listener on loopback); the innocent
client is blocking and runs in a thread, so the reactor serves the attacker and it at once.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Factory

from brokerd.protocols.mcchat.codec import encode_sub, encode_tl
from brokerd.protocols.smqp.codec import encode_body, format_datetime
from brokerd.protocols.smqp.events import Body, Section
from tests.integration.test_smqp_hardening import smuggling_body
from tests.integration.test_socketmq_hardening import SLOW_REQUESTS, FrameClient, Trickle, client_frame
from tests.support.live import LOOPBACK, TIMEOUT, LiveBroker, reactor
from tests.support.collect import Collector
from tests.support.innocent import served_in_process

LIMIT = 64 * 1024
"""The broker's --max-output-buffer: small, so each attack reaches it quickly."""
BIG = 900_000
"""Bytes of each large SMQP message."""


async def raw(port: int, read: bool = True) -> Collector:
    return await connectProtocol(TCP4ClientEndpoint(reactor(), "127.0.0.1", port), Collector(read))


async def smqp_guest(live: LiveBroker, channel: str, *commands: bytes, read: bool = True) -> Collector:
    """A raw SMQP guest login that sent ``commands`` and got every reply (each ends in a
    ``200`` line here); with ``read=False`` it reads nothing more afterwards."""
    client = await raw(live.port("smqp"))
    client.start_reading()
    client.transport.write(b"LOGIN guest:%s CLEAR/1.0\r\nPASS guest\r\n" % channel.encode()
                           + b"".join(commands) + b"NOOP\r\n")
    await client.until(lambda got: got.count(b"\n200 ") >= 3 + len(commands))
    if not read:
        client.transport.pauseProducing()
    return client


def publish(topic: bytes, number: int) -> bytes:
    body = Body((("Created", format_datetime(time.time())),),
                (Section((("Content-Type", "application/octet-stream"),), b"%02d" % number + b"x" * BIG),))
    return b"PUBLISH MESSAGE %s m%d\r\n" % (topic, number) + encode_body(body)


async def mcchat_topic_lists_never_read(live: LiveBroker) -> list[Any]:
    """3,000 long topics, then 4 connections that ask for the list 10 times (~7.7 MB of
    answers) and never read."""
    topics = [b"topic-%05d-" % i + b"x" * 240 for i in range(3000)]
    holder = await raw(live.port("mcchat"))
    holder.transport.write(b"".join(encode_sub(t) for t in topics) + b"\x04")
    await holder.until(2 + len(encode_tl(topics)))
    askers = [await raw(live.port("mcchat"), read=False) for _ in range(4)]
    for asker in askers:
        asker.transport.write(b"\x04" * 10)
    return [holder, *askers]


async def smqp_get_message_never_read(live: LiveBroker) -> list[Any]:
    """12 messages of 900 KB, and 3 guests that each ask for all of them 3 times (~97 MB
    of answers) and never read."""
    owner = await smqp_guest(live, "owner", b"CREATE TOPIC /big\r\n", *(publish(b"/big", i) for i in range(12)))
    greedy = [await smqp_guest(live, f"g{i}", read=False) for i in range(3)]
    for client in greedy:
        client.transport.write(b"GET MESSAGE /big *\r\n" * 3)
    return [owner, *greedy]


async def smqp_window_never_read(live: LiveBroker) -> list[Any]:
    """A subscriber that neither reads nor acknowledges while 12 messages of 900 KB are
    published to it."""
    owner = await smqp_guest(live, "owner", b"CREATE TOPIC /news\r\n")
    slow = await smqp_guest(live, "slow", b"SUBSCRIBE MESSAGE /news\r\n", read=False)
    owner.transport.write(b"".join(publish(b"/news", i) for i in range(12)) + b"NOOP\r\n")
    await owner.until(lambda got: got.count(b"\n200 ") >= 3 + 1 + 12 + 1)
    return [owner, slow]


async def websocket_empty_continuations(live: LiveBroker) -> list[Any]:
    """A WebSocket message of endless empty continuation frames (the broker closes it with
    1009), flooding while the innocent client is served."""
    endpoint = TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("socketmq"))
    client: FrameClient = await endpoint.connect(Factory.forProtocol(FrameClient))
    await client.opened.addTimeout(TIMEOUT, reactor())
    client.transport.write(client_frame(0x1, b"", fin=False) + client_frame(0x0, b"", fin=False) * 200_000)
    return [client]


async def ssmp_subscriber_never_reads(live: LiveBroker) -> list[Any]:
    """An SSMP subscriber that never reads while 4,000 messages of 1 KB are published to it."""
    slow = await raw(live.port("ssmp"))
    slow.transport.write(b"LOGIN slow open\nSUBSCRIBE flood\n")
    await slow.until(lambda got: got == b"200\n200\n")
    slow.transport.pauseProducing()
    publisher = await raw(live.port("ssmp"))
    publisher.transport.write(b"LOGIN flooder open\n"
                              + b"".join(b"MCAST flood %04d" % i + b"p" * 1000 + b"\n" for i in range(4000)))
    await publisher.until(lambda got: got.count(b"200\n") >= 4001)
    return [slow, publisher]


async def http_headers_a_byte_at_a_time(live: LiveBroker) -> list[Any]:
    """Slowloris: a POST whose headers come one byte every 50 ms (20 s in all), still
    trickling while the innocent client is served."""
    head, rest = SLOW_REQUESTS["POST headers"]
    endpoint = TCP4ClientEndpoint(reactor(), "127.0.0.1", live.port("socketmq"))
    return [await endpoint.connect(Factory.forProtocol(lambda: Trickle(head, rest)))]


async def smqp_body_lines_as_commands(live: LiveBroker) -> list[Any]:
    """A PUBLISH line with 64 leading blanks whose body holds a command line."""
    line = b" " * 64 + b"PUBLISH MESSAGE /public x1\r\n"
    return [await smqp_guest(live, "smuggler", b"CREATE TOPIC /public\r\n", line + smuggling_body())]


ATTACKS: dict[str, Callable[[LiveBroker], Awaitable[list[Any]]]] = {
    "MCCHAT topic lists never read": mcchat_topic_lists_never_read,
    "SMQP GET MESSAGE never read": smqp_get_message_never_read,
    "SMQP window never read": smqp_window_never_read,
    "WebSocket empty continuation frames": websocket_empty_continuations,
    "SSMP subscriber never reads": ssmp_subscriber_never_reads,
    "HTTP headers a byte at a time": http_headers_a_byte_at_a_time,
    "SMQP body lines as commands": smqp_body_lines_as_commands,
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest_twisted.ensureDeferred
async def test_a_broker_under_attack_serves_every_protocol(tmp_path: Path, attack: str) -> None:
    live = LiveBroker.start(
        tmp_path / "data", listeners={p: [LOOPBACK] for p in ("ssmp", "mcchat", "smqp", "socketmq")},
        max_output_buffer=LIMIT, max_subscriptions=4096, smqp_guest_permissions="psc", event_log=False,
    )
    attackers: list[Any] = []
    try:
        await served_in_process(live_ports(live))  # the positive control, before the attack
        attackers = await ATTACKS[attack](live)
        await served_in_process(live_ports(live))
    finally:
        for client in attackers:
            if client.transport is not None:
                client.transport.abortConnection()
        await live.stop()


def live_ports(live: LiveBroker) -> dict[str, int]:
    return {p: live.port(p) for p in ("ssmp", "mcchat", "smqp", "socketmq")}
