"""The admin API's JSON bodies, read as its handlers read them: a session's close request
(``{}`` or ``{"for": SECONDS}``), and the changes of accounts and access entries (a JSON
object of exactly the action's strings, then checked as the handler's ``prepare`` checks
them).  The selector picks the body's kind; a refusal is the handler's own error (answered
with a 4xx), anything else escapes (a 500 and a traceback in the log)."""
from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

from brokerd.admin.manage import JSON, Accounts, Refusal, _body
from brokerd.admin.sessions import keep_out_seconds
from brokerd.auth.ual import entry_of
from brokerd.errors import ConfigurationError
from tests.fuzz.harness import refused, selector_and_payload

ACCOUNTS = Accounts(SimpleNamespace(reactor=None, settings=SimpleNamespace(accounts_file="/nonexistent/accounts")))
"""Its ``prepare`` only checks the body: the file is touched by the change it returns."""


class _Posted:
    """A POST with a JSON body, as the handlers read it (its content type and content)."""

    def __init__(self, body: bytes) -> None:
        self.content = io.BytesIO(body)

    def getHeader(self, name: bytes) -> bytes | None:
        return JSON if name.lower() == b"content-type" else None


def _close(body: bytes) -> Any:
    return keep_out_seconds(body)


def _account(action: str, body: bytes) -> Any:
    return ACCOUNTS.prepare(action, _body(_Posted(body), ACCOUNTS.actions[action]))


def _access(action: str, body: bytes) -> Any:
    fields = ("topic", "who", "permissions") if action == "set" else ("topic", "who")
    given = _body(_Posted(body), fields)
    return entry_of(given["topic"], given["who"], given.get("permissions", "-"))


KINDS = [
    _close,
    lambda body: _account("add", body), lambda body: _account("passwd", body), lambda body: _account("remove", body),
    lambda body: _access("set", body), lambda body: _access("remove", body),
]


def check(data: bytes) -> tuple:
    selector, payload = selector_and_payload(data)
    return (refused(lambda: KINDS[selector % len(KINDS)](payload), (Refusal, ValueError, ConfigurationError)),)


def seeds() -> dict[str, bytes]:
    return {
        "close": b"\x00{}", "close-for": b'\x00{"for": 30}',
        "add": b'\x01{"name": "alice", "password": "s3cret"}', "passwd": b'\x02{"name": "alice", "password": "x"}',
        "remove": b'\x03{"name": "alice"}',
        "ual-set": b'\x04{"topic": "/news/sports", "who": "alice", "permissions": "sr"}',
        "ual-remove": b'\x05{"topic": "/news", "who": "guest"}',
    }
