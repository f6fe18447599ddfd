"""SMQP attacked as a user would, on real sockets: framing that could run a message body as
commands, input that could never be answered, numbers the store cannot hold.  After each, the
server keeps serving the attacker's next command and an innocent client."""
from __future__ import annotations

import gc
import re
import socket
import time
import weakref

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from brokerd.protocols.smqp.client import SMQPError
from brokerd.protocols.smqp.codec import encode_body, format_datetime
from brokerd.protocols.smqp.events import Body, Section
from tests.integration.smqp_fixtures import smqp_server  # noqa: F401
from tests.support.collect import Collector, called, eventually
from tests.support.live import Waiter


def body_numbers(received: bytes, mark: bytes) -> list[int]:
    """The two-digit numbers that open the message bodies in ``received``, in order: each body
    follows the blank line that ends its headers and is the number, then ``mark``, then
    padding (one regular-expression scan: a Python loop over every offset of 11 MB took
    seconds)."""
    return [int(number) for number in re.findall(rb"(?=\r\n\r\n(..)" + re.escape(mark) + rb")", received, re.S)]


async def refused(d, code: int) -> SMQPError:
    with pytest.raises(SMQPError) as info:
        await d
    assert info.value.code == code, info.value
    return info.value


def smuggling_body() -> bytes:
    """A message whose data is a command line: it must stay data."""
    return encode_body(Body((("Created", format_datetime(time.time())),),
                            (Section((("Content-Type", "text/plain"),), b"CREATE TOPIC /public/smuggled\r\n"),)))


async def innocent_is_served(server) -> None:
    """Another account logs in and is answered (the topics the test made are listed)."""
    bob = await server.login("bob", "innocent")
    assert (await bob.noop()).code == 200
    assert set(await bob.list_topics("/")) & {"/public", "/big", "/news"}


async def raw_login(server, account: str, channel: str, *commands: bytes, read: bool = True) -> Collector:
    """A raw connection logged in as ``account`` that sent ``commands`` and got their
    replies; with ``read=False`` it reads nothing more afterwards."""
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", server.port_number)
    client = await connectProtocol(endpoint, Collector(read))
    client.start_reading()
    password = {"alice": b" alicepw", "bob": b" bobpw", "guest": b""}[account]
    client.transport.write(b"LOGIN %s:%s CLEAR/1.0\r\nPASS %s%s\r\n" % (
        account.encode(), channel.encode(), account.encode(), password) + b"".join(commands) + b"NOOP\r\n")
    await client.until(lambda got: got.count(b"\n200 ") >= 3 + len(commands))  # each last reply line
    if not read:
        client.transport.pauseProducing()
    del client.received[:]
    return client


def volatile_publish(topic: str, cmuid: str, data: bytes) -> bytes:
    body = Body((("Created", format_datetime(time.time())), ("Guarantee", "NO")),
                (Section((("Content-Type", "application/octet-stream"),), data),))
    return b"PUBLISH MESSAGE %s %s\r\n" % (topic.encode(), cmuid.encode()) + encode_body(body)


@pytest_twisted.ensureDeferred
async def test_leading_blanks_never_turn_a_body_into_commands(smqp_server):
    server = await smqp_server()
    alice = await server.login()
    await alice.create_topic("/public")
    await alice.subscribe("/public")
    for blanks in (b" " * 64, b" \t" * 40, b" " * 5000):  # the last makes a line over 4096 bytes
        line = blanks + b"PUBLISH" + b" " * 70 + b"MESSAGE /public x1\r\n"
        reply = alice.send_raw(line + smuggling_body())
        if len(line) > 4096:
            await refused(reply, 400)
        else:
            assert (await reply).code == 200
        assert (await alice.noop()).code == 200  # the next reply is the NOOP's: in step
    assert await alice.list_topics("/public") == []
    count = await alice.count("MESSAGE", "/public")
    assert count == 2
    await innocent_is_served(server)


@pytest_twisted.ensureDeferred
async def test_contact_data_with_a_bare_cr_is_refused_at_input(smqp_server):
    server = await smqp_server()
    alice = await server.login()
    raw = b"SET LOGIN CONTACT text/x-vcard\r\nbegin:vcard\r\nn:Smythe\rJayne\r\nend:vcard\r\n.\r\n"
    await refused(alice.send_raw(raw), 400)
    await refused(alice.get_contact("text/x-vcard"), 404)  # nothing was stored
    await alice.set_contact("text/x-vcard", b"begin:vcard\r\nn:Smythe;\tJayne\r\nend:vcard")
    assert await alice.get_contact("text/x-vcard") == b"begin:vcard\r\nn:Smythe;\tJayne\r\nend:vcard"
    await alice.create_topic("/public")
    await innocent_is_served(server)


@pytest_twisted.ensureDeferred
async def test_get_message_numbers_too_long_for_the_store_are_a_bad_request(smqp_server):
    server = await smqp_server()
    alice = await server.login()
    await alice.create_topic("/public")
    reply = await alice.publish("/public", "x1", [("text/plain", b"kept")])
    number = reply.values[1].split("/")[-1].partition("(")[0]
    for ids in ("12345678901234567890", "1-12345678901234567890", "99999999999999999999,1"):
        await refused(alice.command("GET", "MESSAGE", "/public", ids), 400)
    assert (await alice.command("LIST", "MESSAGE", "/public")).values == (number,)
    await innocent_is_served(server)


@pytest_twisted.ensureDeferred
async def test_one_account_cannot_take_every_topic(smqp_server):
    server = await smqp_server(smqp_max_topics_per_account=5)
    alice = await server.login()
    await alice.create_topic("/public")
    for i in range(4):
        await alice.create_topic(f"/public/t{i}")
    await refused(alice.create_topic("/public/t4"), 414)  # alice's quota
    await innocent_is_served(server)
    bob = await server.login("bob", "c1")
    await bob.create_topic("/public/bobs")  # the others' topics are not hers
    await alice.remove_topic("/public/t0")
    await alice.create_topic("/public/t4")  # a removed topic frees its place
    await refused(alice.create_topic("/public/t5"), 414)
    await server.stop()  # the quota survives a restart: it is counted from the stored topics
    restarted = await smqp_server(smqp_max_topics_per_account=5)
    again = await restarted.login()
    await refused(again.create_topic("/public/t6"), 414)


@pytest_twisted.ensureDeferred
async def test_timeout_infinite_needs_administer_permission(smqp_server, tmp_path):
    ual = tmp_path / "smqp.ual"
    ual.write_text("/  @accounts  psacr\n/public  bob  ps\n")
    server = await smqp_server(ual_file=ual)
    alice = await server.login()
    await alice.create_topic("/public")
    bob = await server.login("bob", "c1")
    await refused(bob.publish("/public", "b1", [("text/plain", b"forever")], [("Timeout", "INFINITE")]), 403)
    await refused(bob.publish("/public", "b2", [("text/plain", b"forever")], [("Timeout", "INF")]), 403)
    assert (await bob.publish("/public", "b3", [("text/plain", b"a day")], [("Timeout", "01:00:00:00")])).code == 200
    assert (await alice.publish("/public", "a1", [("text/plain", b"state")], [("Timeout", "INFINITE")])).code == 200
    assert await alice.count("MESSAGE", "/public") == 2
    await innocent_is_served(server)


@pytest_twisted.ensureDeferred
async def test_a_whole_message_is_bounded_in_bytes(smqp_server):
    server = await smqp_server()
    alice = await server.login()
    await alice.create_topic("/public")
    attribute = "v" * 4000
    headers = [(f"X-H{i}", attribute) for i in range(60)]
    sections = [("text/plain", b"d" * 60_000) for _ in range(16)]  # 960 KB of data: under 1 MiB
    section_attributes = b"".join(b"X-S%d: %s\r\n" % (i, attribute.encode()) for i in range(14))
    body = encode_body(Body((("Created", format_datetime(time.time())), *headers),
                            tuple(Section((("Content-Type", kind),), data) for kind, data in sections)))
    body = body.replace(b"Content-Type: text/plain\r\n", b"Content-Type: text/plain\r\n" + section_attributes)
    assert len(body) > 2 << 20  # attributes and data: 2.2 MB
    await refused(alice.send_raw(b"PUBLISH MESSAGE /public big\r\n" + body), 413)
    assert (await alice.noop()).code == 200
    assert await alice.count("MESSAGE", "/public") == 0
    # 12 KB of X- attributes: the message's user properties, under --max-property-bytes
    small = await alice.publish("/public", "ok", [("text/plain", b"d" * 60_000)], headers[:3])
    assert small.code == 200
    await innocent_is_served(server)


@pytest_twisted.ensureDeferred
async def test_get_message_is_written_as_the_client_reads(smqp_server):
    limit = 64 * 1024
    server = await smqp_server(max_output_buffer=limit)
    alice = await server.login()
    await alice.create_topic("/big")
    size = 900_000
    for i in range(12):  # ~10.8 MB in the topic
        await alice.publish("/big", f"m{i}", [("application/octet-stream", b"%02d" % i + b"x" * size)])
    greedy = await raw_login(server, "guest", "g1", read=False)
    greedy.transport.write(b"GET MESSAGE /big *\r\n" * 3 + b"NOOP\r\n")
    session = next(iter(server.factory.sessions["guest"]))
    await called(session, "pauseProducing", lambda: session._paused_output)  # the reply paused
    transport = session.transport
    queued = len(transport.dataBuffer) - transport.offset + transport._tempDataLen
    assert queued <= limit + size + 64 * 1024  # the output limit and one message

    # an innocent client is served meanwhile, and a reader gets the whole answer
    await innocent_is_served(server)
    reader = await raw_login(server, "guest", "g2")
    reader.transport.write(b"GET MESSAGE /big 1-9999\r\nNOOP\r\n")
    await reader.until(lambda got: got.endswith(b"\r\n.\r\n.\r\n200 OK\r\n"))
    assert reader.received.startswith(b"200 OK\r\nTopic: /big\r\n")
    assert reader.received.count(b"Topic: /big\r\n") == 12
    assert [reader.received.find(b"\r\n\r\n%02d" % i) > 0 for i in range(12)] == [True] * 12

    # the greedy client leaves: its reply is dropped, nothing of it is kept
    kept = weakref.ref(session)
    greedy.transport.abortConnection()
    await called(session, "connectionLost", lambda: "guest" not in server.factory.sessions
                 or session not in server.factory.sessions["guest"])  # the session ended
    assert session._stream is None or session._stream._finished
    del session, transport

    def freed() -> bool:
        gc.collect()
        return kept() is None

    # a store read still in flight holds the session until it comes back: wait for that
    await eventually(freed, "the session to be freed")


@pytest_twisted.ensureDeferred
async def test_notification_queues_are_bounded_in_bytes_and_respect_the_output_limit(smqp_server):
    limit, queued_limit, size = 64 * 1024, 1 << 20, 200_000
    server = await smqp_server(max_output_buffer=limit, smqp_max_queued_bytes=queued_limit)
    alice = await server.login()
    await alice.create_topic("/news")
    slow = await raw_login(server, "alice", "slow", b"SUBSCRIBE MESSAGE /news\r\n", read=False)
    session = server.factory.service.outboxes["alice:slow"].session
    outbox = session.outbox

    # 40 notifications that need no acknowledgement: 8 MB for a client that does not read
    bob = await server.login("bob", "c1")
    bob.transport.write(b"".join(volatile_publish("/news", f"v{i}", b"%02d" % i + b"v" * size)
                                 for i in range(40)))
    assert (await bob.noop()).code == 200
    await called(session, "pauseProducing", lambda: session._paused_output)  # the slow session paused
    transport = session.transport
    queued = len(transport.dataBuffer) - transport.offset + transport._tempDataLen
    assert queued <= limit + 64 * 1024 + size  # the output limit, one batch, one notification
    assert outbox.volatile_bytes <= queued_limit
    assert outbox.dropped >= 1

    # guaranteed messages wait in the store; the window holds at most queued_limit of them
    for i in range(8):
        await bob.publish("/news", f"g{i}", [("application/octet-stream", b"g" * 900_000)])
    assert outbox.window_bytes <= queued_limit + 900_000

    await innocent_is_served(server)

    # once it reads, it gets what was kept, whole and in order
    kept = 40 - outbox.dropped
    slow.transport.resumeProducing()
    await slow.until(lambda got: got.count(b"NOTIFY MESSAGE /news ADD\r\n") >= kept + 1)
    numbers = body_numbers(slow.received, b"v")
    assert numbers == sorted(numbers) and len(numbers) == kept


@pytest_twisted.ensureDeferred
async def test_the_window_refill_reads_at_most_the_queued_bytes_limit(smqp_server):
    """A subscriber whose 12 pending messages of 900 KB wait while it is away logs in and
    reads nothing: the store read that fills its window brings back at most
    ``--smqp-max-queued-bytes`` of bodies and one message (not the 256 of the window), and
    the window holds no more.  Once it reads and acknowledges, all 12 arrive in order."""
    limit, queued_limit, size = 64 * 1024, 1 << 20, 900_000
    message = size + 4096  # one stored message: its data and its headers
    server = await smqp_server(max_output_buffer=limit, smqp_max_queued_bytes=queued_limit)
    alice = await server.login()
    await alice.create_topic("/news")
    away = await raw_login(server, "alice", "slow", b"SUBSCRIBE MESSAGE /news\r\n")
    ended = called(server.factory.service.outboxes["alice:slow"].session, "connectionLost",
                   lambda: "alice:slow" not in server.factory.service.outboxes)
    away.transport.abortConnection()
    await ended
    for i in range(12):  # ~10.8 MB pending for alice:slow
        await alice.publish("/news", f"m{i}", [("application/octet-stream", b"%02d" % i + b"x" * size)])

    store = server.factory.service.durable.store
    reads: list[int] = []
    pending = store.pending

    def measured(*args, **kwargs):
        return pending(*args, **kwargs).addCallback(
            lambda found: reads.append(sum(len(d.data) for d in found)) or found)

    store.pending = measured
    slow = await raw_login(server, "alice", "slow", read=False)
    outbox = server.factory.service.outboxes["alice:slow"]
    await called(outbox, "_send", lambda: reads and outbox.inflight is not None)  # the window was read
    assert max(reads) <= queued_limit + message  # the limit and one message, never 256 of them
    assert outbox.window_bytes <= queued_limit + message

    await innocent_is_served(server)

    # the positive control: it reads and acknowledges, and gets every message in order
    slow.transport.resumeProducing()
    seen = 0
    while seen < 12:
        await slow.until(lambda got: got.count(b"NOTIFY MESSAGE /news ADD\r\n") > seen and got.endswith(b"\r\n.\r\n"))
        seen = slow.received.count(b"NOTIFY MESSAGE /news ADD\r\n")
        slow.transport.write(b"310 ACK\r\n")
    await slow.until(lambda got: got.count(b"310 ") >= 12)
    numbers = body_numbers(slow.received, b"x")
    assert numbers == list(range(12))
    assert max(reads) <= queued_limit + message


@pytest_twisted.ensureDeferred
async def test_a_retry_waits_for_the_output_limit_like_any_notification(smqp_server):
    """A subscriber that neither reads nor acknowledges a 900 KB message: each retry counts
    an attempt, but the message is sent again only once its output is under
    ``--max-output-buffer``, so the broker never queues it twice.  When it reads, the
    re-send arrives and its acknowledgement settles the message."""
    limit, size = 64 * 1024, 900_000
    message = size + 4096
    server = await smqp_server(max_output_buffer=limit, durable_retry_timeout=0.05, durable_max_attempts=50)
    alice = await server.login()
    await alice.create_topic("/news")
    slow = await raw_login(server, "alice", "slow", b"SUBSCRIBE MESSAGE /news\r\n", read=False)
    session = server.factory.service.outboxes["alice:slow"].session
    store = server.factory.service.durable.store
    counted = Waiter()
    attempt = store.attempt

    def counting(*args):
        return attempt(*args).addCallback(lambda n: counted(n) or n)

    store.attempt = counting
    written: list[int] = []  # what the session hands its transport (the kernel takes much of it)
    write_notify = session.write_notify

    def measured(parts):
        written.append(sum(map(len, parts)))
        return write_notify(parts)

    session.write_notify = measured
    # a small kernel send buffer: what the client does not read stays in the broker's output
    session.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    await alice.publish("/news", "big", [("application/octet-stream", b"x" * size)])
    await counted.count(1)  # a retry was counted
    assert session._paused_output
    assert len(written) == 1 and sum(written) <= message  # the first send only: no re-send past the limit
    assert server.factory.service.durable.stats["redelivered"] == 0

    await innocent_is_served(server)

    # the positive control: once it reads, the re-send comes, and its 310 settles the message
    slow.transport.resumeProducing()
    await slow.until(lambda got: got.count(b"NOTIFY MESSAGE /news ADD\r\n") >= 2 and got.endswith(b"\r\n.\r\n"))
    assert len(written) >= 2 and server.factory.service.durable.stats["redelivered"] >= 1
    outbox = server.factory.service.outboxes["alice:slow"]
    settled = called(outbox, "acknowledge", lambda: outbox.inflight is None and not outbox.settling)
    slow.transport.write(b"310 ACK\r\n")
    await slow.until(lambda got: got.endswith(b"310 ACK\r\n"))
    assert await alice.count("MESSAGE", "/news") == 1
    await settled
