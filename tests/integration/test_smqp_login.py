"""SMQP sessions end to end: greeting, LOGIN/PASS, the guest, several channels, timeouts,
SET LOGIN PASSWORD/CONTACT, GET LOGIN CHANNEL, NOOP, QUIT, malformed commands, and SMQPS
with CERT login, over real loopback sockets with the real client."""
from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Protocol
from twisted.internet.protocol import ClientFactory

from brokerd.auth.accounts import read_accounts
from brokerd.auth.tls import ServerTLS
from brokerd.protocols.smqp.client import SMQPError
from brokerd.protocols.smqp.codec import MAX_LINE, parse_datetime
from brokerd.protocols.smqp.login import MAX_LOGIN_FAILURES
from brokerd.protocols.smqp.server import SERVER_IDENT
from tests.integration.smqp_fixtures import ACCOUNTS, smqp_server, write_test_accounts  # noqa: F401
from tests.support.fixtures import pki  # noqa: F401


class RawClient(Protocol):
    """Raw bytes in and out, for byte-exact checks."""

    def __init__(self) -> None:
        self.data = b""
        self.closed: Deferred = Deferred()
        self.waiting: list[tuple[bytes, Deferred]] = []

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        for item in list(self.waiting):
            if item[0] in self.data:
                self.waiting.remove(item)
                item[1].callback(self.data)

    def until(self, marker: bytes) -> Deferred:
        """Fires with everything received once ``marker`` is in it."""
        if marker in self.data:
            return _fired(self.data)
        d: Deferred = Deferred()
        self.waiting.append((marker, d))
        return d.addTimeout(5, reactor)

    def connectionLost(self, reason=None) -> None:
        self.closed.callback(self.data)


def _fired(value):
    d: Deferred = Deferred()
    d.callback(value)
    return d


async def raw(server) -> RawClient:
    factory = ClientFactory.forProtocol(RawClient)
    client = await TCP4ClientEndpoint(reactor, "127.0.0.1", server.port_number).connect(factory)
    await client.until(b"\r\n")
    return client


@pytest_twisted.ensureDeferred
async def test_greeting_login_and_attributes(smqp_server):
    server = await smqp_server()
    client = await raw(server)
    assert client.data == f"SMQP/1.0 Ready. {SERVER_IDENT}\r\n".encode()
    client.transport.write(b"LOGIN alice:orange CLEAR/1.0\r\n")
    await client.until(b"200 OK\r\n")
    client.transport.write(b"PASS alice alicepw\r\n")
    await client.until(b"Suid: ")
    data = await client.until(f"Suid: {server.factory.suid}\r\n".encode())
    lines = data.split(b"\r\n")
    assert lines[1] == b"200 OK"
    assert lines[2] == b"200-OK"
    assert lines[3] == b"200-Topic: /accounts/alice/orange"
    assert lines[4] == b"200-Timeout: 01:00:00:00"
    assert lines[5].startswith(b"200-Time: D")
    parse_datetime(lines[5][len(b"200-Time: "):].decode())
    assert lines[6].startswith(b"200 Suid: ")
    client.transport.loseConnection()
    await client.closed


@pytest_twisted.ensureDeferred
async def test_wrong_password_unknown_account_and_method(smqp_server):
    server = await smqp_server()
    client = await server.connect()
    await client.command("LOGIN", "bob:c1", "CLEAR/1.0")
    with pytest.raises(SMQPError) as wrong:
        await client.command("PASS", "bob", "nope")
    assert wrong.value.code == 401
    with pytest.raises(SMQPError) as unknown:
        await client.command("LOGIN", "nobody:c1", "CLEAR/1.0")
    assert unknown.value.code == 404
    other = await server.connect()
    with pytest.raises(SMQPError) as method:
        await other.command("LOGIN", "alice:c1", "KERBEROS/5.0")
    assert method.value.code == 405
    assert method.value.lines == ("Not allowed", "Methods: CLEAR/1.0")
    info = await other.login("alice", "c1", "alicepw")  # the session goes on after 405
    assert info.topic == "/accounts/alice/c1"


@pytest_twisted.ensureDeferred
async def test_too_many_failures_close_the_connection(smqp_server):
    server = await smqp_server()
    client = await server.connect()
    for attempt in range(MAX_LOGIN_FAILURES):
        await client.command("LOGIN", "bob:c1", "CLEAR/1.0")
        with pytest.raises(SMQPError):
            await client.command("PASS", "bob", f"wrong{attempt}")
    await client.when_closed()


@pytest_twisted.ensureDeferred
async def test_guest_blank_password_and_read_only(smqp_server):
    server = await smqp_server()
    guest = await server.connect()
    info = await guest.login("guest", "g1")
    assert info.topic == "/accounts/guest/g1"
    assert await guest.list_topics("/") == []
    with pytest.raises(SMQPError) as refused:
        await guest.create_topic("/news")
    assert refused.value.code == 403
    with pytest.raises(SMQPError) as wrong:
        await (await server.connect()).login("guest", "g2", "notblank")
    assert wrong.value.code == 401


@pytest_twisted.ensureDeferred
async def test_no_smqp_guest_refuses_the_guest_only(smqp_server, tmp_path):
    """--no-smqp-guest (Settings.smqp_guest False): the built-in guest's blank-password LOGIN
    is refused like an unknown account's, while an account still logs in on the same server."""
    accounts = tmp_path / "no-guest-accounts"
    write_test_accounts(accounts, {"alice": ACCOUNTS["alice"]})
    server = await smqp_server(smqp_guest=False, accounts_file=accounts)
    with pytest.raises(SMQPError) as refused:
        await (await server.connect()).login("guest", "g1")
    assert refused.value.code == 404  # as for any account that does not exist
    alice = await server.login("alice", "c1")
    assert await alice.list_topics("/") == []


@pytest_twisted.ensureDeferred
async def test_several_channels_of_one_account(smqp_server):
    server = await smqp_server()
    first = await server.login("alice", "c1")
    second = await server.login("alice", "c2")
    assert await first.get_channel() == "c1"
    assert await second.get_channel() == "c2"
    assert len(server.factory.sessions["alice"]) == 2
    assert server.runtime.broker.session_for("smqp", b"smqp:alice:c1") is not None


@pytest_twisted.ensureDeferred
async def test_same_channel_again_replaces_the_older_connection(smqp_server):
    server = await smqp_server()
    older = await server.login("alice", "c1")
    newer = await server.login("alice", "c1")
    await older.when_closed()
    await newer.noop()
    assert server.runtime.broker.session_for("smqp", b"smqp:alice:c1") is not None


@pytest_twisted.ensureDeferred
async def test_order_and_state_errors(smqp_server):
    server = await smqp_server()
    client = await server.connect()
    for words, code in ((("LIST", "TOPIC", "/"), 403), (("PASS", "alice", "alicepw"), 503),
                        (("FROBNICATE",), 500)):
        with pytest.raises(SMQPError) as refused:
            await client.command(*words)
        assert refused.value.code == code
    await client.noop()
    await client.login("alice", "c1", "alicepw")
    with pytest.raises(SMQPError) as again:
        await client.command("LOGIN", "alice:c2", "CLEAR/1.0")
    assert again.value.code == 503


@pytest_twisted.ensureDeferred
async def test_login_timeout(smqp_server):
    server = await smqp_server(login_timeout=0.2)
    client = await raw(server)
    data = await client.closed
    assert data.endswith(b"421 Login timeout: no login within 0.2 s\r\n")


@pytest_twisted.ensureDeferred
async def test_malformed_lines_get_replies_and_the_session_survives(smqp_server):
    server = await smqp_server()
    client = await raw(server)
    client.transport.write(b"X" * (MAX_LINE + 10) + b"\r\n\xff\xfe\r\nCREATE TOPIC bad\r\nNOOP\r\n")
    data = await client.until(b"200 OK\r\n")
    replies = data.split(b"\r\n")[1:5]
    assert [r[:4] for r in replies] == [b"400 ", b"400 ", b"400 ", b"200 "]


@pytest_twisted.ensureDeferred
async def test_quit_closes_and_noop(smqp_server):
    server = await smqp_server()
    client = await server.login()
    assert (await client.noop()).code == 200
    reply = await client.quit()
    assert reply.code == 200
    await client.when_closed()


@pytest_twisted.ensureDeferred
async def test_set_login_password(smqp_server):
    server = await smqp_server()
    client = await server.login("bob", "c1")
    with pytest.raises(SMQPError) as wrong_old:
        await client.set_password("wrong", "newpw")
    assert wrong_old.value.code == 401
    with pytest.raises(SMQPError) as kerberos:
        await client.command("SET", "LOGIN", "PASSWORD", "KERBEROS/4.0")
    assert kerberos.value.code == 405
    await client.set_password("bobpw", "bob new pw")
    assert "bob" in read_accounts(server.settings.accounts_file)
    again = await server.connect()
    await again.login("bob", "c2", "bob new pw")
    with pytest.raises(SMQPError) as old:
        await (await server.connect()).login("bob", "c3", "bobpw")
    assert old.value.code == 401
    guest = await server.connect()
    await guest.login("guest", "g")
    with pytest.raises(SMQPError) as refused:
        await guest.command("SET", "LOGIN", "PASSWORD", "CLEAR/1.0")
    assert refused.value.code == 403


@pytest_twisted.ensureDeferred
async def test_contact_is_stored_as_given_and_survives_restart(smqp_server):
    server = await smqp_server()
    alice = await server.login("alice", "c1")
    vcard = b"begin:vcard\r\nversion:2.1\r\nn:Jayne;Smythe\r\ntel;home;voice:(201)555-1212\r\nend:vcard"
    await alice.set_contact("text/x-vcard", vcard)
    assert await alice.get_contact("text/x-vcard") == vcard
    with pytest.raises(SMQPError) as other_format:
        await alice.get_contact("text/html")
    assert other_format.value.code == 400
    bob = await server.login("bob", "c1")
    assert await bob.get_contact("text/x-vcard", "alice") == vcard
    with pytest.raises(SMQPError) as none:
        await bob.get_contact("text/x-vcard")
    assert none.value.code == 404
    await server.stop()
    restarted = await smqp_server()
    again = await restarted.login("alice", "c9")
    assert await again.get_contact("text/x-vcard") == vcard


@pytest_twisted.ensureDeferred
async def test_pipelined_commands_are_answered_in_order(smqp_server):
    server = await smqp_server()
    client = await raw(server)
    client.transport.write(
        b"LOGIN alice:p1 CLEAR/1.0\r\nPASS alice alicepw\r\nCREATE TOPIC /pipe\r\n"
        b"CREATE TOPIC /pipe/a\r\nCREATE TOPIC /pipe\r\nLIST TOPIC /pipe\r\nQUIT\r\n")
    data = await client.closed
    codes = [line[:4] for line in data.split(b"\r\n")[1:] if line and line[3:4] == b" "]
    assert codes == [b"200 ", b"200 ", b"200 ", b"200 ", b"409 ", b"200 ", b"200 "]
    assert b"200 /pipe/a\r\n" in data


@pytest_twisted.ensureDeferred
async def test_smqps_cert_login(smqp_server, pki):
    tls = ServerTLS.from_files(pki.server.cert, pki.server.key, pki.ca)
    server = await smqp_server(tls=tls)
    client = await server.connect(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    info = await client.login_cert("alice", "tls1")
    assert info.topic == "/accounts/alice/tls1"
    with pytest.raises(SMQPError) as not_named:
        await (await server.connect(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)).login_cert("bob", "x")
    assert not_named.value.code == 401
    plain = await server.connect(ca=pki.ca)
    with pytest.raises(SMQPError) as no_cert:
        await plain.login_cert("alice", "x")
    assert no_cert.value.code == 405
    assert no_cert.value.lines[-1] == "Methods: CLEAR/1.0"
    await plain.login("alice", "tls2", "alicepw")


@pytest_twisted.ensureDeferred
async def test_smqps_cert_login_needs_a_listed_account(smqp_server, pki, tmp_path):
    """The CA vouches for the name; the accounts file says who may use SMQP."""
    only_bob = tmp_path / "only-bob"
    write_test_accounts(only_bob, {"bob": ACCOUNTS["bob"]})
    tls = ServerTLS.from_files(pki.server.cert, pki.server.key, pki.ca)
    server = await smqp_server(tls=tls, accounts_file=only_bob)
    client = await server.connect(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    with pytest.raises(SMQPError) as unlisted:
        await client.login_cert("alice", "tls1")
    assert unlisted.value.code == 404
    assert server.runtime.broker.session_for("smqp", b"smqp:alice:tls1") is None
    await client.login("bob", "c1", ACCOUNTS["bob"])
    assert server.runtime.broker.session_for("smqp", b"smqp:bob:c1") is client_session(server, "bob")


def client_session(server, account):
    (session,) = server.factory.sessions[account]
    return session


@pytest_twisted.ensureDeferred
async def test_unavailable_store_says_not_available(smqp_server, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    server = await smqp_server(data_dir=blocker)
    assert server.factory.start_error is not None
    client = await TCP4ClientEndpoint(reactor, "127.0.0.1", server.port_number).connect(
        ClientFactory.forProtocol(RawClient))
    data = await client.closed
    assert data == f"SMQP/1.0 Not Available. {SERVER_IDENT}\r\n".encode()
