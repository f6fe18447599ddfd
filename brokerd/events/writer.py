"""Writing event records to hourly JSON-lines files, on a thread of its own.

:class:`HourlyFiles` knows the file layout: a record goes to
``<root>/date=YYYY-MM-DD/hour=HH/events-<run>-<n>.jsonl`` by its own timestamp, so a batch that
spans an hour boundary is split correctly, and each file belongs to one broker run (``run``),
which is never appended to by another.  After a failed write the file is abandoned and the
next write opens ``n + 1``, so a half-written line can only ever be the last line of a file
(the pipeline counts and skips it).

:class:`WriterThread` owns one daemon thread that takes batches of encoded lines from a
bounded queue and writes them (the lines are encoded on the reactor thread: a thread running
Python would take the GIL at each of the reactor's syscalls).  When the queue is full the
reactor side drops the batch and counts it, so a slow or stuck disk costs events, never memory
or delivery.  A failure to write is reported once per
episode (and once more when writing works again), never raised to the broker.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from brokerd.events.retention import Retention
from brokerd.events.schema import FILE_SUFFIX, HOUR_US, partition_of

RETENTION_INTERVAL = 60.0
"""Seconds between two retention passes while little is written."""



def count_lines(chunks: list[bytes]) -> int:
    """Lines in ``chunks`` (each chunk holds one or more LF-terminated lines)."""
    return sum(chunk.count(b"\n") for chunk in chunks)


class HourlyFiles:
    """Appends lines to the file of their hour, rotating as the hours change."""

    def __init__(self, root: Path, run: str, fsync: bool = False, max_file_bytes: int = 0) -> None:
        self.root = Path(root)
        self.run = run
        self.fsync = fsync
        self.max_file_bytes = max_file_bytes
        """A new file is started once the current one holds this much (0: one file an hour)."""
        self._handle: BinaryIO | None = None
        self._partition: tuple[str, str] | None = None
        self._serial = 0
        self._file_bytes = 0
        self.current_path: Path | None = None
        self.files_opened = 0
        self.bytes_written = 0

    def _open(self, partition: tuple[str, str]) -> None:
        self.close()
        date, hour = partition
        directory = self.root / f"date={date}" / f"hour={hour}"
        directory.mkdir(parents=True, exist_ok=True)
        self._serial += 1
        path = directory / f"events-{self.run}-{self._serial}{FILE_SUFFIX}"
        self._handle = open(path, "ab")  # noqa: SIM115 - kept open across batches
        self._partition = partition
        self._file_bytes = 0
        self.current_path = path
        self.files_opened += 1

    def write(self, stamps: list[int], lines: list[bytes]) -> int:
        """Append ``lines`` (chunks of one or more LF-terminated lines, each with a timestamp
        in µs in its hour); return how many lines were written.  Raises OSError (the file is
        then abandoned; the next call starts a new one)."""
        if not lines:
            return 0
        try:
            first_hour = min(stamps) // HOUR_US
            if first_hour == max(stamps) // HOUR_US:
                self._write_chunk(first_hour, lines)
            else:
                self._write_by_hour(stamps, lines)
            if self._handle is not None:
                self._handle.flush()
                if self.fsync:
                    os.fsync(self._handle.fileno())
        except OSError:
            self._abandon()
            raise
        return count_lines(lines)

    def _write_by_hour(self, stamps: list[int], lines: list[bytes]) -> None:
        """A batch across an hour boundary (or a clock step): consecutive runs of one hour."""
        chunk: list[bytes] = []
        chunk_hour = stamps[0] // HOUR_US
        for ts, line in zip(stamps, lines):
            hour = ts // HOUR_US
            if hour != chunk_hour:
                self._write_chunk(chunk_hour, chunk)
                chunk = []
                chunk_hour = hour
            chunk.append(line)
        self._write_chunk(chunk_hour, chunk)

    def _write_chunk(self, hour: int, lines: list[bytes]) -> None:
        partition = partition_of(hour * HOUR_US)
        if partition != self._partition or self._handle is None:
            self._open(partition)
        limit = self.max_file_bytes
        if not limit:
            self._append(b"".join(lines))
            return
        start = 0
        room = limit - self._file_bytes
        for end, chunk in enumerate(lines):
            if room <= 0:  # the file is full: what came before goes to it, the rest to a new one
                self._append(b"".join(lines[start:end]))
                self._open(partition)
                start, room = end, limit
            room -= len(chunk)
        self._append(b"".join(lines[start:]))

    def _append(self, data: bytes) -> None:
        if data:
            if self._handle is None:  # _write_chunk opens the file first
                raise RuntimeError("the event log's file is not open")
            self._handle.write(data)
            self._file_bytes += len(data)
            self.bytes_written += len(data)

    def _abandon(self) -> None:
        handle, self._handle, self._partition = self._handle, None, None
        if handle is not None:
            try:
                handle.close()
            except OSError:
                pass

    def close(self) -> None:
        """Flush, sync and close the current file (at rotation and at shutdown)."""
        handle, self._handle, self._partition = self._handle, None, None
        if handle is None:
            return
        try:
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            handle.close()


_STOP = object()


class WriterThread:
    """A daemon thread draining a bounded queue of batches into :class:`HourlyFiles`.  A batch
    is what :meth:`HourlyFiles.write` takes: chunks of lines, and a timestamp (µs) for each
    chunk, every line of a chunk in the hour of its timestamp.

    ``report(text)`` is called (on this thread) with a one-line message when writing starts
    failing and when it works again; the caller decides how to get it to the log.
    """

    def __init__(
        self,
        files: HourlyFiles,
        report: Callable[[str], None],
        max_pending: int = 8,
        retention: Retention | None = None,
        paused: Callable[[], bool] | None = None,
    ) -> None:
        self.files = files
        self.report = report
        self.retention = retention
        """Enforced when the thread starts, then every RETENTION_INTERVAL seconds or quarter
        of a file written."""
        self.paused = paused
        """True while nothing may be written (the disk is below --disk-free-limit): batches
        are then dropped and counted as lost."""
        self._retained_at = 0.0
        self._retained_bytes = 0
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self.written = 0
        """Records written."""
        self.overflowed = 0
        """Records dropped because the queue was full (the disk could not keep up)."""
        self.lost = 0
        """Records lost to write errors."""
        self.failing = False
        self._lost_in_episode = 0
        self._stopping = False
        self._on_stopped: Callable[[], None] | None = None

    def start(self) -> None:
        if self.alive:
            return
        self._thread = threading.Thread(target=self._run, name="brokerd-event-log", daemon=True)
        self._thread.start()

    def submit(self, stamps: list[int], lines: list[bytes]) -> bool:
        """Queue a batch for writing; False (and counted) when the queue is full.  Never
        blocks: called on the reactor thread."""
        try:
            self._queue.put_nowait((stamps, lines))
        except queue.Full:
            self.overflowed += count_lines(lines)
            return False
        return True

    def drain(self) -> None:
        """Block until every submitted batch has been written (tests, benchmarks, shutdown)."""
        if not self.alive:
            raise RuntimeError("the writer thread is not running")
        self._queue.join()

    def stop(self, on_stopped: Callable[[], None] | None = None) -> None:
        """Have the thread write what is queued, close the file and end; then it calls
        ``on_stopped`` (on the writer thread).  Never blocks (it is called on the reactor
        thread): when the queue is full the thread stops once it has emptied it.  How long to
        wait for that behind a stuck disk is the caller's choice."""
        if not self.alive:
            if on_stopped is not None:
                on_stopped()
            return
        self._on_stopped = on_stopped
        self._stopping = True
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            pass  # the thread has batches to take, and checks _stopping after each

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def pending(self) -> int:
        """Batches waiting for the thread (at most ``max_pending``)."""
        return self._queue.qsize()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        take = self._queue.get
        done = self._queue.task_done
        self._retain()
        while True:
            batch = take()
            try:
                if batch is _STOP:
                    self._close()
                    return
                self._write(*batch)
            finally:
                done()
            if self._stopping and self._queue.empty():
                self._close()
                return

    def _write(self, stamps: list[int], lines: list[bytes]) -> None:
        if self.paused is not None and self.paused():
            self._lose(lines, f"{self.files.root}: the disk is below --disk-free-limit")
            return
        try:
            self.written += self.files.write(stamps, lines)
        except OSError as exc:
            self._lose(lines, f"cannot write {exc.filename or self.files.root}: {exc.strerror or exc}")
            return
        self._retain()
        if self.failing:
            self.failing = False
            self.report(
                f"event log: writing to {self.files.root} works again; "
                f"{self._lost_in_episode} events were lost"
            )
            self._lost_in_episode = 0

    def _lose(self, lines: list[bytes], why: str) -> None:
        lost = count_lines(lines)
        self.lost += lost
        self._lost_in_episode += lost
        if not self.failing:
            self.failing = True
            self.report(
                f"event log: {why}; events are being dropped until it works again "
                "(message delivery is not affected)"
            )

    def _retain(self) -> None:
        """Apply the retention limits when it is time (on this thread: it walks the files)."""
        retention = self.retention
        if retention is None:
            return
        now = time.monotonic()
        written = self.files.bytes_written
        if self._retained_at and now - self._retained_at < RETENTION_INTERVAL and (
            written - self._retained_bytes < retention.file_bytes // 4
        ):
            return
        self._retained_at, self._retained_bytes = now, written
        try:
            retention.enforce(self.files.current_path)
        except OSError as exc:
            self.report(f"event log: retention in {self.files.root}: {exc.strerror or exc}")

    def _close(self) -> None:
        self._retained_at = 0.0
        self._retain()
        try:
            self.files.close()
        except OSError as exc:
            self.report(f"event log: closing {self.files.root}: {exc.strerror or exc}")
        callback = self._on_stopped
        if callback is not None:
            callback()
