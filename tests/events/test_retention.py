"""Event-log retention: files rotate by size, the oldest hours go first, old hours go."""
from __future__ import annotations

import calendar
import os
import time
from pathlib import Path

from brokerd.events.retention import Retention
from brokerd.events.writer import HourlyFiles, WriterThread
from tests.events.test_writer import T0, _lines, _read

NOW = calendar.timegm(time.strptime("2024-05-10 12:30", "%Y-%m-%d %H:%M"))


def _file(root: Path, date: str, hour: str, name: str, size: int, mtime: float) -> Path:
    path = root / f"date={date}" / f"hour={hour}" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * (size - 1) + b"\n")
    os.utime(path, (mtime, mtime))
    return path


def test_the_oldest_hours_go_first_until_the_total_fits(tmp_path: Path) -> None:
    oldest = _file(tmp_path, "2024-05-10", "09", "events-a-1.jsonl", 400, NOW - 3000)
    older = _file(tmp_path, "2024-05-10", "10", "events-a-1.jsonl", 400, NOW - 9000)  # mtime does not rule
    first_of_hour = _file(tmp_path, "2024-05-10", "11", "events-a-1.jsonl", 400, NOW - 200)
    second_of_hour = _file(tmp_path, "2024-05-10", "11", "events-a-2.jsonl", 400, NOW - 100)
    current = _file(tmp_path, "2024-05-10", "12", "events-b-1.jsonl", 400, NOW)
    retention = Retention(tmp_path, max_bytes=1000, max_age=86400, now=lambda: NOW)
    assert retention.enforce(current) == 1200
    assert [p.exists() for p in (oldest, older, first_of_hour, second_of_hour, current)] == [
        False, False, False, True, True]
    assert not (tmp_path / "date=2024-05-10" / "hour=09").exists()  # empty partitions go too
    assert retention.deleted_files == 3


def test_hours_older_than_the_age_go_and_the_current_file_never(tmp_path: Path) -> None:
    stale = _file(tmp_path, "2024-05-08", "11", "events-a-1.jsonl", 10, NOW)
    recent = _file(tmp_path, "2024-05-09", "12", "events-a-1.jsonl", 10, NOW)  # ended 23.5 h ago
    current = _file(tmp_path, "2024-05-08", "10", "events-b-9.jsonl", 10, NOW)
    Retention(tmp_path, max_bytes=1 << 30, max_age=86400, now=lambda: NOW).enforce(current)
    assert not stale.exists() and not stale.parent.exists()
    assert recent.exists() and current.exists()


def test_files_rotate_by_size_within_an_hour(tmp_path: Path) -> None:
    files = HourlyFiles(tmp_path, "run", max_file_bytes=250)
    stamps, lines = _lines(*(T0 + i for i in range(10)))
    assert files.write(stamps, lines) == 10
    files.close()
    sizes = [p.stat().st_size for p in sorted((tmp_path / "date=2024-05-01" / "hour=11").iterdir())]
    assert len(sizes) > 1 and all(size < 250 + len(lines[0]) for size in sizes)
    assert _read(tmp_path) == {"date=2024-05-01/hour=11": stamps}


def test_the_writer_keeps_the_log_under_its_cap_and_pauses_below_the_disk_floor(tmp_path: Path) -> None:
    paused = [False]
    retention = Retention(tmp_path, max_bytes=2000, max_age=1e12)
    files = HourlyFiles(tmp_path, "run", max_file_bytes=retention.file_bytes)
    reports: list[str] = []
    writer = WriterThread(files, reports.append, retention=retention, paused=lambda: paused[0])
    writer.start()
    for batch in range(40):
        writer.submit(*_lines(*(T0 + batch * 10 + i for i in range(10))))
        writer.drain()
    total = sum(p.stat().st_size for p in tmp_path.rglob("*.jsonl"))
    assert writer.written == 400 and files.bytes_written > 10 * 2000
    assert total <= 2000 + retention.file_bytes + len(_lines(T0)[1][0])
    paused[0] = True
    writer.submit(*_lines(T0 + 999))
    writer.drain()
    assert writer.lost == 1 and "--disk-free-limit" in reports[-1]
    paused[0] = False
    writer.submit(*_lines(T0 + 1000))
    writer.drain()
    assert writer.written == 401 and "works again" in reports[-1]
    writer.stop()
    writer.join(5)
