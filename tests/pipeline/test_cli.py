"""The report command as users run it: a subprocess with its own Spark, progress on stderr,
the summary on stdout; argument errors before any JVM starts."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from brokerd.pipeline.cli import run
from brokerd.pipeline.generate import generate
from brokerd.pipeline.timespec import format_time, parse_time

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.spark
@pytest.mark.slow
def test_report_command_on_a_generated_log(tmp_path: Path) -> None:
    written = generate(tmp_path / "data", 6000, hours=2, seed=7, workers=1)
    result = subprocess.run(
        [sys.executable, "-m", "brokerd.pipeline", "report", "--data-dir", str(tmp_path / "data"),
         "--out", str(tmp_path / "out"), "--master", "local[2]", "--driver-memory", "1g",
         "--conf", "spark.sql.shuffle.partitions=4", "--engine", "spark"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[brokerd-report" in result.stderr and "reading the event log" in result.stderr
    assert f"{written:,} valid of {written:,} lines" in result.stdout
    assert "html          " + str(tmp_path / "out" / "report.html") in result.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["events"] == written and summary["first_event"] == "2024-05-01T00:00:00.000000Z"
    for table in ("traffic", "latency", "top_publishers", "top_subscribers", "dead_letters", "auth_failures"):
        assert list((tmp_path / "out" / table).glob("*.parquet")), table


def test_bad_arguments_exit_2_without_starting_spark(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--data-dir", "d", "--out", "o", "--since=-1h", "--until=-2h"]) == 2
    assert "--since must be before --until" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        run(["--data-dir", "d", "--out", "o", "--since", "yesterday"])
    assert exited.value.code == 2
    assert "ISO date/time" in capsys.readouterr().err


def test_time_arguments() -> None:
    now = 1_714_564_800_000_000
    assert parse_time("2024-05-01", now) == 1_714_521_600_000_000
    assert parse_time("2024-05-01T12:00Z", now) == now
    assert parse_time("2024-05-01 14:00:00.5+02:00", now) == now + 500_000
    assert parse_time("@1714564800.25", now) == now + 250_000
    assert parse_time("-90s", now) == now - 90_000_000
    assert parse_time("-2h", now) == now - 7_200_000_000
    assert format_time(now + 5) == "2024-05-01T12:00:00.000005Z"
    with pytest.raises(ValueError):
        parse_time("@soon", now)


def test_compact_subcommand_checks_its_arguments_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["compact", "--data-dir", "d", "--hours-per-job", "0"]) == 2
    assert "--hours-per-job must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        run(["compact"])
    assert exited.value.code == 2
    assert "--data-dir" in capsys.readouterr().err
