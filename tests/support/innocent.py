"""An innocent client of every protocol, for tests that attack a real ``twistd brokerd``: the
attack is allowed to hurt the attacker, never this client.

Blocking sockets with bounded reads, like tests/support/broker.py.  The broker must listen on
all four protocols (:data:`ALL_PROTOCOLS`) and allow SSMP ``open`` login (``--open-login``).
A broker running on the test's own reactor (``makeService``) is checked from a thread
(:func:`served_in_process`), so the reactor keeps serving while the innocent client waits.
"""
from __future__ import annotations

import socket
import threading
from types import SimpleNamespace
from typing import Any, Callable

from twisted.internet.defer import Deferred

from brokerd.protocols.mcchat.codec import encode_msg
from tests.support.broker import LineClient, RunningBroker

ALL_PROTOCOLS = {
    protocol: "tcp:{port}:interface=127.0.0.1" for protocol in ("ssmp", "mcchat", "smqp", "socketmq")
}
INNOCENT_SOURCE = "127.0.0.2"
"""A loopback address no attacker in these tests uses (Linux routes all of 127/8 locally)."""


THREAD_TIMEOUT = 120.0
"""Seconds :func:`in_thread` waits for its function (each socket operation has its own bound)."""


def in_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Deferred:
    """Run blocking ``function`` in a thread of its own, for a test whose broker runs on the
    reactor: the Deferred fires on the reactor with its result or failure, or fails after
    :data:`THREAD_TIMEOUT` seconds."""
    from twisted.internet import reactor

    d: Deferred = Deferred()

    def run() -> None:
        try:
            result = function(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 (handed to the test)
            reactor.callFromThread(lambda: d.called or d.errback(error))
        else:
            reactor.callFromThread(lambda: d.called or d.callback(result))

    threading.Thread(target=run, name=getattr(function, "__name__", "blocking"), daemon=True).start()
    return d.addTimeout(THREAD_TIMEOUT, reactor)


def served_in_process(ports: dict[str, int], source: str = INNOCENT_SOURCE, mcchat: bool = True) -> Deferred:
    """:func:`assert_serves_every_protocol` against a broker on this process's reactor
    listening on ``ports`` (protocol -> port), run in a thread."""
    return in_thread(assert_serves_every_protocol, SimpleNamespace(ports=ports), source, mcchat)


def connect(port: int, source: str = INNOCENT_SOURCE, timeout: float = 10.0) -> LineClient:
    return LineClient(socket.create_connection(("127.0.0.1", port), timeout, (source, 0)), timeout)


def assert_serves_every_protocol(
    broker: RunningBroker | SimpleNamespace, source: str = INNOCENT_SOURCE, mcchat: bool = True
) -> None:
    """SSMP logs in and gets a message an MCCHAT client publishes (so both are served; without
    ``mcchat``, another SSMP client publishes), an SMQP guest logs in and gets its NOOP
    answered, and socket.mq answers an HTTP request (not 503)."""
    ssmp = connect(broker.ports["ssmp"], source)
    publisher = connect(broker.ports["mcchat" if mcchat else "ssmp"], source)
    smqp = connect(broker.ports["smqp"], source)
    http = connect(broker.ports["socketmq"], source)
    try:
        assert ssmp.request("LOGIN innocent open") == b"200"
        assert ssmp.request("SUBSCRIBE innocent-topic") == b"200"
        if mcchat:
            publisher.send(encode_msg(b"innocent-topic", b"someone", b"still served"))
        else:
            assert publisher.request("LOGIN innocent-publisher open") == b"200"
            assert publisher.request("MCAST innocent-topic still served") == b"200"
        line = ssmp.line()
        assert line.startswith(b"000 ") and line.endswith(b" MCAST innocent-topic still served"), line

        assert smqp.line().startswith(b"SMQP/1.0 Ready.")
        smqp.send(b"LOGIN guest:innocent CLEAR/1.0\r\n")
        assert smqp.line() == b"200 OK\r"
        smqp.send(b"PASS guest\r\n")
        while not smqp.line().startswith(b"200 Suid: "):
            pass
        smqp.send(b"NOOP\r\n")
        assert smqp.line().startswith(b"200 ")

        http.send(b"GET / HTTP/1.1\r\nHost: innocent\r\n\r\n")
        status = http.line()
        assert status.startswith(b"HTTP/1.1 ") and b" 503 " not in status, status
    finally:
        for client in (ssmp, publisher, smqp, http):
            client.close()
