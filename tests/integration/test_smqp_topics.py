"""The SMQP topic tree end to end: CREATE/REMOVE/LIST/FIND/COUNT, names, keywords, delivery,
per-topic message timeouts (our extension), virtual topics, durability across restarts,
REMOVE TOPIC dropping subscriptions, and the User Access List (a UAL file, guest
permissions, hidden topics), over real sockets with the real client."""
from __future__ import annotations


import pytest
import pytest_twisted
from twisted.logger import formatEvent, globalLogPublisher

from brokerd.protocols.smqp.client import SMQPError
from brokerd.protocols.smqp.topictree import MAX_CHILDREN
from tests.integration.smqp_fixtures import smqp_server  # noqa: F401
from tests.support.collect import eventually
from tests.support.live import SMQPInbox


async def refused(d, code: int) -> SMQPError:
    with pytest.raises(SMQPError) as info:
        await d
    assert info.value.code == code, info.value
    return info.value


@pytest_twisted.ensureDeferred
async def test_create_list_duplicate_trash_and_case(smqp_server):
    server = await smqp_server()
    alice = await server.login()
    await alice.create_topic("/Stocks")
    await alice.create_topic("/stocks/IBM", ["IBM", "BIG BLUE"])
    await alice.create_topic("/stocks/quotes")
    await refused(alice.create_topic("/STOCKS/ibm"), 409)
    await refused(alice.create_topic("/stocks/Trash"), 409)
    await refused(alice.create_topic("/nothere/x"), 404)
    await refused(alice.create_topic("/accounts/alice/x"), 403)
    assert await alice.list_topics("/stocks") == ["/Stocks/IBM", "/Stocks/quotes"]
    assert await alice.list_topics("/STOCKS/") == ["/Stocks/IBM", "/Stocks/quotes"]
    assert await alice.list_topics("/") == ["/Stocks"]
    await refused(alice.list_topics("/stocks/nope"), 404)
    await refused(alice.command("CREATE", "TOPIC", "/" + "x" * 33), 400)
    await refused(alice.command("CREATE", "TOPIC", "/9lives"), 400)


@pytest_twisted.ensureDeferred
async def test_topics_per_parent_limit(smqp_server):
    server = await smqp_server()
    server.factory.tree.max_children = 3
    alice = await server.login()
    for name in ("a", "b", "c"):
        await alice.create_topic(f"/{name}")
    error = await refused(alice.create_topic("/d"), 414)
    assert "3 topics" in str(error)
    assert MAX_CHILDREN == 1024


@pytest_twisted.ensureDeferred
async def test_keywords_delivery_and_find(smqp_server):
    server = await smqp_server()
    alice = await server.login()
    await alice.create_topic("/stocks", ["STOCKS", "TICKERS"])
    await alice.create_topic("/stocks/ibm", ["IBM", "STOCKS", "BIG BLUE"])
    await alice.create_topic("/stocks/floral", ["FLOWERS", "BLUE CARNATIONS"])
    await alice.create_topic("/stocks/floral/deep", ["BLUE, DEEP"])
    await alice.create_topic("/stocks/sony")
    assert await alice.find_topics("/stocks") == ["/stocks (STOCKS,TICKERS)"]
    assert await alice.find_topics("/stocks", ["blue"]) == [
        "/stocks/floral (FLOWERS,BLUE CARNATIONS)", "/stocks/ibm (IBM,STOCKS,BIG BLUE)"]
    assert await alice.find_topics("/stocks/*", ["BLUE"], 4) == [
        "/stocks/floral (FLOWERS,BLUE CARNATIONS)", "/stocks/floral/deep (BLUE\\, DEEP)",
        "/stocks/ibm (IBM,STOCKS,BIG BLUE)"]
    assert await alice.find_topics("/stocks/s*") == ["/stocks/sony"]
    assert await alice.find_topics("/stocks/*", ["nothing"]) == []
    await alice.set_keywords("/stocks/sony", ["Walkman", "SONY"])
    assert await alice.get_keywords("/stocks/sony") == ("Walkman", "SONY")
    assert await alice.get_delivery("/stocks/sony") == "ALL"
    await alice.set_delivery("/stocks/sony", "ONE")
    assert await alice.get_delivery("/stocks/sony") == "ONE"
    await refused(alice.command("SET", "TOPIC", "DELIVERY", "/stocks/sony", "SOME"), 400)
    assert await alice.count("TOPIC", "/stocks") == 3
    assert await alice.count("TOPIC", "/stocks/*") == 4
    assert await alice.count("MESSAGE", "/stocks/ibm") == 0
    assert await alice.count("SUBSCRIBERS", "/stocks/*") == 0


@pytest_twisted.ensureDeferred
async def test_virtual_topics(smqp_server):
    server = await smqp_server()
    alice = await server.login()
    await alice.create_topic("/info")
    await alice.create_topic("/info/cnn")
    await alice.create_topic("/info/cnn/live")
    await alice.create_topic("/news", ["BIG BLUE"], link="/info/cnn")
    assert await alice.list_topics("/") == ["/info", "/news > /info/cnn"]
    assert await alice.list_topics("/news") == ["/info/cnn/live"]
    assert await alice.get_keywords("/news") == ("BIG BLUE",)
    await alice.set_delivery("/news", "NONE")
    assert await alice.get_delivery("/info/cnn") == "NONE"
    await alice.create_topic("/news/more")
    assert "/info/cnn/more" in await alice.list_topics("/info/cnn")
    await refused(alice.create_topic("/other", link="/news"), 405)
    await refused(alice.create_topic("/other", link="/missing"), 404)
    await refused(alice.create_topic("/other", link="www.host.com/stocks"), 405)
    await alice.rename_topic("/info/cnn", "/cnn")
    assert await alice.list_topics("/") == ["/cnn", "/info", "/news > /cnn"]
    assert await alice.remove_topic("/cnn") == 0
    assert await alice.list_topics("/") == ["/info"]


@pytest_twisted.ensureDeferred
async def test_rename_and_remove(smqp_server):
    server = await smqp_server()
    alice = await server.login()
    for path in ("/stocks", "/stocks/quotes", "/stocks/quotes/ibm", "/stocks/ibm", "/old"):
        await alice.create_topic(path)
    await refused(alice.rename_topic("/stocks/quotes/ibm", "/stocks/quotes/ibm"), 409)
    await refused(alice.rename_topic("/stocks/quotes/ibm", "/stocks/ibm"), 409)
    await refused(alice.rename_topic("/stocks", "/stocks/quotes/x"), 409)
    await refused(alice.rename_topic("/accounts/alice", "/mine"), 403)
    await alice.rename_topic("/stocks/quotes/ibm", "/stocks/ibm/quote")
    assert await alice.list_topics("/stocks/ibm") == ["/stocks/ibm/quote"]
    await alice.rename_topic("/stocks", "/Shares")
    assert await alice.list_topics("/shares/ibm") == ["/Shares/ibm/quote"]
    reply = await alice.command("REMOVE", "TOPIC", "/shares")
    assert reply.lines == ("OK", "0 messages pending")
    assert await alice.list_topics("/") == ["/old"]
    await refused(alice.remove_topic("/shares"), 404)
    await refused(alice.remove_topic("/accounts/alice"), 403)
    await refused(alice.remove_topic("/"), 403)


@pytest_twisted.ensureDeferred
async def test_tree_survives_restart(smqp_server):
    server = await smqp_server()
    alice = await server.login()
    await alice.create_topic("/stocks", ["A,B"])
    await alice.create_topic("/stocks/ibm")
    await alice.create_topic("/link", link="/stocks/ibm")
    await alice.set_delivery("/stocks/ibm", "ONE")
    await alice.rename_topic("/stocks/ibm", "/stocks/IBM2")
    suid = server.factory.suid
    await server.stop()
    restarted = await smqp_server()
    again = await restarted.login("alice", "c2")
    assert await again.list_topics("/") == ["/link > /stocks/IBM2", "/stocks"]
    assert await again.get_keywords("/stocks") == ("A,B",)
    assert await again.get_delivery("/link") == "ONE"
    assert restarted.factory.suid == suid


@pytest_twisted.ensureDeferred
async def test_permissions_from_the_ual_file(smqp_server, tmp_path):
    ual = tmp_path / "ual"
    ual.write_text(
        "# test UAL\n"
        "/            @accounts  s\n"
        "/            alice      psacr\n"
        "/private     *          -\n"
        "/private     alice      psacr\n"
        "/open        guest      psc\n"
        "/shared      bob        pc\n")
    server = await smqp_server(ual_file=ual)
    alice = await server.login("alice", "c1")
    for path in ("/private", "/private/plans", "/open", "/shared", "/public"):
        await alice.create_topic(path)
    bob = await server.login("bob", "c1")
    assert await bob.list_topics("/") == ["/open", "/public", "/shared"]
    await refused(bob.list_topics("/private"), 404)
    await refused(bob.find_topics("/private"), 404)
    visible = ["/accounts/bob", "/open", "/public", "/shared"]  # his own login topic too
    assert await bob.find_topics("/*", None, 5) == visible
    assert await bob.count("TOPIC", "/*") == 4
    await refused(bob.create_topic("/public/x"), 403)
    await bob.create_topic("/shared/x")
    await refused(bob.set_keywords("/shared", ["K"]), 403)
    await refused(bob.remove_topic("/public"), 403)
    guest = await server.login("guest", "g1")
    assert await guest.list_topics("/") == ["/open", "/public", "/shared"]
    await guest.create_topic("/open/guestbook")
    await refused(guest.create_topic("/public/x"), 403)
    await refused(guest.list_topics("/accounts"), 404)
    await refused(alice.list_topics("/accounts"), 404)  # closed to everyone by default
    assert await alice.list_topics("/accounts/alice") == []  # her own: visible


@pytest_twisted.ensureDeferred
async def test_ual_file_is_reloaded(smqp_server, tmp_path):
    ual = tmp_path / "ual"
    ual.write_text("/ bob s\n")
    server = await smqp_server(ual_file=ual)
    bob = await server.login("bob", "c1")
    await refused(bob.create_topic("/x"), 403)
    logged: list[str] = []

    def observe(event: dict) -> None:
        if "UAL file" in event.get("log_format", ""):
            logged.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        ual.write_text("/ bob psacr   # now bob may create\n")
        await server.factory.reload_ual()
        await bob.create_topic("/x")
        assert [line for line in logged if "reloaded (1 entries)" in line], logged
        ual.write_text("/ bob zzz\n")  # a broken file keeps the last good list
        await server.factory.reload_ual()
    finally:
        globalLogPublisher.removeObserver(observe)
    assert "line 1: unknown permission 'z'" in logged[-1] and logged[-1].startswith("UAL file not reloaded, the old one stays"), logged
    await bob.create_topic("/y")


@pytest_twisted.ensureDeferred
async def test_guest_permissions_setting(smqp_server):
    server = await smqp_server(smqp_guest_permissions="psc")
    guest = await server.login("guest", "g1")
    await guest.create_topic("/guests")
    assert await guest.list_topics("/") == ["/guests"]


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_topic_timeout_expires_messages_into_the_trash_and_survives_restart(smqp_server):
    """Over real sockets with a second of real time, so not in the quick loop: the expiry rules
    themselves are tests/protocols/smqp/test_topic_extras.py's, on a Clock; this one adds the
    timeouts surviving a restart."""
    server = await smqp_server()
    alice = await server.login()
    for path in ("/short", "/short/child", "/long"):
        await alice.create_topic(path)
    assert await alice.get_timeout("/short/child") == (86400.0, "SERVER")
    await alice.set_timeout("/short", 1)
    assert await alice.get_timeout("/short/child") == (1.0, "/short")  # inherited
    bob = await server.login("bob", "b1")
    await bob.subscribe("/short/child")
    await bob.quit()  # away: the deliveries stay pending until the messages expire
    await alice.publish("/short", "S1", [("text/plain", b"gone in a second")])
    await alice.publish("/short/child", "S2", [("text/plain", b"gone too")])
    await alice.publish("/short", "S3", [("text/plain", b"state")], [("Timeout", "INFINITE")])
    await alice.publish("/long", "L1", [("text/plain", b"the server default")])

    async def expired() -> bool:
        return await alice.count("MESSAGE", "/short/Trash") == 1 and \
            await alice.count("MESSAGE", "/short/child/Trash") == 1

    await eventually(expired, "the messages to expire into the Trash")
    assert await alice.count("MESSAGE", "/short") == 1  # the INFINITE one stays
    assert await alice.count("MESSAGE", "/short/child") == 0
    assert await alice.count("MESSAGE", "/long") == 1
    await alice.set_timeout("/short/child", None)
    await server.stop()
    restarted = await smqp_server()
    again = await restarted.login("alice", "c2")
    assert await again.get_timeout("/short") == (1.0, "/short")
    assert await again.get_timeout("/short/child") == (None, "/short/child")
    await again.set_timeout("/short/child", "DEFAULT")
    assert await again.get_timeout("/short/child") == (1.0, "/short")
    bob = await restarted.login("bob", "b1")
    await refused(bob.command("GET", "TOPIC", "TIMEOUT", "/nothere"), 404)
    await refused(bob.command("SET", "TOPIC", "TIMEOUT", "/short", "forever"), 400)


@pytest_twisted.ensureDeferred
async def test_remove_topic_drops_subscriptions_durably(smqp_server):
    server = await smqp_server()
    alice = await server.login()
    for path in ("/news", "/news/eu", "/weather"):
        await alice.create_topic(path)
    bob = await server.login("bob", "b1")
    inbox = SMQPInbox(bob)
    await bob.subscribe("/news/eu")
    await bob.subscribe("/weather")
    await bob.command("SUB", "TOPIC", "DELETE", "/news/eu")
    away = await server.login("alice", "away")  # a subscriber not logged in when the topic goes
    await away.subscribe("/news/*")
    await away.quit()
    assert await alice.count("SUBSCRIBERS", "/news/eu") == 1
    assert await alice.remove_topic("/news") == 0
    notice = await inbox.next()
    assert (notice.kind, notice.args) == ("TOPIC", ("/news/eu", "DELETE"))
    assert await inbox.quiet()  # and only that one
    assert list((await bob.command("LIST", "SUBSCRIPTIONS")).values) == ["/weather"]
    await alice.create_topic("/news")
    await alice.create_topic("/news/eu")
    assert await alice.count("SUBSCRIBERS", "/news/eu") == 0
    await server.stop()
    restarted = await smqp_server()
    bob = await restarted.login("bob", "b1")
    assert list((await bob.command("LIST", "SUBSCRIPTIONS")).values) == ["/weather"]
    away = await restarted.login("alice", "away")
    assert (await away.command("LIST", "SUBSCRIPTIONS")).values == ()

