"""MCCHAT on a ``tls:`` listener (the same --tls-* files as every protocol): delivery over TLS,
and the ``mcchat_bind_username`` option that replaces the username of a client holding a
verified certificate with the certificate's name."""
from __future__ import annotations

from pathlib import Path

import pytest_twisted

from tests.support.live import Inbox, LiveBroker, synced
from tests.support.certs import CLIENT_NAME, SERVER_HOSTNAME, TestPKI
from tests.support.fixtures import pki  # noqa: F401

TLS = "tls:0:interface=127.0.0.1"


def start(tmp_path: Path, pki: TestPKI, bind: bool) -> LiveBroker:  # noqa: F811
    return LiveBroker.start(
        tmp_path,
        listeners={"mcchat": [TLS]},
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_ca=pki.ca,
        mcchat_bind_username=bind,
    )


def with_cert(pki: TestPKI) -> dict:  # noqa: F811
    return {"tls": True, "hostname": SERVER_HOSTNAME, "ca": pki.ca, "cert": pki.client.cert, "key": pki.client.key}


def without_cert(pki: TestPKI) -> dict:  # noqa: F811
    return {"tls": True, "hostname": SERVER_HOSTNAME, "ca": pki.ca}


@pytest_twisted.ensureDeferred
async def test_bound_usernames_come_from_the_certificate(tmp_path: Path, pki: TestPKI) -> None:  # noqa: F811
    live = start(tmp_path, pki, bind=True)
    try:
        inbox = Inbox()
        listener = await live.mcchat(inbox, **without_cert(pki))
        listener.subscribe("room")
        await synced(listener)
        holder = await live.mcchat(**with_cert(pki))
        holder.publish("room", "root", "signed")
        anonymous = await live.mcchat(**without_cert(pki))
        anonymous.publish("room", "mallory", "unsigned")
        await inbox.count(2)
        assert sorted(inbox.messages) == sorted(
            [("room", CLIENT_NAME, "signed"), ("room", "mallory", "unsigned")]
        )
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_without_the_option_usernames_pass_as_sent_over_tls(tmp_path: Path, pki: TestPKI) -> None:  # noqa: F811
    live = start(tmp_path, pki, bind=False)
    try:
        inbox = Inbox()
        listener = await live.mcchat(inbox, **with_cert(pki))
        assert listener.version == 1
        listener.subscribe("room")
        await synced(listener)
        listener.publish("room", "root", "as sent")
        await inbox.count(1)
        assert inbox.messages == [("room", "root", "as sent")]
        assert await listener.topics() == ["room"]
    finally:
        await live.stop()


@pytest_twisted.ensureDeferred
async def test_a_protocol_error_closes_a_tls_connection(tmp_path: Path, pki: TestPKI) -> None:  # noqa: F811
    """The broker closes a connection that sent an unknown opcode.  Over TLS the close must
    unregister the connection's producer first, or the TLS layer waits for it forever."""
    from twisted.internet import reactor

    live = start(tmp_path, pki, bind=False)
    try:
        client = await live.mcchat(**with_cert(pki))
        client.subscribe("room")
        await synced(client)  # the broker has read from it: its producer is registered
        client.transport.write(b"\x09")
        await client.when_closed().addTimeout(5, reactor)
    finally:
        await live.stop()
