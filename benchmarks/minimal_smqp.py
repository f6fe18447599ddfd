"""A minimal SMQP server on Twisted and SQLite: the floor brokerd's SMQP figures are measured against.

Just what ``smqp_bench.py`` needs: LOGIN/PASS (any password), CREATE TOPIC, SUB MESSAGE
(durable), PUBLISH MESSAGE (guaranteed: 200 once committed), NOTIFY MESSAGE with the two-phase
``310 ACK`` exchange (one outstanding, or ``SET NOTIFY WINDOW n``).  SQLite in WAL mode with
``synchronous=FULL`` like brokerd's store; what one reactor turn asks for is one transaction,
committed in the reactor thread (so reads wait during the fsync and the next turn's work piles
up into the next commit).  No validation, no limits, no flow control, no priorities, no
expiry or retries: what CPython, Twisted and SQLite cost per acknowledged delivery, not a
server to copy.

    python benchmarks/minimal_smqp.py PORT DATA_DIR
"""
from __future__ import annotations

import sqlite3
import sys
from collections import deque
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.protocol import Factory, Protocol

SCHEMA = """
CREATE TABLE IF NOT EXISTS subs (subscriber TEXT, topic TEXT, PRIMARY KEY (subscriber, topic));
CREATE TABLE IF NOT EXISTS messages (seq INTEGER PRIMARY KEY, topic TEXT, body BLOB);
CREATE TABLE IF NOT EXISTS pending (subscriber TEXT, seq INTEGER, PRIMARY KEY (subscriber, seq));
"""


class Store:
    """Statements queued during a reactor turn, run and committed together at its end; then
    the callbacks that wait for that commit."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        self.ops: list = []
        self.after: list = []

    def run(self, op, then=None) -> None:
        if not self.ops and not self.after:
            reactor.callLater(0, self.commit)
        self.ops.append(op)
        if then is not None:
            self.after.append(then)

    def commit(self) -> None:
        ops, after, self.ops, self.after = self.ops, self.after, [], []
        self.db.execute("BEGIN IMMEDIATE")
        for op in ops:
            op(self.db)
        self.db.execute("COMMIT")
        for then in after:
            then()


class MinimalSMQP(Protocol):
    def __init__(self, factory: MinimalFactory) -> None:
        self.factory = factory
        self.name = ""
        self.buffer = b""
        self.queue: deque[tuple[int, bytes, str]] = deque()
        self.sent: deque[int] = deque()
        self.window = 1
        self.answering = 0

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)
        self.transport.write(b"SMQP/1.0 Ready. minimal\r\n")

    def connectionLost(self, reason: object = None) -> None:
        if self.factory.sessions.get(self.name) is self:
            del self.factory.sessions[self.name]

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        out: list[bytes] = []
        while True:
            end = self.buffer.find(b"\n")
            if end < 0:
                break
            line = self.buffer[:end].rstrip(b"\r")
            words = line.split()
            verb = words[0].upper() if words else b""
            if verb in (b"PUB", b"PUBLISH"):
                body_end = self._body_end(end + 1)
                if body_end < 0:
                    break  # the rest of the body has not arrived
                body, self.buffer = self.buffer[end + 1:body_end], self.buffer[body_end:]
                self._publish(words[-2].decode(), body)
                continue
            self.buffer = self.buffer[end + 1:]
            if not words:
                continue
            if verb == b"310" or verb == b"312":
                self._acknowledge()
            elif verb == b"LOGIN":
                self.name = words[1].decode()
                out.append(b"200 OK\r\n")
            elif verb in (b"PASS", b"PASSWORD"):
                self.factory.sessions[self.name] = self
                self._load()
                out.append(b"200 OK\r\n")
            elif verb in (b"SUB", b"SUBSCRIBE"):
                topic = words[-1].decode()
                self.factory.subs.setdefault(topic, set()).add(self.name)
                self.factory.store.run(lambda db, s=self.name, t=topic: db.execute(
                    "INSERT OR IGNORE INTO subs VALUES (?, ?)", (s, t)))
                out.append(b"200 OK\r\n")
            elif verb == b"SET" and len(words) == 4 and words[2].upper() == b"WINDOW":
                self.window = int(words[3])
                out.append(b"200 OK\r\n")
            else:  # CREATE TOPIC, SET NOTIFY SUSPEND/RESUME, NOOP, QUIT
                out.append(b"200 OK\r\n")
        if out:
            self.transport.write(b"".join(out))
        self.pump()

    def _body_end(self, start: int) -> int:
        """Where the body starting at ``start`` ends (after its ``.`` line), or -1."""
        buffer = self.buffer
        at = buffer.find(b"\r\n\r\n", start)  # the header's blank line
        if at < 0:
            return -1
        at += 4
        while True:
            end = buffer.find(b"\n", at)
            if end < 0:
                return -1
            line = buffer[at:end].rstrip(b"\r")
            if line == b".":
                return end + 1
            if not line:
                at = end + 1
                continue
            attrs_end = buffer.find(b"\r\n\r\n", at)
            if attrs_end < 0:
                return -1
            length = next(int(a.partition(b":")[2]) for a in buffer[at:attrs_end].split(b"\r\n")
                          if a.lower().startswith(b"content-length:"))
            at = attrs_end + 4 + length
            if len(buffer) < at + 2:
                return -1
            if buffer[at:at + 2] == b"\r\n":
                at += 2

    def _publish(self, topic: str, body: bytes) -> None:
        factory = self.factory
        factory.seq += 1
        seq = factory.seq
        stored = b"Smuid: minimal/%d\r\n" % seq + body
        subscribers = list(factory.subs.get(topic, ()))

        def write(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO messages VALUES (?, ?, ?)", (seq, topic, stored))
            db.executemany("INSERT INTO pending VALUES (?, ?)", [(s, seq) for s in subscribers])

        def committed() -> None:
            self.transport.write(b"200 OK\r\n")
            for name in subscribers:
                session = factory.sessions.get(name)
                if session is not None:
                    session.queue.append((seq, stored, topic))
                    session.pump()

        factory.store.run(write, committed)  # the reply follows the commit

    def _load(self) -> None:
        rows = self.factory.store.db.execute(
            "SELECT m.seq, m.body, m.topic FROM pending p JOIN messages m ON m.seq = p.seq"
            " WHERE p.subscriber = ? ORDER BY m.seq", (self.name,)).fetchall()
        self.queue.extend(rows)

    def pump(self) -> None:
        parts: list[bytes] = []
        while self.queue and len(self.sent) + self.answering < self.window:
            seq, body, topic = self.queue.popleft()
            self.sent.append(seq)
            parts.append(f"NOTIFY MESSAGE {topic} ADD\r\n".encode() + body)
        if parts:
            self.transport.write(b"".join(parts))

    def _acknowledge(self) -> None:
        if not self.sent:
            self.transport.write(b"503 Bad sequence\r\n")
            return
        seq = self.sent.popleft()
        self.answering += 1

        def committed() -> None:
            self.answering -= 1
            self.transport.write(b"310 ACK\r\n")
            self.pump()

        self.factory.store.run(lambda db: db.execute(
            "DELETE FROM pending WHERE subscriber = ? AND seq = ?", (self.name, seq)), committed)


class MinimalFactory(Factory):
    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(data_dir / "minimal.sqlite3")
        self.sessions: dict[str, MinimalSMQP] = {}
        self.subs: dict[str, set[str]] = {}
        for subscriber, topic in self.store.db.execute("SELECT subscriber, topic FROM subs"):
            self.subs.setdefault(topic, set()).add(subscriber)
        self.seq = self.store.db.execute("SELECT coalesce(max(seq), 0) FROM messages").fetchone()[0]

    def buildProtocol(self, addr: object) -> MinimalSMQP:
        return MinimalSMQP(self)


if __name__ == "__main__":
    reactor.listenTCP(int(sys.argv[1]), MinimalFactory(Path(sys.argv[2])), interface="127.0.0.1")
    reactor.run()
