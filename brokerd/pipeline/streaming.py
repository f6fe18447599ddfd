"""``format("brokerd")``: a Spark Structured Streaming source and sink, through PySpark's
Python Data Source API.

    from brokerd.pipeline.streaming import register
    register(spark)
    rows = (spark.readStream.format("brokerd")
            .option("address", "127.0.0.1:8787").option("topics", "orders,alerts").load())
    query = (frame.writeStream.format("brokerd").option("address", "127.0.0.1:8787")
             .option("checkpointLocation", "/tmp/ckpt").start())

Rows: ``topic string, sender string, payload binary, ts timestamp, protocol string``.

The source has two modes (docs/pipeline.md has the full guarantees):

- live (``address`` + ``topics``): the source subscribes over SSMP and Spark gets what the
  broker delivers from then on.  At most once: SSMP is best effort, messages published while
  the query is down are never seen, and a batch planned but not committed before a restart
  cannot be replayed (``failOnDataLoss=true`` makes that an error instead of a gap).
  ``ts`` is when the source received the message; ``protocol`` and ``sender`` come from how
  SSMP names the sender (``mcchat:bob`` -> protocol mcchat).
- event log (``dataDir``): the source tails ``DATA_DIR/events/`` for accepted multicast
  messages.  Offsets are byte positions of complete lines in each log file, so a restarted
  query replays exactly what it had planned: exactly once into Spark with a checkpoint.
  ``payload`` is there only if the broker logs payloads (``--event-log-payloads``), else
  null; ``ts`` and ``protocol`` are the broker's.  Events reach the log a flush interval late.

The sink publishes each row as an SSMP MCAST to its ``topic`` column (or the ``topic``
option) and waits for every 200 before the task reports success.  At least once into the
broker: a task or batch that Spark retries publishes its rows again; from the broker on,
delivery is whatever each subscriber's protocol gives (SSMP: at most once).
"""
from __future__ import annotations

import os
import random
import sys
import threading
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)

from brokerd.events import schema
from brokerd.pipeline.ssmp import MAX_PAYLOAD, SSMPClientError, SSMPConnection, is_id

ROW_SCHEMA = "topic string, sender string, payload binary, ts timestamp, protocol string"
DEFAULT_ADDRESS = "127.0.0.1:8787"
DEFAULT_MAX_BUFFERED = 100_000
"""Live source: messages received but not yet committed by Spark; more are dropped and counted."""
DEFAULT_MAX_BATCH_ROWS = 50_000
"""Live source: rows in one micro-batch at most."""
PARTITION_ROWS = 10_000
"""Live source: rows per input partition."""
SINK_PIPELINE = 256
"""Sink: MCASTs written before their 200s are read."""
PROTOCOL_NAMES = ("ssmp", "mcchat", "smqp", "socketmq", "mqtt")


def register(spark: Any) -> None:
    """Make ``format("brokerd")`` available in ``spark``."""
    spark.dataSource.register(BrokerdDataSource)


def _flag(options: Any, key: str, default: bool = False) -> bool:
    value = options.get(key)
    return default if value is None else str(value).strip().lower() in ("1", "true", "yes", "on")


def _address(options: Any) -> tuple[str, int]:
    text = options.get("address", DEFAULT_ADDRESS)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"brokerd: option address={text!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def _credentials(options: Any, identity: bytes) -> dict[str, Any]:
    """LOGIN arguments: anonymous ('.'), open, or secret (``secret`` or ``secretFile``)."""
    if _flag(options, "anonymous"):
        return {"identity": b".", "scheme": b"open", "credential": None}
    secret = options.get("secret")
    if secret is None and options.get("secretFile"):
        secret = Path(options["secretFile"]).read_text("utf-8").splitlines()[0].strip()
    if secret is not None:
        return {"identity": identity, "scheme": b"secret", "credential": secret.encode("utf-8")}
    return {"identity": identity, "scheme": options.get("scheme", "open").encode("ascii"), "credential": None}


def _identity(options: Any, default: str) -> bytes:
    name = options.get("identity", default).encode("utf-8")
    if not is_id(name):
        raise ValueError(f"brokerd: identity {name!r} is not an SSMP identifier")
    return name


def origin(sender: bytes) -> tuple[str, str]:
    """(sender, protocol) of a message as SSMP shows it: ``mcchat:bob`` came from MCCHAT."""
    text = sender.decode("utf-8", "backslashreplace")
    prefix, sep, _rest = text.partition(":")
    if sep and prefix in PROTOCOL_NAMES and prefix != "ssmp":
        return text, prefix
    return text, "ssmp"


class BrokerdDataSource(DataSource):
    """``format("brokerd")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return "brokerd"

    def schema(self) -> str:
        return ROW_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if self.options.get("dataDir"):
            return EventLogStreamReader(self.options)
        return LiveStreamReader(self.options)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return BrokerdStreamWriter(self.options, schema)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        return BrokerdBatchWriter(self.options, schema)


class RowsPartition(InputPartition):
    """A slice of a micro-batch, carrying its rows (they exist only in the source's buffer)."""

    def __init__(self, rows: list[tuple]) -> None:
        super().__init__(len(rows))
        self.rows = rows


class Subscription:
    """A thread holding one SSMP connection subscribed to ``topics``, numbering what arrives.

    Sequence numbers continue a restarted query's checkpointed offset (``rebase``).  Rows are
    kept until Spark commits them, at most ``max_buffered``; past that new messages are
    dropped and counted.  A lost connection is retried with backoff (messages published in
    between are lost: SSMP is at most once).
    """

    def __init__(self, connect: Any, topics: list[bytes], max_buffered: int) -> None:
        self._connect = connect
        self._topics = topics
        self._max = max_buffered
        self._rows: deque[tuple[int, tuple]] = deque()
        self._lock = threading.Lock()
        self._next = 0
        self._rebased = False
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="brokerd-source", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            connection = None
            try:
                connection = self._connect()
                for topic in self._topics:
                    connection.subscribe(topic)
                delay = 0.2
                while not self._stop.is_set():
                    event = connection.receive(0.5)
                    if event is not None and event.verb == b"MCAST" and event.content is not None:
                        self._add(event)
            except (SSMPClientError, OSError):
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)
            finally:
                if connection is not None:
                    connection.close()

    def _add(self, event: Any) -> None:
        sender, protocol = origin(event.sender)
        row = (
            event.target.decode("utf-8", "backslashreplace"),
            sender,
            bytes(event.content),
            datetime.fromtimestamp(event.received, timezone.utc),
            protocol,
        )
        with self._lock:
            if len(self._rows) >= self._max:
                self.dropped += 1
                return
            self._rows.append((self._next, row))
            self._next += 1

    def rebase(self, start: int) -> None:
        """Number from ``start`` on (once: the first offset Spark hands a fresh process)."""
        with self._lock:
            if self._rebased:
                return
            self._rebased = True
            shift = start - (self._rows[0][0] if self._rows else self._next)
            if shift:
                self._rows = deque((seq + shift, row) for seq, row in self._rows)
                self._next += shift

    def latest(self, start: int, max_rows: int) -> int:
        with self._lock:
            return min(self._next, start + max_rows)

    def between(self, start: int, end: int) -> list[tuple] | None:
        """Rows with start <= seq < end; None when some of them are no longer (or never
        were) in this process."""
        with self._lock:
            if start >= end:
                return []
            if not self._rows or self._rows[0][0] > start or self._next < end:
                return None
            return [row for seq, row in self._rows if start <= seq < end]

    def forget_before(self, end: int) -> None:
        with self._lock:
            while self._rows and self._rows[0][0] < end:
                self._rows.popleft()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class LiveStreamReader(DataSourceStreamReader):
    """The live source (see the module docstring).  It runs in Spark's long-lived Python
    process for the query on the driver; rows travel to executors inside the partitions."""

    def __init__(self, options: Any) -> None:
        topics = [t.strip().encode("utf-8") for t in options.get("topics", "").split(",") if t.strip()]
        if not topics:
            raise ValueError("brokerd: the live source needs option topics=T1,T2,... (or dataDir=)")
        for topic in topics:
            if not is_id(topic):
                raise ValueError(f"brokerd: {topic!r} is not an SSMP topic")
        host, port = _address(options)
        identity = _identity(options, f"spark-src-{os.getpid()}-{random.randrange(1 << 30)}")
        login = _credentials(options, identity)
        if login["identity"] == b".":
            raise ValueError("brokerd: an anonymous SSMP session cannot subscribe; give an identity")
        timeout = float(options.get("timeout", 10))
        self.max_batch_rows = int(options.get("maxBatchRows", DEFAULT_MAX_BATCH_ROWS))
        self.fail_on_data_loss = _flag(options, "failOnDataLoss")
        self._connect_args = (host, port, timeout, login)
        self._topics = topics
        self._max_buffered = int(options.get("maxBufferedMessages", DEFAULT_MAX_BUFFERED))
        self._feed: Subscription | None = None

    @property
    def feed(self) -> Subscription:
        """The subscription, started on first use: Spark also builds (and pickles) readers in
        processes that only plan, and only the query's long-lived process must subscribe."""
        if self._feed is None:
            host, port, timeout, login = self._connect_args
            self._feed = Subscription(
                lambda: SSMPConnection(host, port, timeout=timeout, **login).connect(),
                self._topics,
                self._max_buffered,
            )
        return self._feed

    def __getstate__(self) -> dict[str, Any]:
        """Executors get the reader to call read(); the rows are in the partition, so the
        live subscription (a thread and a socket) stays here."""
        state = dict(self.__dict__)
        state["_feed"] = None
        return state

    def initialOffset(self) -> dict:
        return {"seq": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        begin = 0 if start is None else int(start["seq"])
        self.feed.rebase(begin)
        return {"seq": self.feed.latest(begin, self.max_batch_rows)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        rows = self.feed.between(int(start["seq"]), int(end["seq"]))
        if rows is None:
            if self.fail_on_data_loss:
                raise RuntimeError(
                    f"brokerd: messages {start['seq']}..{end['seq']} of the live source are gone "
                    "(planned before a restart; SSMP cannot replay them)"
                )
            sys.stderr.write(f"brokerd: live source skips messages {start['seq']}..{end['seq']} lost in a restart\n")
            return []
        return [RowsPartition(rows[i:i + PARTITION_ROWS]) for i in range(0, len(rows), PARTITION_ROWS)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        if not isinstance(partition, RowsPartition):
            raise TypeError(f"not a partition of the live source: {partition!r}")
        return iter(partition.rows)

    def commit(self, end: dict) -> None:
        self.feed.forget_before(int(end["seq"]))

    def stop(self) -> None:
        if self._feed is not None:
            self._feed.stop()


@dataclass
class FileRange(InputPartition):
    path: str
    start: int
    end: int


def _complete_end(path: Path, known: int) -> int:
    """The byte offset just after the last LF of ``path`` (at least ``known``): a line being
    written (or cut by a crash) is not read until it is complete."""
    try:
        size = path.stat().st_size
    except OSError:
        return known
    if size <= known:
        return known
    with open(path, "rb") as handle:
        position = size
        while position > known:
            step = min(65536, position - known)
            position -= step
            handle.seek(position)
            block = handle.read(step)
            newline = block.rfind(b"\n")
            if newline >= 0:
                return position + newline + 1
    return known


class EventLogStreamReader(DataSourceStreamReader):
    """The event-log source (see the module docstring).  Local (or mounted) data dirs only:
    it lists files with the OS, and executors read the same paths."""

    def __init__(self, options: Any) -> None:
        self.root = Path(options["dataDir"]) / schema.EVENTS_DIR
        topics = {t.strip() for t in options.get("topics", "").split(",") if t.strip()}
        self.topics = frozenset(topics) or None
        self.starting = options.get("startingOffsets", "latest").lower()
        if self.starting not in ("latest", "earliest"):
            raise ValueError("brokerd: startingOffsets is 'latest' or 'earliest'")

    def _files(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in self.root.glob(f"date=*/hour=*/*{schema.FILE_SUFFIX}"))

    def initialOffset(self) -> dict:
        if self.starting == "earliest":
            return {"files": {}}
        return {"files": {name: _complete_end(self.root / name, 0) for name in self._files()}}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        known = {} if start is None else dict(start["files"])
        return {"files": {name: _complete_end(self.root / name, known.get(name, 0)) for name in self._files()}}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin = start["files"]
        return [
            FileRange(str(self.root / name), begin.get(name, 0), stop)
            for name, stop in sorted(end["files"].items())
            if stop > begin.get(name, 0)
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        if not isinstance(partition, FileRange):
            raise TypeError(f"not a partition of the file source: {partition!r}")
        part = partition
        topics = self.topics
        with open(part.path, "rb") as handle:
            handle.seek(part.start)
            data = handle.read(part.end - part.start)
        bad = 0
        for line in data.splitlines():
            try:
                record = schema.decode(line)
            except schema.SchemaError:
                bad += 1
                continue
            if record["kind"] != schema.ACCEPTED or record.get("message") != "multicast":
                continue
            topic = record.get("topic")
            if topic is None or (topics is not None and topic not in topics):
                continue
            payload = record.get("payload")
            row = (
                topic,
                record.get("session"),
                None if payload is None else schema.decode_payload(payload),
                datetime.fromtimestamp(record["ts"] / 1_000_000, timezone.utc),
                record["protocol"],
            )
            for _ in range(record.get("count") or 1):  # a run's record stands for its messages
                yield row
        if bad:
            sys.stderr.write(f"brokerd: skipped {bad} bad lines in {part.path}\n")


@dataclass
class Published(WriterCommitMessage):
    partition: int
    published: int
    skipped: int


class _Publisher:
    """Shared by the streaming and the batch writer: one SSMP connection per task."""

    def __init__(self, options: Any, schema_: Any) -> None:
        names = {field.name.lower(): field for field in schema_.fields}
        if "payload" not in names:
            raise ValueError("brokerd: the rows need a payload column (binary or string)")
        self.default_topic = options.get("topic")
        if "topic" not in names and not self.default_topic:
            raise ValueError("brokerd: the rows need a topic column, or give option topic=")
        self.topic_field = names["topic"].name if "topic" in names else None
        self.payload_field = names["payload"].name
        self.host, self.port = _address(options)
        self.options = dict(options)
        self.skip_invalid = options.get("invalidRows", "fail").lower() == "skip"
        self.timeout = float(options.get("timeout", 10))

    def publish(self, rows: Iterator[Any]) -> Published:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        base = self.options.get("identity", "spark-sink")
        identity = _identity({"identity": f"{base}-{partition}-{random.randrange(1 << 30)}"[:64]}, "")
        login = _credentials(self.options, identity)
        published = skipped = 0
        pending: list[tuple[bytes, bytes]] = []
        with SSMPConnection(self.host, self.port, timeout=self.timeout, **login) as connection:
            for row in rows:
                message = self._message(row)
                if message is None:
                    skipped += 1
                    continue
                pending.append(message)
                if len(pending) >= SINK_PIPELINE:
                    published += self._send(connection, pending)
                    pending = []
            if pending:
                published += self._send(connection, pending)
        return Published(partition, published, skipped)

    def _message(self, row: Any) -> tuple[bytes, bytes] | None:
        topic = row[self.topic_field] if self.topic_field else None
        topic = topic if topic is not None else self.default_topic
        payload = row[self.payload_field]
        topic_bytes = topic.encode("utf-8") if isinstance(topic, str) else bytes(topic or b"")
        content = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload or b"")
        if is_id(topic_bytes) and 0 < len(content) <= MAX_PAYLOAD:
            return topic_bytes, content
        if self.skip_invalid:
            return None
        raise ValueError(
            f"brokerd: cannot publish to {topic!r} a payload of {len(content)} bytes: SSMP needs a "
            f"topic of 1-64 id characters and 1-{MAX_PAYLOAD} bytes (option invalidRows=skip skips such rows)"
        )

    @staticmethod
    def _send(connection: SSMPConnection, messages: list[tuple[bytes, bytes]]) -> int:
        refused = connection.mcast_many(messages)
        if refused:
            index, code = refused[0]
            raise SSMPClientError(
                f"broker refused {len(refused)} of {len(messages)} MCASTs (first: {code.decode()} "
                f"for topic {messages[index][0].decode()})"
            )
        return len(messages)


class _Writes:
    """What the streaming and the batch writer share: a task publishes its rows."""

    def __init__(self, options: Any, schema_: Any) -> None:
        self.publisher = _Publisher(options, schema_)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return self.publisher.publish(iterator)


class BrokerdStreamWriter(_Writes, DataSourceStreamWriter):
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        skipped = sum(m.skipped for m in messages if isinstance(m, Published))
        if skipped:
            sys.stderr.write(f"brokerd: batch {batchId}: skipped {skipped} rows SSMP cannot carry\n")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        published = sum(m.published for m in messages if isinstance(m, Published))
        sys.stderr.write(
            f"brokerd: batch {batchId} failed after {published} rows were published; Spark will "
            "publish the batch again (at least once)\n"
        )


class BrokerdBatchWriter(_Writes, DataSourceWriter):
    """``df.write.format("brokerd").save()``: the same publishing, for a batch DataFrame."""
