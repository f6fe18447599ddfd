"""HourlyFiles and WriterThread: hourly layout, rotation, failure and recovery, bounded queue."""
from __future__ import annotations

import json
import threading
from pathlib import Path

from brokerd.events import schema
from brokerd.events.writer import HourlyFiles, WriterThread

HOUR = 3_600_000_000
T0 = 1_714_563_000_000_000  # 2024-05-01T11:30:00Z


def _lines(*stamps: int) -> tuple[list[int], list[bytes]]:
    return list(stamps), [schema.encode({"v": 1, "ts": ts, "protocol": "ssmp", "kind": "login"}).encode() for ts in stamps]


def _read(root: Path) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.jsonl")):
        key = str(path.parent.relative_to(root))
        found.setdefault(key, []).extend(json.loads(line)["ts"] for line in path.read_text().splitlines())
    return found


def test_records_go_to_the_file_of_their_own_hour(tmp_path: Path) -> None:
    files = HourlyFiles(tmp_path, "run1")
    assert files.write(*_lines(T0, T0 + 1)) == 2
    # one batch across the hour boundary and back (clock steps) is split by record time
    assert files.write(*_lines(T0 + HOUR // 2, T0 + 2, T0 + HOUR)) == 3
    files.close()
    assert _read(tmp_path) == {
        "date=2024-05-01/hour=11": [T0, T0 + 1, T0 + 2],
        "date=2024-05-01/hour=12": [T0 + HOUR // 2, T0 + HOUR],
    }
    assert all(path.name.startswith("events-run1-") for path in tmp_path.rglob("*.jsonl"))


def test_a_failed_file_is_abandoned_and_the_next_write_starts_a_new_one(tmp_path: Path) -> None:
    files = HourlyFiles(tmp_path, "run1")
    directory = tmp_path / "date=2024-05-01" / "hour=11"
    directory.mkdir(parents=True)
    (directory / "events-run1-1.jsonl").symlink_to("/dev/full")
    try:
        files.write(*_lines(T0))
    except OSError as exc:
        assert exc.errno == 28  # ENOSPC
    else:
        raise AssertionError("writing to /dev/full must fail")
    assert files.write(*_lines(T0 + 5)) == 1
    files.close()
    assert (directory / "events-run1-2.jsonl").read_text().count("\n") == 1


def test_writer_reports_a_failure_once_and_the_recovery(tmp_path: Path) -> None:
    root = tmp_path / "events"
    root.write_text("a file where the directory should be")
    reports: list[str] = []
    writer = WriterThread(HourlyFiles(root, "r"), reports.append)
    writer.start()
    for _ in range(3):
        writer.submit(*_lines(T0))
    writer.drain()
    assert writer.lost == 3 and writer.written == 0 and writer.failing
    assert len(reports) == 1 and "cannot write" in reports[0] and "not affected" in reports[0]

    root.unlink()
    writer.submit(*_lines(T0, T0 + 1))
    writer.drain()
    assert writer.written == 2 and not writer.failing
    assert len(reports) == 2 and "works again" in reports[1] and "3 events were lost" in reports[1]
    stopped = threading.Event()
    writer.stop(stopped.set)
    assert stopped.wait(5)


def test_a_full_queue_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    release = threading.Event()

    class StuckDisk(HourlyFiles):
        def write(self, stamps: list[int], lines: list[bytes]) -> int:
            release.wait(10)
            return super().write(stamps, lines)

    writer = WriterThread(StuckDisk(tmp_path, "r"), lambda text: None, max_pending=2)
    writer.start()
    accepted = [writer.submit(*_lines(T0 + i)) for i in range(6)]
    # one batch is on the thread, two wait in the queue; the rest are dropped at once
    assert accepted.count(False) >= 3
    assert writer.overflowed == accepted.count(False)
    release.set()
    writer.drain()
    assert writer.written == accepted.count(True)
    writer.stop()
    writer.join(5)
    assert not writer.alive
