"""One publish without Twisted: ``brokerd-ssmp pub`` over plain TCP on a blocking socket and
the protocol's sans-IO codec.

A command that sends a few messages and exits spends most of its time starting: importing
Twisted's reactor and Deferreds takes longer than the publish itself (docs/performance.md,
"The clients' start-up").  What one publish needs is a socket, the request lines and the
answers in order, so that is all this path imports.  TLS, Tor and other endpoints, and
``--debug``, take the Twisted client (brokerd.cli.ssmp); the lines and exit statuses are the
same on both paths.
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


def ssmp_send(
    address: tuple[str, int], where: str, login: list[bytes], requests: list[tuple[str, bytes]], timeout: float,
    refused: Callable[[str, Response], CommandError],
) -> None:
    """LOGIN with ``login`` (identifier, scheme[, credential]), then every request at once
    (SSMP answers in order), every answer read, then CLOSE.  The first refusal is the
    CommandError ``refused(what, response)`` gives ("LOGIN" for the login)."""
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except OSError as exc:
        raise CommandError(EXIT_ERROR, f"cannot connect to {where}: {exc.strerror or exc}", retryable=True) from None
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
