"""brokerd-report as a new user meets it: a data dir that is not there or holds no log, a
compaction with nothing to do (which must not start a JVM), and plots that stay readable
(the legend beside the plot, never over a line; an all-zero series on a 0 to 1 axis)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "import sys; sys.argv[0] = 'brokerd-report'; from brokerd.pipeline.cli import main; main()"


def report(*args: str) -> subprocess.CompletedProcess:
    """``brokerd-report ARGS`` with no Java to be found: a command that started a JVM fails."""
    env = dict(os.environ, JAVA_HOME=str(ROOT / "no-java-here"), PATH="/usr/local/sbin:/bin:/sbin",
               PYTHONPATH=str(ROOT))
    script = Path(sys.executable).parent / "brokerd-report"  # the console script, as installed
    command = [str(script)] if script.exists() else [sys.executable, "-c", ENTRY]
    return subprocess.run([*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def hour_dir(data: Path, at: datetime) -> Path:
    directory = data / "events" / f"date={at:%Y-%m-%d}" / f"hour={at:%H}"
    directory.mkdir(parents=True)
    return directory


def test_a_missing_data_dir_or_one_without_a_log_is_one_line_and_non_zero(tmp_path: Path) -> None:
    missing = report("--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr == f"brokerd-report: {tmp_path / 'nowhere'}: no such data dir\n"
    (tmp_path / "empty" / "events").mkdir(parents=True)
    empty = report("--data-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "out"))
    assert empty.returncode == 2 and len(empty.stderr.splitlines()) == 1
    assert empty.stderr.startswith(f"brokerd-report: {tmp_path / 'empty'}: no event log in it")
    compact = report("compact", "--data-dir", str(tmp_path / "nowhere"))
    assert compact.returncode == 2 and compact.stderr.endswith("no such data dir\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # four brokerd-report processes, each importing pyarrow
@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="compaction needs pyarrow (the 'pipeline' extra)")
def test_compact_with_nothing_to_do_starts_no_jvm(tmp_path: Path) -> None:
    data = tmp_path / "data"
    now = datetime.now(timezone.utc)
    (hour_dir(data, now) / "x.jsonl").write_text("")  # the hour still being written: not closed
    done = report("compact", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "compacted 0 hour(s); 0 compacted before; 1 still open\n"
    # a closed hour is compacted in this process too (no JVM here)
    hour_dir(data, now - timedelta(hours=3))
    work = report("compact", "--data-dir", str(data), "--quiet")
    assert work.returncode == 0, work.stderr
    assert work.stdout.startswith("compacted 1 hour(s) (0 lines) in ") and work.stdout.endswith(" 1 still open\n")
    # positive control: a closed hour with a line only Spark's reader can mark needs the JVM
    (hour_dir(data, now - timedelta(hours=2)) / "x.jsonl").write_text("{not json\n")
    needs_spark = report("compact", "--data-dir", str(data), "--quiet")
    assert needs_spark.returncode == 1 and "brokerd-report compact: the compaction failed" in needs_spark.stderr
    refused = report("compact", "--data-dir", str(data), "--engine", "arrow")
    assert refused.returncode == 1 and refused.stdout == "", refused.stderr
    assert refused.stderr.endswith("pyarrow cannot parse 1 hour(s) of the log; use --engine spark or auto\n")


@pytest.fixture()
def matplotlib_figures() -> None:
    pytest.importorskip("matplotlib")


def _overlap(a: object, b: object) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1  # type: ignore[attr-defined]


def test_the_legend_is_beside_the_plot_and_an_all_zero_series_has_an_axis(matplotlib_figures: None) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from brokerd.pipeline.html import latency_figure, queue_figure, rate_figure

    start = datetime(2024, 5, 1, tzinfo=timezone.utc)
    # the busiest bucket last, top right: where a legend "upper right" inside the plot sits
    busy = {"ssmp": [(start + timedelta(seconds=10 * i), float(i)) for i in range(30)],
            "mcchat": [(start + timedelta(seconds=10 * i), float(i) / 2) for i in range(30)]}
    zero = {"ssmp": [(start + timedelta(seconds=10 * i), 0.0) for i in range(30)]}
    queues = [{"time": start + timedelta(minutes=i), "pending": 0, "unacknowledged": 0, "trash": 0} for i in range(5)]
    latency = [{"protocol": "ssmp", "kind": "mcast", "p50_us": 10, "p90_us": 20, "p99_us": 30, "max_us": 40}]
    for figure in (rate_figure(busy, 10), rate_figure(zero, 10), queue_figure(queues), latency_figure(latency)):
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        renderer = canvas.get_renderer()
        axes = figure.axes[0]
        legend = axes.get_legend()
        assert legend is not None
        assert not _overlap(legend.get_window_extent(renderer), axes.get_window_extent(renderer))
    for figure in (rate_figure(zero, 10), queue_figure(queues)):
        axes = figure.axes[0]
        assert axes.get_ylim() == (0.0, 1.0)
        FigureCanvasAgg(figure).draw()
        assert [label.get_text() for label in axes.get_yticklabels()] == ["0", "1"]
    assert rate_figure(busy, 10).axes[0].get_ylim()[1] >= 29  # positive control: data sets the top


def test_without_the_pipeline_extra_the_report_says_what_to_install(tmp_path: Path) -> None:
    """A data dir with a log, pyarrow hidden (as in a venv with only the ``test`` extra): one
    line naming the extra, exit 2, no traceback; the missing-dir check still answers first."""
    hidden = tmp_path / "hidden"
    (hidden / "pyarrow").mkdir(parents=True)
    (hidden / "pyarrow" / "__init__.py").write_text("raise ImportError('hidden for this test')\n")
    data = tmp_path / "data"
    (hour_dir(data, datetime.now(timezone.utc) - timedelta(hours=3)) / "x.jsonl").write_text("")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden), str(ROOT)]))
    done = subprocess.run([sys.executable, "-c", ENTRY, "--data-dir", str(data), "--out", str(tmp_path / "out")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "brokerd-report: pyarrow is not installed (pip install '.[pipeline]' in brokerd's checkout)\n"
    missing = subprocess.run([sys.executable, "-c", ENTRY, "--data-dir", str(tmp_path / "nowhere"), "--out", "o"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.endswith("no such data dir\n")
