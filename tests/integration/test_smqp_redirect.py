"""SMQP 311 Redirect (draft 4.1.1) over real sockets: with --smqp-redirect, a LOGIN over a
connection limit, or during shutdown, is answered ``311-Redirect request`` / ``311 host:port``
and the connection closed; without it the server still says ``SMQP/1.0 Not Available.``."""
from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionClosed

from brokerd.errors import ConfigurationError
from brokerd.protocols.smqp.client import SMQPError, connect
from brokerd.protocols.smqp.factory import parse_redirects
from tests.integration.smqp_fixtures import smqp_server  # noqa: F401


async def login_refused(client, code: int) -> SMQPError:
    with pytest.raises(SMQPError) as info:
        await client.login("bob", "c1", "bobpw")
    assert info.value.code == code, info.value
    return info.value


@pytest_twisted.ensureDeferred
async def test_login_over_the_connection_limit_is_redirected_in_turn(smqp_server):
    server = await smqp_server(smqp_redirect="127.0.0.1:7801, 127.0.0.1:7802")
    server.runtime.broker.admissions.max_listener_connections = 1
    first = await server.login("alice", "c1")  # under the limit: a normal login
    assert (await first.noop()).lines == ("OK",)
    for target in ("127.0.0.1:7801", "127.0.0.1:7802", "127.0.0.1:7801"):
        extra = await server.connect()
        assert extra.server.status.lower() == "ready"  # greeted, so that it may send LOGIN
        error = await login_refused(extra, 311)
        assert error.lines == ("Redirect request", target)
        await extra.when_closed()
    assert server.factory.redirecting == 0
    assert server.runtime.broker.stats.connections == 1  # the redirected ones were never admitted


@pytest_twisted.ensureDeferred
async def test_without_redirect_targets_the_limit_says_not_available(smqp_server):
    server = await smqp_server()
    server.runtime.broker.admissions.max_listener_connections = 1
    await server.login("alice", "c1")
    with pytest.raises(ConnectionClosed, match="not available"):
        await connect(TCP4ClientEndpoint(reactor, "127.0.0.1", server.port_number))


@pytest_twisted.ensureDeferred
async def test_login_during_shutdown_is_redirected(smqp_server):
    server = await smqp_server(smqp_redirect="192.0.2.9:720")
    waiting = await server.connect()  # greeted, not logged in yet
    before = await server.login("alice", "c1")
    assert (await before.noop()).code == 200
    server.factory.stopFactory()  # what twistd does when the listener stops
    error = await login_refused(waiting, 311)
    assert error.lines == ("Redirect request", "192.0.2.9:720")


def test_redirect_targets_are_checked():
    assert parse_redirects("a.example:720 192.0.2.1:7720") == ("a.example:720", "192.0.2.1:7720")
    assert parse_redirects(["[::1]:720"]) == ("[::1]:720",)
    assert parse_redirects("node2=a.example:720,b.example:720") == ("node2=a.example:720", "b.example:720")
    for bad in ("a.example", "a.example:0", ":720", "host:http", "=a.example:720", "node2=a.example"):
        with pytest.raises(ConfigurationError):
            parse_redirects(bad)
