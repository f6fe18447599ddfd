"""Blocking HTTP for admin-listener tests (run in a thread while the broker runs in-process
on the test's reactor)."""
from __future__ import annotations

from http.client import HTTPConnection
import json
from typing import Any


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def http(port: int, method: str, path: str, token: str | None = None, body: bytes | None = None,
         content_type: str | None = None, timeout: float = 10.0) -> Reply:
    connection = HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if content_type is not None:
        headers["Content-Type"] = content_type
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def post_json(port: int, path: str, token: str | None = None) -> Reply:
    return http(port, "POST", path, token, b"{}", "application/json")
