"""SMQP attacked as a user would, on real sockets: framing that could run a message body as
commands, input that could never be answered, numbers the store cannot hold.  After each, the
server keeps serving the attacker's next command and an innocent client."""
from __future__ import annotations

import time

import pytest
import pytest_twisted

from brokerd.protocols.smqp.client import SMQPError
from brokerd.protocols.smqp.codec import encode_body, format_datetime
from brokerd.protocols.smqp.events import Body, Section
from tests.integration.smqp_fixtures import smqp_server  # noqa: F401


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
    bob = await server.login("bob", "innocent")
    assert (await bob.noop()).code == 200
    assert "/public" in await bob.list_topics("/")


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
