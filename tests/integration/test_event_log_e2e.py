"""The event log end to end: a real ``twistd brokerd`` with SSMP, MCCHAT and SMQP listeners,
traffic in each protocol over raw sockets (logins, a refused login per protocol that has one,
subscriptions, publishes that cross protocols, an SMQP 310 ACK), SIGTERM, and then what
DATA_DIR/events/ holds, read with the schema's own decoder."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from brokerd.events import schema
from tests.support.broker import LineClient, repo_env, start_broker, twistd
from tests.support.secrets import write_private

pytestmark = pytest.mark.slow

TIMEOUT = 10.0


class SMQPLines:
    """A blocking SMQP client over a raw socket: CRLF lines, multi-line replies."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.buffer = b""
        greeting = self.line()
        assert greeting.startswith(b"SMQP/1.0 Ready."), greeting

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"connection closed; buffered {self.buffer!r}")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line

    def reply(self) -> list[bytes]:
        """The lines of one reply (``NNN-...`` continues, ``NNN ...`` ends it)."""
        lines = [self.line()]
        while lines[-1][3:4] == b"-":
            lines.append(self.line())
        return lines

    def command(self, text: bytes) -> list[bytes]:
        self.sock.sendall(text)
        return self.reply()

    def login(self, channel: str, password: str = "alicepw") -> list[bytes]:
        assert self.command(f"LOGIN alice:{channel} CLEAR/1.0\r\n".encode()) == [b"200 OK"]
        return self.command(f"PASS alice {password}\r\n".encode())

    def notification(self) -> list[bytes]:
        """A NOTIFY MESSAGE with its body, up to the final ``.`` line."""
        lines = [self.line()]
        assert lines[0].startswith(b"NOTIFY MESSAGE "), lines
        while lines[-1] != b".":
            lines.append(self.line())
        return lines

    def close(self) -> None:
        self.sock.close()


def _records(data_dir: Path, live: bool = False) -> list[dict[str, Any]]:
    """Every record, in time order.  ``live``: the broker is still writing, so a last line
    may be cut short; skip it (once it stopped, every line must decode)."""
    records = []
    for path in sorted((data_dir / schema.EVENTS_DIR).rglob("*" + schema.FILE_SUFFIX)):
        for line in path.read_text("utf-8", errors="replace").splitlines():
            try:
                records.append(schema.decode(line))
            except schema.SchemaError:
                if not live:
                    raise
    return sorted(records, key=lambda record: record["ts"])


def _mcchat(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    info = b""
    while len(info) < 2:
        info += sock.recv(2 - len(info))
    assert info == b"\x00\x01"
    return sock


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(data)
        data += chunk
    return data


def test_every_protocol_writes_its_events(tmp_path: Path) -> None:
    accounts = tmp_path / "accounts"
    subprocess.run([sys.executable, "-m", "brokerd.cli.accounts", "add", str(accounts), "alice", "alicepw"],
                   check=True, capture_output=True, timeout=60)
    secret = tmp_path / "secret"
    write_private(secret, "s3cret\n")
    listeners = {name: "tcp:{port}:interface=127.0.0.1" for name in ("ssmp", "mcchat", "smqp")}
    broker = start_broker(tmp_path, "--open-login", "--secret-file", str(secret), "--accounts", str(accounts),
                          "--event-log-flush", "0.2", listeners=listeners)
    clients: list[Any] = []
    try:
        ports = broker.ports
        # refused logins
        bad = LineClient.connect(ports["ssmp"])
        clients.append(bad)
        assert bad.request("LOGIN alice secret wrong") == b"401 open secret password"  # --accounts offers SSMP password login too
        smqp_bad = SMQPLines(ports["smqp"])
        clients.append(smqp_bad)
        assert smqp_bad.login("x", "wrongpw")[0].startswith(b"401 ")

        # subscribers in every protocol
        sam = LineClient.connect(ports["ssmp"])
        clients.append(sam)
        assert sam.request("LOGIN sam open") == b"200"
        assert sam.request("SUBSCRIBE news") == b"200"
        carol = _mcchat(ports["mcchat"])
        clients.append(carol)
        carol_name = "127.0.0.1:%d" % carol.getsockname()[1]  # MCCHAT names a session by its transport
        carol.sendall(b"\x01news\x00")
        sub = SMQPLines(ports["smqp"])
        clients.append(sub)
        assert sub.login("sub")[-1].startswith(b"200 Suid: ")
        assert sub.command(b"CREATE TOPIC /news\r\n") == [b"200 OK"]
        assert sub.command(b"SUB MESSAGE /news\r\n")[-1].startswith(b"200 ")
        carol.sendall(b"\x04")  # TLRQ: its answer shows the SUB was handled
        assert b"news\x00" in _read_until(carol, b"\x04")

        # one message from each protocol
        assert sam.request("MCAST news from-ssmp") == b"200"
        carol.sendall(b"\x03news\x00carol\x00from-mcchat\x00")
        pub = SMQPLines(ports["smqp"])
        clients.append(pub)
        assert pub.login("pub")[-1].startswith(b"200 Suid: ")
        published = pub.command(b"PUB MESSAGE /news C1\r\nCreated: D20240501T120000Z\r\n\r\n"
                                b"Content-Type: text/plain\r\nContent-Length: 9\r\n\r\nfrom-smqp\r\n.\r\n")
        assert published[0] == b"200-OK" and published[-1].startswith(b"200 "), published
        smuid = published[-1][4:].decode()

        # SMQP gets all three, stored (the core kept the foreign ones for its durable
        # subscription), each acknowledged
        bodies = []
        for _ in range(3):
            bodies.append(b"\n".join(sub.notification()))
            assert sub.command(b"310 ACK\r\n") == [b"310 ACK"]
        assert [next(p for p in (b"from-ssmp", b"from-mcchat", b"from-smqp") if p in body) for body in bodies] == [
            b"from-ssmp", b"from-mcchat", b"from-smqp"]
        assert sam.line().endswith(b"from-mcchat") and sam.line().endswith(b"from-smqp")
        assert b"from-smqp" in _read_until(carol, b"from-smqp")
        assert sam.request("CLOSE") == b"200"
        for client in clients:
            client.close()
        # Sessions still open at shutdown get no logout (the reactor drops their connections
        # after the event log stopped), so wait until the broker has seen every close.
        wanted = {("ssmp", "sam"), ("mcchat", carol_name), ("smqp", "alice:sub"), ("smqp", "alice:pub")}
        deadline = time.monotonic() + TIMEOUT
        while not wanted <= {(r["protocol"], r.get("session")) for r in _records(broker.data_dir, live=True)
                             if r["kind"] == "logout"}:
            assert time.monotonic() < deadline, _records(broker.data_dir, live=True)
            time.sleep(0.1)
    finally:
        for client in clients:
            client.close()
        code = broker.stop(signal.SIGTERM)
    assert code in (0, -signal.SIGTERM), broker.log()  # twistd may end by re-raising the signal
    assert "Server Shut Down." in broker.log()

    records = _records(broker.data_dir)
    assert records, broker.log()
    by = lambda protocol, kind: [r for r in records if r["protocol"] == protocol and r["kind"] == kind]  # noqa: E731

    # SSMP
    [failure] = by("ssmp", "auth_failure")
    assert (failure["session"], failure["scheme"], failure["reason"]) == ("alice", "secret", "wrong secret")
    assert failure["source"].startswith("127.0.0.1:")
    assert [(r["session"], r["outcome"]) for r in by("ssmp", "login")] == [("sam", "ok")]
    assert by("ssmp", "login")[0]["source"].startswith("127.0.0.1:")
    [accepted] = by("ssmp", "accepted")
    # to carol (MCCHAT) live; the sender itself is excluded; kept for SMQP (delivered below)
    assert (accepted["session"], accepted["topic"], accepted["fanout"], accepted["bytes"]) == ("sam", "news", 1, 9)
    assert [r["session"] for r in by("ssmp", "logout")] == ["sam"]

    # MCCHAT (a subscribed sender gets its own message: sam and carol); its other
    # sessions are start_broker's port probes (MCCHAT has no login: a connection is a session)
    [login] = [r for r in by("mcchat", "login") if r["session"] == carol_name]
    assert login["source"] == carol_name
    assert [(r["session"], r["topic"]) for r in by("mcchat", "subscribed")] == [(carol_name, "news")]
    [accepted] = by("mcchat", "accepted")
    assert (accepted["session"], accepted["fanout"], accepted["bytes"]) == (carol_name, 2, 11)
    assert [r["session"] for r in by("mcchat", "logout")].count(carol_name) == 1
    assert by("mcchat", "dropped") == []  # no bad input, no slow reader

    # SMQP
    [failure] = by("smqp", "auth_failure")
    assert (failure["session"], failure["scheme"], failure["reason"]) == ("alice", "CLEAR", "wrong password")
    assert failure["source"].startswith("127.0.0.1:")
    assert sorted(r["session"] for r in by("smqp", "login")) == ["alice:pub", "alice:sub"]
    [accepted] = by("smqp", "accepted")  # the core routed it: to sam and carol
    assert (accepted["message_id"], accepted["session"], accepted["topic"], accepted["fanout"]) == (
        smuid, "alice:pub", "news", 2)
    delivered = by("smqp", "delivered")
    acked = by("smqp", "acked")
    assert [(r["sender"], r["bytes"]) for r in delivered] == [
        ("ssmp:sam", 9), (f"mcchat:{carol_name}", 11), ("alice:pub", 9)]
    assert [r["message_id"] for r in acked] == [r["message_id"] for r in delivered]
    delivered, acked = delivered[-1], acked[-1]
    for outcome in (delivered, acked):
        assert (outcome["session"], outcome["message_id"], outcome["topic"], outcome["sender"], outcome["bytes"]) == (
            "alice:sub", smuid, "news", "alice:pub", 9)
        assert outcome["latency_us"] >= 0
    assert acked["latency_us"] >= delivered["latency_us"] and acked["ts"] > delivered["ts"] > accepted["ts"]
    assert sorted(r["session"] for r in by("smqp", "logout")) == ["alice:pub", "alice:sub"]

    # no stand-in sessions: only the clients' protocols appear
    assert {r["protocol"] for r in records} == {"ssmp", "mcchat", "smqp"}
    assert all(r["broker"] == records[0]["broker"] for r in records)


def _ssmp_pair(port: int) -> tuple[LineClient, LineClient]:
    """A logged-in publisher and a subscriber of ``news``."""
    publisher, subscriber = LineClient.connect(port), LineClient.connect(port)
    assert publisher.request("LOGIN pub open") == b"200"
    assert subscriber.request("LOGIN sub open") == b"200"
    assert subscriber.request("SUBSCRIBE news") == b"200"
    return publisher, subscriber


def _publish(publisher: LineClient, subscriber: LineClient, count: int, start: int = 0) -> None:
    """``count`` pipelined MCASTs, each acknowledged and delivered."""
    publisher.send(b"".join(b"MCAST news m%d\n" % i for i in range(start, start + count)))
    assert [publisher.line() for _ in range(count)] == [b"200"] * count
    delivered = [subscriber.line() for _ in range(count)]
    assert delivered[-1].endswith(b" m%d" % (start + count - 1)), delivered[-1]


def _accepted_on_news(records: list[dict[str, Any]]) -> int:
    return sum(r.get("count") or 1 for r in records if r["kind"] == schema.ACCEPTED and r.get("topic") == "news")


def test_a_kill_9_loses_at_most_the_flush_interval(tmp_path: Path) -> None:
    """Events older than the flush interval survive SIGKILL, every line written is whole, and
    the restarted broker writes a file of its own next to the dead run's."""
    broker = start_broker(tmp_path, "--open-login", "--event-log-flush", "0.2")
    try:
        publisher, subscriber = _ssmp_pair(broker.ports["ssmp"])
        _publish(publisher, subscriber, 500)
        deadline = time.monotonic() + 30
        while _accepted_on_news(_records(broker.data_dir, live=True)) < 500:  # flushed to the file
            assert time.monotonic() < deadline, "the first 500 were never flushed"
            time.sleep(0.05)  # polling the file, bounded by the deadline
        _publish(publisher, subscriber, 500, start=500)  # may be lost: within the last interval
    finally:
        broker.stop(signal.SIGKILL)
    records = _records(broker.data_dir)  # raises on a line cut short
    assert 500 <= _accepted_on_news(records) <= 1000
    assert {r["session"] for r in records if r["kind"] == schema.LOGIN} == {"pub", "sub"}
    first_run = {path.name for path in (broker.data_dir / schema.EVENTS_DIR).rglob("*" + schema.FILE_SUFFIX)}

    restarted = start_broker(tmp_path, "--open-login", "--event-log-flush", "0.2")
    try:
        publisher, subscriber = _ssmp_pair(restarted.ports["ssmp"])
        _publish(publisher, subscriber, 10, start=1000)
    finally:
        restarted.stop()
    files = {path.name for path in (restarted.data_dir / schema.EVENTS_DIR).rglob("*" + schema.FILE_SUFFIX)}
    assert first_run < files  # a new file; the killed run's files were not appended to
    assert _accepted_on_news(_records(restarted.data_dir)) >= 510


def test_an_unwritable_event_directory_stops_start_up_with_one_line(tmp_path: Path) -> None:
    """The event log's directory is checked before the broker reports itself started (a
    failed write while running is reported once and counted: tests/events/test_writer.py)."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / schema.EVENTS_DIR).write_text("not a directory\n")  # works as root too, unlike chmod
    command = [*twistd(), "--ssmp", "tcp:0:interface=127.0.0.1", "--data-dir", str(data_dir)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60, env=repo_env())
    assert refused.returncode == 1, refused
    assert refused.stderr == f"brokerd: --data-dir {data_dir}: {data_dir / 'events'} (the event log): not a directory\n"
    (data_dir / schema.EVENTS_DIR).unlink()  # positive control: the same broker starts and logs
    broker = start_broker(tmp_path, "--open-login", "--event-log-flush", "0.1")
    try:
        publisher, subscriber = _ssmp_pair(broker.ports["ssmp"])
        _publish(publisher, subscriber, 10)
    finally:
        broker.stop()
    assert _accepted_on_news(_records(broker.data_dir)) == 10
