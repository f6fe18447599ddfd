"""``brokerd-smqp`` against a real SMQP server on a loopback port: each subcommand's output,
refusals (exit 1) and connection problems (exit 2)."""
from __future__ import annotations

import io

import pytest
import pytest_twisted
from twisted.internet import reactor

from brokerd.cli import smqp as cli
from tests.integration.smqp_fixtures import smqp_server  # noqa: F401
from tests.support.broker import free_port


async def run(server, *argv: str, stdin: str = "") -> tuple[int, str]:
    port = server.port_number if server is not None else free_port()  # None: nothing listens there
    args = cli.build_parser().parse_args(["-H", "127.0.0.1", "-p", str(port), *argv])
    out = io.StringIO()
    try:
        await cli.run(reactor, args, io.StringIO(stdin), out)
    except SystemExit as exc:
        return int(exc.code), out.getvalue()
    return 0, out.getvalue()


@pytest_twisted.ensureDeferred
async def test_topic_commands(smqp_server, tmp_path, monkeypatch):
    server = await smqp_server()
    monkeypatch.setenv(cli.PASSWORD_ENV, "alicepw")
    alice = ("-u", "alice", "-c", "cli1")
    code, out = await run(server, *alice, "login")
    assert code == 0 and "Topic: /accounts/alice/cli1\n" in out
    assert await run(server, *alice, "create", "/stocks", "-k", "STOCKS, TICKERS") == (0, "")
    assert await run(server, *alice, "create", "/stocks/ibm", "-k", "BIG BLUE") == (0, "")
    assert await run(server, *alice, "create", "/ibm", "--link", "/stocks/ibm") == (0, "")
    assert await run(server, *alice, "list") == (0, "/ibm > /stocks/ibm\n/stocks\n")
    assert await run(server, *alice, "find", "/stocks/*", "-k", "blue") == (0, "/stocks/ibm (BIG BLUE)\n")
    assert await run(server, *alice, "count", "topic", "/stocks") == (0, "1\n")
    assert await run(server, *alice, "keywords", "/stocks/ibm", "IBM", "BIG BLUE") == (0, "")
    assert await run(server, *alice, "keywords", "/stocks/ibm") == (0, "IBM\nBIG BLUE\n")
    assert await run(server, *alice, "delivery", "/stocks/ibm", "one") == (0, "")
    assert await run(server, *alice, "delivery", "/ibm") == (0, "ONE\n")
    assert await run(server, *alice, "timeout", "/ibm") == (0, "01:00:00:00 (from SERVER)\n")
    assert await run(server, *alice, "timeout", "/stocks", "90") == (0, "")
    assert await run(server, *alice, "timeout", "/ibm") == (0, "00:00:01:30 (from /stocks)\n")
    assert await run(server, *alice, "timeout", "/stocks/ibm", "inf") == (0, "")
    assert await run(server, *alice, "timeout", "/stocks/ibm") == (0, "INFINITE (from /stocks/ibm)\n")
    assert (await run(server, "timeout", "/stocks", "60"))[0] == cli.EXIT_REFUSED  # the guest
    assert await run(server, *alice, "rename", "/stocks/ibm", "/stocks/IBM2") == (0, "")
    assert await run(server, *alice, "remove", "/stocks") == (0, "0 messages pending\n")
    assert await run(server, *alice, "channel") == (0, "cli1\n")
    code, out = await run(server, *alice, "raw", "COUNT TOPIC /", "FROB")
    assert code == 0 and out.startswith("200-OK\n200 ") and out.endswith("500 Unknown command FROB\n")


@pytest_twisted.ensureDeferred
async def test_refusals_and_guest(smqp_server, monkeypatch):
    server = await smqp_server()
    monkeypatch.delenv(cli.PASSWORD_ENV, raising=False)
    assert await run(server, "list") == (0, "")  # guest, blank password
    assert (await run(server, "create", "/x"))[0] == cli.EXIT_REFUSED
    monkeypatch.setenv(cli.PASSWORD_ENV, "wrong")
    assert (await run(server, "-u", "bob", "login"))[0] == cli.EXIT_REFUSED
    assert (await run(None, "list"))[0] == cli.EXIT_ERROR


@pytest_twisted.ensureDeferred
async def test_password_and_contact(smqp_server, tmp_path, monkeypatch):
    server = await smqp_server()
    monkeypatch.setenv(cli.PASSWORD_ENV, "bobpw")
    new = tmp_path / "new"
    new.write_text("bob2\n")
    assert await run(server, "-u", "bob", "passwd", "--new-password-file", str(new)) == (0, "")
    monkeypatch.setenv(cli.PASSWORD_ENV, "bob2")
    card = "begin:vcard\nn:Bob\nend:vcard\n"
    assert await run(server, "-u", "bob", "contact", "--set", "-", stdin=card) == (0, "")
    assert await run(server, "-u", "bob", "contact") == (0, card)
    assert (await run(server, "-u", "bob", "contact", "--mime", "text/html"))[0] == cli.EXIT_REFUSED


@pytest.mark.parametrize("argv", [["count", "lots", "/"], ["delivery", "/a", "SOME"], ["timeout", "/a", "soon"], []])
def test_usage_errors(argv):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(argv)
    assert exc.value.code == 2


@pytest_twisted.ensureDeferred
async def test_pub_and_sub(smqp_server, tmp_path, monkeypatch):
    server = await smqp_server()
    monkeypatch.setenv(cli.PASSWORD_ENV, "alicepw")
    alice = ("-u", "alice", "-c", "pubsub")
    assert await run(server, *alice, "create", "/quotes") == (0, "")
    code, out = await run(server, *alice, "pub", "/quotes", "IBM 132.5")
    assert code == 0 and len(out.split()) == 2  # CMUID and SMUID
    data = tmp_path / "blob"
    data.write_bytes(b"\x00\x01binary")
    code, _ = await run(server, *alice, "pub", "/quotes", "-f", str(data), "-t", "application/octet-stream",
                        "--header", "Priority:1")
    assert code == 0
    # The subscription is durable: both messages wait for the subscriber, in priority order.
    code, out = await run(server, *alice, "sub", "/quotes", "-C", "2")
    assert code == 0
    assert out.splitlines() == ["/quotes IBM 132.5", "/quotes [application/octet-stream 8 bytes]"] or \
        out.splitlines() == ["/quotes [application/octet-stream 8 bytes]", "/quotes IBM 132.5"]
    assert (await run(server, *alice, "pub", "/quotes"))[0] == cli.EXIT_ERROR
    assert (await run(server, *alice, "pub", "/quotes", "x", "--header", "bad"))[0] == cli.EXIT_ERROR
    assert (await run(server, *alice, "pub", "/nowhere", "x"))[0] == cli.EXIT_REFUSED


@pytest_twisted.ensureDeferred
async def test_sub_with_a_notification_window(smqp_server, monkeypatch, capsys):
    server = await smqp_server(smqp_max_notify_window=8)
    monkeypatch.setenv(cli.PASSWORD_ENV, "alicepw")
    alice = ("-u", "alice", "-c", "win")
    assert await run(server, *alice, "create", "/w") == (0, "")
    assert await run(server, *alice, "sub", "/w", "-C", "0", "--keep") == (0, "")
    for i in range(12):
        assert (await run(server, *alice, "pub", "/w", f"m{i}"))[0] == 0
    code, out = await run(server, *alice, "sub", "/w", "-C", "6", "--window", "4", "--keep")
    assert (code, out.splitlines()) == (0, [f"/w m{i}" for i in range(6)])
    # Over the server's maximum: refused, one at a time instead, nothing lost or repeated.
    code, out = await run(server, *alice, "sub", "/w", "-C", "6", "--window", "9")
    assert (code, out.splitlines()) == (0, [f"/w m{i}" for i in range(6, 12)])
    assert "refused a window of 9" in capsys.readouterr().err
    assert server.factory.service.stats["acked"] == 12
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["sub", "/w", "--window", "0"])
