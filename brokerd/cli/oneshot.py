"""One publish without Twisted: ``brokerd-ssmp pub`` (``ucast``, ``bcast``) and ``brokerd-mqtt
pub`` at QoS 0, over plain TCP, on a blocking socket and the protocol's sans-IO codec.

A command that sends a few messages and exits spends most of its time starting: importing
Twisted's reactor and Deferreds takes longer than the publish itself (docs/performance.md,
"The clients' start-up").  What one publish needs is a socket, the request lines and the
answers in order, so that is all this path imports.  TLS, Tor and other endpoints, MQTT's QoS
1 and 2 and ``--debug`` take the Twisted client (brokerd.cli.ssmp, brokerd.cli.mqtt); the lines
and exit statuses are the same on both paths.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
from collections.abc import Callable

from brokerd.cli.common import EXIT_ERROR, CommandError, uses_tls
from brokerd.protocols.ssmp.codec import SSMPClientParser, encode_request, wire_payload
from brokerd.protocols.ssmp.events import Response

PLAIN_TCP = re.compile(r"tcp:(?:host=)?(?P<host>[^:\\]+):(?:port=)?(?P<port>\d+)$")
"""The endpoint strings this path serves: a host name or IPv4 address and a port."""
READ_SIZE = 65536


def plain_address(description: str, args: argparse.Namespace) -> tuple[str, int] | None:
    """(host, port) when the command can take this path, else None."""
    if uses_tls(args) or getattr(args, "debug", False):
        return None
    found = PLAIN_TCP.match(description)
    return None if found is None else (found.group("host"), int(found.group("port")))


class Answers:
    """The server's responses, in order, on a blocking socket (events, PING included, are not
    answers and are skipped: the connection lives for a few round trips)."""

    def __init__(self, sock: socket.socket, where: str) -> None:
        self.sock = sock
        self.where = where
        self.parser = SSMPClientParser()
        self.ready: list[Response] = []

    def next(self, waiting_for: str) -> Response:
        while not self.ready:
            try:
                data = self.sock.recv(READ_SIZE)
            except TimeoutError:
                raise CommandError(EXIT_ERROR, f"{self.where}: no answer to {waiting_for} in time",
                                   retryable=True) from None
            except OSError as exc:
                raise CommandError(EXIT_ERROR, f"{waiting_for}: connection lost before the answer ({exc})") from None
            if not data:
                raise CommandError(EXIT_ERROR, f"{self.where}: the broker closed the connection without answering "
                                   f"{waiting_for}", retryable=True)
            messages, error = self.parser.feed(data)
            self.ready.extend(m for m in messages if isinstance(m, Response))
            if error is not None and not self.ready:
                raise CommandError(EXIT_ERROR, f"{self.where}: the broker broke the protocol: {error}")
        return self.ready.pop(0)


def _connected(address: tuple[str, int], where: str, timeout: float, failed: int) -> socket.socket:
    """A connected socket with TCP_NODELAY, or CommandError(``failed``) naming the address."""
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except OSError as exc:
        raise CommandError(failed, f"cannot connect to {where}: {exc.strerror or exc}", retryable=True) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def ssmp_send(
    address: tuple[str, int], where: str, login: list[bytes], requests: list[tuple[str, bytes]], timeout: float,
    refused: Callable[[str, Response], CommandError],
) -> None:
    """LOGIN with ``login`` (identifier, scheme[, credential]), then every request at once
    (SSMP answers in order), every answer read, then CLOSE.  The first refusal is the
    CommandError ``refused(what, response)`` gives ("LOGIN" for the login)."""
    with _connected(address, where, timeout, EXIT_ERROR) as sock:
        answers = Answers(sock, where)
        sock.sendall(encode_request(b"LOGIN", *login))
        answer = answers.next("the login")
        if answer.code != b"200":
            raise refused("LOGIN", answer)
        sock.sendall(b"".join(line for _what, line in requests))
        first_refusal = None
        for what, _line in requests:
            answer = answers.next(what)
            if answer.code != b"200" and first_refusal is None:
                first_refusal = refused(what, answer)
        sock.sendall(encode_request(b"CLOSE"))
        sock.shutdown(socket.SHUT_WR)  # the broker answers and closes; nothing more is waited for
    if first_refusal is not None:
        raise first_refusal


def cast_line(command: str, args: argparse.Namespace, message: bytes) -> tuple[str, bytes]:
    """The request for one message of ``pub``, ``ucast`` or ``bcast`` and how to name it."""
    payload = wire_payload(message, args.binary)
    if command == "pub":
        return f"MCAST to {args.topic}", encode_request(b"MCAST", os.fsencode(args.topic), payload)
    if command == "ucast":
        return f"UCAST to {args.recipient}", encode_request(b"UCAST", os.fsencode(args.recipient), payload)
    return "BCAST", encode_request(b"BCAST", payload)


def mqtt_publish(
    address: tuple[str, int], where: str, version: int, client_id: str, keep_alive: int, username: str | None,
    password: bytes | None, topic: str, payload: bytes, retain: bool, timeout: float,
) -> None:
    """CONNECT, its CONNACK, one PUBLISH at QoS 0 and DISCONNECT, as ``brokerd-mqtt pub``
    does with the Twisted client (whose lines the errors repeat, exit status 1)."""
    from dataclasses import replace

    from brokerd.protocols.mqtt.decoder import MAX_PACKET_SIZE, MQTTClientDecoder
    from brokerd.protocols.mqtt.encoder import encode
    from brokerd.protocols.mqtt.packets import MQTT_5, NO_PROPERTIES, Connack, Connect, Disconnect, Publish
    from brokerd.protocols.mqtt.reasons import connack_refusal

    failed = 1
    properties = replace(NO_PROPERTIES, maximum_packet_size=MAX_PACKET_SIZE) if version == MQTT_5 else NO_PROPERTIES
    what = f"PUBLISH to {topic} at QoS 0"
    try:
        hello = encode(Connect(client_id, True, keep_alive, None, username, password, properties), version)
        message = encode(Publish(topic, payload, 0, retain), version)
    except ValueError as exc:
        raise CommandError(EXIT_ERROR, f"{what}: {exc}") from None
    with _connected(address, where, timeout, failed) as sock:
        sock.sendall(hello)
        decoder = MQTTClientDecoder(version)
        connack = None
        while connack is None:
            try:
                data = sock.recv(READ_SIZE)
            except OSError as exc:
                raise CommandError(failed, f"{where}: no CONNACK ({exc})", retryable=True) from None
            if not data:
                raise CommandError(failed, f"cannot connect to {where}: the server closed the connection before "
                                   "its CONNACK", retryable=True)
            packets, error = decoder.feed(data)
            connack = next((packet for packet in packets if isinstance(packet, Connack)), None)
            if connack is None and error is not None:
                raise CommandError(failed, f"{where}: the server broke the protocol: {error}")
        if connack.reason_code != 0:
            raise CommandError(failed, f"{where}: " + connack_refusal(
                connack.reason_code, version, connack.properties.reason_string), retryable=True)
        sock.sendall(message + encode(Disconnect(), version))
        sock.shutdown(socket.SHUT_WR)  # QoS 0 has no answer: the server reads both, then sees the end
