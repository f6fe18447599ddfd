"""Accounts and access-list entries managed live through the admin API.

    GET  /api/accounts                   {"file": ..., "accounts": [names]}
    POST /api/accounts/add      {"name": N, "password": P}   a new account (409 if it exists)
    POST /api/accounts/passwd   {"name": N, "password": P}   a new password (404 if no account)
    POST /api/accounts/remove   {"name": N}
    GET  /api/ual                        {"file": ..., "entries": [{"topic", "who", "permissions"}]}
    POST /api/ual/set           {"topic": T, "who": W, "permissions": "ps"}   add or replace
    POST /api/ual/remove        {"topic": T, "who": W}

Every change is made to the file the broker reads (``--accounts``; ``--ual``, else
``DATA_DIR/smqp.ual``), so a restart keeps it: under the file's lock, checked by the same
code that reads it at start-up (brokerd.auth.accounts, brokerd.auth.ual), written to a
temporary file with the old file's permissions and renamed over it.  It applies at once: the
accounts checkers read a changed file at the next login, and the access list is installed
before the answer.  Each change is one line of the operator log (names and topics, never a
password).  Password hashing and file work run in the reactor's thread pool.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from brokerd.admin import strictjson
from brokerd.auth.accounts import (
    PasswordHash,
    check_password,
    locked,
    normalize_name,
    read_accounts,
    replace_file,
    thread_runner,
    update_accounts,
)
from brokerd.auth.policy import UAL_FILENAME, AccessListFile
from brokerd.auth.ual import Entry, edit_access_list, entry_of, format_permissions, read_access_list
from brokerd.errors import ConfigurationError
from brokerd.events.log import peer_text
from brokerd.jsontypes import JSONObject, JSONValue
from brokerd.runtime import Runtime

MAX_BODY = 4096
"""Bytes of a change's JSON body read at most."""
JSON = b"application/json"
_log = Logger(namespace="brokerd.admin")
_Result = TypeVar("_Result")
"""What a change's function returns (run in the thread pool), before its answer is made of it."""


class Refusal(Exception):
    """A change refused with an HTTP status and a reason."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def _answer(request: Request, code: int, body: JSONValue) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", JSON)
    request.setHeader(b"cache-control", b"no-store")
    return strictjson.dumps(body) + b"\n"


def rest_of_path(request: Request) -> list[bytes]:
    """The path segments past the resource (Site sets them before any resource renders)."""
    return request.postpath or []


def read_body(request: Request, limit: int) -> bytes:
    """Up to ``limit`` bytes of the request's body (Request holds none only once it is done)."""
    return request.content.read(limit) if request.content is not None else b""


def _body(request: Request, fields: tuple[str, ...]) -> dict[str, str]:
    """The JSON object of a change, with exactly ``fields``, all strings; Refusal otherwise."""
    content_type = (request.getHeader(b"content-type") or b"").split(b";")[0].strip().lower()
    if content_type != JSON:
        raise Refusal(415, "send Content-Type: application/json")
    raw = read_body(request, MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise Refusal(413, f"the body is over {MAX_BODY} bytes")
    try:
        given = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # arrays nested past Python's stack
        raise Refusal(400, "the body is not JSON") from None
    if not isinstance(given, dict) or set(given) != set(fields) or \
            not all(isinstance(value, str) for value in given.values()):
        raise Refusal(400, "the body is a JSON object with the strings " + ", ".join(fields))
    return given


class _Managed(Resource, Generic[_Result]):
    """``GET`` the listing; ``POST .../ACTION`` a change, run in the thread pool."""

    isLeaf = True
    actions: dict[str, tuple[str, ...]] = {}

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self.runtime = runtime
        self._run = thread_runner(runtime.reactor)

    def render_GET(self, request: Request) -> bytes | int:
        if rest_of_path(request) not in ([], [b""]):
            return _answer(request, 404, {"error": "no such resource"})
        return self._later(request, self._run(self.listing), "list")

    def render_POST(self, request: Request) -> bytes | int:
        action = b"/".join(rest_of_path(request)).decode("ascii", "replace")
        if action not in self.actions:
            return _answer(request, 404, {"error": "POST to " + " or ".join(sorted(self.actions))})
        try:
            given = _body(request, self.actions[action])
            change = self.prepare(action, given)
        except Refusal as exc:
            return _answer(request, exc.code, {"error": str(exc)})
        source = peer_text(request.getClientAddress())
        d = self._run(change)
        d.addCallback(self.applied, action, given, source)
        return self._later(request, d, action)

    def _later(self, request: Request, d: Deferred[JSONObject], action: str) -> int:
        gone: list[bool] = []
        request.notifyFinish().addErrback(lambda _f: gone.append(True))

        def done(body: JSONObject) -> None:
            if not gone:
                request.write(_answer(request, 200, body))
                request.finish()

        def failed(failure: Failure) -> None:
            error = failure.value
            if isinstance(error, Refusal):
                code, reason = error.code, str(error)
            elif isinstance(error, (ConfigurationError, ValueError)):
                code, reason = 422, str(error)
            elif isinstance(error, OSError):
                code, reason = 500, f"cannot write: {error.strerror or error}"
            else:
                _log.failure("admin: {action} failed", failure, action=action)
                code, reason = 500, failure.getErrorMessage()
            if not gone:
                request.write(_answer(request, code, {"error": reason}))
                request.finish()

        d.addCallbacks(done, failed)
        return NOT_DONE_YET

    def listing(self) -> JSONObject:
        raise NotImplementedError

    def prepare(self, action: str, given: dict[str, str]) -> Callable[[], _Result]:
        raise NotImplementedError

    def applied(self, result: _Result, action: str, given: dict[str, str],
                source: str | None) -> JSONObject | Deferred[JSONObject]:
        """The answer to a change once made (``result``: what ``prepare``'s function returned)."""
        raise NotImplementedError


class Accounts(_Managed[dict[str, str]]):
    """``/api/accounts``: the ``--accounts`` file."""

    actions = {"add": ("name", "password"), "passwd": ("name", "password"), "remove": ("name",)}

    @property
    def path(self) -> Path:
        path = self.runtime.settings.accounts_file
        if path is None:
            raise Refusal(409, "the broker has no accounts file: start it with --accounts FILE")
        return Path(path)

    def listing(self) -> dict[str, Any]:
        path = self.path
        names = sorted(read_accounts(path)) if path.exists() else []
        return {"file": str(path), "accounts": names}

    def prepare(self, action: str, given: dict[str, str]) -> Callable[[], dict[str, str]]:
        path = self.path
        try:
            name = normalize_name(given["name"])
            if "password" in given:
                check_password(given["password"])
        except ValueError as exc:
            raise Refusal(400, str(exc)) from None

        def change() -> dict[str, str]:
            new_hash = PasswordHash.create(given["password"]) if "password" in given else None

            def edit(accounts: dict[str, PasswordHash]) -> None:
                if action == "add" and name in accounts:
                    raise Refusal(409, f"account {name!r} exists (passwd changes its password)")
                if action != "add" and name not in accounts:
                    raise Refusal(404, f"no account {name!r}")
                if action == "remove":
                    del accounts[name]
                elif new_hash is None:
                    raise Refusal(400, f"{action} needs a password")
                else:
                    accounts[name] = new_hash

            update_accounts(path, edit, create=action == "add")
            return {"account": name, "done": action}

        return change

    def applied(self, result: dict[str, str], action: str, given: dict[str, str], source: str | None) -> JSONObject:
        what = {"add": "added", "passwd": "changed the password of", "remove": "removed"}[action]
        _log.info("admin: {what} account {name} in {file} (from {source})", what=what, name=result["account"],
                  file=str(self.path), source=source)
        return result


class AccessEntries(_Managed[Entry]):
    """``/api/ual``: the access list's file (``--ual``, else ``DATA_DIR/smqp.ual``)."""

    actions = {"set": ("topic", "who", "permissions"), "remove": ("topic", "who")}

    @property
    def access(self) -> AccessListFile:
        """The broker's AccessListFile (the one its front ends and the core share)."""
        return self.runtime.access_list

    @property
    def path(self) -> Path:
        if self.access.path is not None:
            return Path(self.access.path)
        settings = self.runtime.settings
        return Path(settings.ual_file) if settings.ual_file else Path(settings.data_dir) / UAL_FILENAME

    def _defaults(self) -> dict[str, Any]:
        return {"account_default": self.access.current.account_default,
                "guest_default": self.access.current.guest_default}

    def listing(self) -> dict[str, Any]:
        path = self.path
        entries = read_access_list(path, **self._defaults()).entries if path.exists() else ()
        return {"file": str(path), "entries": [
            {"topic": "/" + "/".join(e.topic), "who": e.principal, "permissions": format_permissions(e.permissions)}
            for e in entries]}

    def prepare(self, action: str, given: dict[str, str]) -> Callable[[], Entry]:
        try:
            entry = entry_of(given["topic"], given["who"], given.get("permissions", "-"))
        except ConfigurationError as exc:
            raise Refusal(400, str(exc).removeprefix("the entry, line 1: ")) from None
        path, defaults = self.path, self._defaults()

        def change() -> Entry:
            with locked(path):
                try:
                    text = path.read_text(encoding="utf-8")
                    mode = path.stat().st_mode & 0o777
                except FileNotFoundError:
                    text, mode = "", 0o600
                new_text, found = edit_access_list(text, entry, remove=action == "remove", **defaults)
                if action == "remove" and not found:
                    raise Refusal(404, f"no entry for {given['who']} on {given['topic']}")
                replace_file(path, new_text, mode)
            return entry

        return change

    def applied(self, entry: Entry, action: str, given: dict[str, str], source: str | None) -> Deferred[JSONObject]:
        if self.access.path is None:  # the first entry: the broker reads this file from now on
            self.access.path = self.path
        d = self.access.reload_now()  # installed before the answer: the next publish obeys it
        topic = "/" + "/".join(entry.topic)
        _log.info("admin: {what} the access entry {who} on {topic}{perms} in {file} (from {source})",
                  what="set" if action == "set" else "removed", who=entry.principal, topic=topic,
                  perms=f": {format_permissions(entry.permissions)}" if action == "set" else "",
                  file=str(self.path), source=source)
        return d.addCallback(lambda _: {"topic": topic, "who": entry.principal, "done": action,
                                        "permissions": format_permissions(entry.permissions)})


__all__ = ["AccessEntries", "Accounts"]
