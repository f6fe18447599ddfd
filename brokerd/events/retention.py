"""Event-log retention: the log's files are kept under a total size and a maximum age.

Without it the log only grows: one connection alternating SUB/UNSUB writes hundreds of
megabytes a minute.  The writer thread (never the reactor) calls :meth:`Retention.enforce`
now and then; it deletes whole files, oldest hour partition first (and, within an hour, the
oldest file first), until the files left add up to at most ``max_bytes``, and every file of an
hour that ended more than ``max_age`` seconds ago.  The file being written is never deleted;
the writer starts a new file every ``file_bytes`` bytes so that even a flood within one hour
leaves older files to delete.  Empty partition directories are removed.
"""
from __future__ import annotations

import calendar
import os
import time
from collections.abc import Callable
from pathlib import Path

from brokerd.events.schema import FILE_SUFFIX

HOUR_S = 3600


def _hour_start(partition: Path) -> int | None:
    """Epoch seconds at which ``.../date=YYYY-MM-DD/hour=HH`` begins (None if not such a name)."""
    try:
        date = partition.parent.name.removeprefix("date=")
        hour = int(partition.name.removeprefix("hour="))
        parsed = time.strptime(date, "%Y-%m-%d")
    except ValueError:
        return None
    return calendar.timegm(parsed) + hour * HOUR_S


class Retention:
    """Deletes the oldest event-log files over ``max_bytes`` in all or ``max_age`` seconds old."""

    def __init__(self, root: Path, max_bytes: int, max_age: float, now: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.max_age = max_age
        self._now = now
        self.deleted_files = 0
        self.deleted_bytes = 0

    @property
    def file_bytes(self) -> int:
        """Size at which the writer starts a new file: an eighth of the total, at most 64 MiB."""
        return max(1, min(self.max_bytes // 8, 64 << 20))

    def _files(self) -> list[tuple[int, float, Path, int]]:
        """(hour start, mtime, path, size) of every log file, oldest first."""
        found = []
        for partition in self.root.glob("date=*/hour=*"):
            start = _hour_start(partition)
            if start is None:
                continue
            for path in partition.glob("*" + FILE_SUFFIX):
                try:
                    st = path.stat()
                except OSError:
                    continue
                found.append((start, st.st_mtime, path, st.st_size))
        found.sort()
        return found

    def enforce(self, current: Path | None) -> int:
        """Delete what is too old or too much (never ``current``); return the bytes freed."""
        files = self._files()
        total = sum(size for *_rest, size in files)
        expired_before = self._now() - self.max_age
        freed = 0
        for start, _mtime, path, size in files:
            if path == current:
                continue
            if total <= self.max_bytes and start + HOUR_S > expired_before:
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                continue
            total -= size
            freed += size
            self.deleted_files += 1
            self._remove_if_empty(path.parent)
        self.deleted_bytes += freed
        return freed

    @staticmethod
    def _remove_if_empty(partition: Path) -> None:
        for directory in (partition, partition.parent):
            try:
                os.rmdir(directory)
            except OSError:
                return
