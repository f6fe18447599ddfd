"""``brokerd-report`` (and ``python -m brokerd.pipeline report``): the report job's command line.

Exit status: 0 done; 2 bad arguments, a local data dir that does not exist or holds no event
log, or PySpark missing; 1 the Spark job failed (one line
on stderr saying why).  Bad lines in the log are never a failure: they are counted and shown.

``--engine``: ``spark`` distributes the report with Spark; ``arrow`` runs it in this process
(brokerd.pipeline.report with no Spark session, no JVM: local master, data dir and out only,
and every input must parse with pyarrow); ``auto`` (the default) runs ``arrow`` where it may
and falls back to ``spark`` when an input needs Spark's JSON reader.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from brokerd import __version__
from brokerd.pipeline.timespec import parse_time

DEFAULT_TOP = 100
ENGINES = ("auto", "spark", "arrow")


def _conf(value: str) -> tuple[str, str]:
    key, sep, setting = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{value!r}: expected KEY=VALUE")
    return key, setting


def _time(value: str) -> int:
    try:
        return parse_time(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _size(value: str) -> int:
    """A byte count: digits, optionally followed by k, m or g (binary multiples)."""
    text = value.strip().lower()
    number, unit = (text[:-1], text[-1]) if text[-1:] in _SIZE_UNITS and text[-1:] else (text, "")
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a positive byte count such as 536870912 or 512m")
    return int(number) * _SIZE_UNITS[unit]


def report_parser(prog: str = "brokerd-report") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Read a broker's event log (pyarrow in this process when it is local, else "
        "Spark); write Parquet tables, an HTML report and print a summary.",
    )
    parser.add_argument("--version", action="version", version=f"{prog} {__version__}")
    parser.add_argument("--data-dir", required=True, help="the broker's data dir (local path or cluster URI)")
    parser.add_argument("--out", required=True, help="directory for the tables (local path or cluster URI)")
    parser.add_argument("--master", help="Spark master URL [local[*]; under spark-submit: spark-submit's]")
    parser.add_argument("--since", type=_time, help="first instant included: ISO time, @EPOCH, or relative as --since=-6h")
    parser.add_argument("--until", type=_time, help="first instant excluded: ISO time, @EPOCH, or relative as --until=-1h")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"rows of the top-N tables [{DEFAULT_TOP}]")
    parser.add_argument("--html-dir", help="where report.html and summary.json go when --out is a cluster URI [.]")
    parser.add_argument("--driver-memory", help="Spark driver memory for local runs [4g]")
    parser.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                        help="any Spark setting (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--no-compact", dest="compact", action="store_false",
                        help="do not compact closed hours first (e.g. a read-only data dir)")
    parser.add_argument("--delete-json", action="store_true",
                        help="delete an hour's JSON files once it is compacted [keep them]")
    parser.add_argument("--engine", choices=ENGINES, default="auto",
                        help="auto: pyarrow in this process (no JVM) when master, data dir and out are local "
                        "and every input parses with pyarrow, else Spark; spark: always Spark; arrow: never "
                        "Spark (fails when an input needs Spark's reader) [auto]")
    parser.add_argument("--arrow-max-memory", type=_size, default=None, metavar="BYTES",
                        help="most memory the Arrow engine may hold for the summaries and open hours it reads "
                        "(a number, or with k/m/g); past it, auto runs the report on Spark and arrow fails [2g]")
    return parser


def compact_parser(prog: str = "brokerd-report compact") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Convert the closed hours of a broker's event log into Parquet (once per hour; "
        "safe to interrupt and to run again).",
    )
    parser.add_argument("--data-dir", required=True, help="the broker's data dir (local path or cluster URI)")
    parser.add_argument("--master", help="Spark master URL [local[*]]")
    parser.add_argument("--delete-json", action="store_true",
                        help="delete an hour's JSON files once it is compacted [keep them]")
    parser.add_argument("--hours-per-job", type=int, default=24, help="hours converted and published per Spark job [24]")
    parser.add_argument("--driver-memory", help="Spark driver memory for local runs [4g]")
    parser.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                        help="any Spark setting (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def missing_log(data_dir: str) -> str | None:
    """Why a local ``data_dir`` has nothing to report on (it does not exist, or holds no hour
    of event log, raw or compacted), or None.  Cluster storage is not looked at here."""
    from brokerd.pipeline.compact import COMPACTED_DIR
    from brokerd.pipeline.localfs import local_path

    local = local_path(data_dir)
    if local is None:
        return None
    root = Path(local)
    if not root.is_dir():
        return f"{data_dir}: no such data dir"
    if all(next((root / directory).glob("date=*/hour=*"), None) is None for directory in ("events", COMPACTED_DIR)):
        return f"{data_dir}: no event log in it (no events/date=*/hour=*/; is it the broker's --data-dir?)"
    return None


def _has_pyspark(prog: str) -> bool:
    """Whether PySpark imports; if not, says so in one line (it is the optional extra)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print(f"{prog}: PySpark is not installed (pip install 'brokerd[pipeline]')", file=sys.stderr)
        return False
    return True


def _session(args: argparse.Namespace, **options: Any) -> Any:
    """The Spark session of both subcommands, from --master, --conf, --driver-memory, --quiet."""
    from brokerd.pipeline.session import build_session

    conf = dict(args.conf)
    if args.driver_memory:
        conf["spark.driver.memory"] = args.driver_memory
    return build_session(args.master, conf=conf, quiet=args.quiet, **options)


def run_compact(argv: list[str], prog: str = "brokerd-report compact") -> int:
    args = compact_parser(prog).parse_args(argv)
    if args.hours_per_job <= 0:
        print(f"{prog}: --hours-per-job must be positive", file=sys.stderr)
        return 2
    problem = missing_log(args.data_dir)
    if problem is not None and problem.endswith("no such data dir"):
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    from brokerd.pipeline.compact import nothing_to_compact

    idle = nothing_to_compact(args.data_dir)
    if idle is not None:  # nothing to convert: no JVM to start
        print(f"compacted 0 hour(s); {len(idle.already)} compacted before; {len(idle.open)} still open")
        return 0
    if not _has_pyspark(prog):
        return 2
    from brokerd.pipeline.compact import compact
    from brokerd.pipeline.report import timed
    from brokerd.pipeline.session import Progress

    spark = _session(args, app_name="brokerd-compact")
    try:
        with Progress(spark, enabled=not args.quiet) as progress:
            result, elapsed = timed(
                compact, spark, args.data_dir, delete_json=args.delete_json,
                hours_per_job=args.hours_per_job, progress=progress,
            )
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"{prog}: the compaction failed: {first}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    print(f"compacted {len(result.compacted)} hour(s) ({result.lines:,} lines) in {elapsed:.1f} s; "
          f"{len(result.already)} compacted before; {len(result.open)} still open"
          + (f"; deleted {result.deleted_files} JSON file(s)" if args.delete_json else ""))
    return 0


def run(argv: list[str] | None = None, prog: str = "brokerd-report") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compact":
        return run_compact(argv[1:], prog=f"{prog} compact")
    args = report_parser(prog).parse_args(argv)
    if args.since is not None and args.until is not None and args.since >= args.until:
        print(f"{prog}: --since must be before --until", file=sys.stderr)
        return 2
    if args.top <= 0:
        print(f"{prog}: --top must be positive", file=sys.stderr)
        return 2
    problem = missing_log(args.data_dir)
    if problem is not None:
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    from brokerd.pipeline.localfs import usable

    arrow = args.engine != "spark" and usable(args.master, args.data_dir, args.out) and not _submitted(args)
    if args.engine == "arrow" and not arrow:
        print(f"{prog}: --engine arrow needs a local master (local[*], local[N]) and local --data-dir and --out",
              file=sys.stderr)
        return 2
    if arrow:
        status = _run_arrow(args, prog)
        if status is not None:
            return status
    if not _has_pyspark(prog):
        return 2
    from brokerd.pipeline.report import run_report, text_summary, timed
    from brokerd.pipeline.session import Progress

    spark = _session(args)
    try:
        with Progress(spark, enabled=not args.quiet) as progress:
            summary, elapsed = timed(
                run_report, spark, args.data_dir, args.out, since_us=args.since, until_us=args.until,
                top=args.top, html_dir=args.html_dir, progress=progress,
                compact=args.compact, delete_json=args.delete_json,
            )
    except Exception as exc:  # Spark's errors are long; one line, then the exit status
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"{prog}: the report job failed: {first}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    print(text_summary(summary, elapsed))
    return 0


def _submitted(args: argparse.Namespace) -> bool:
    """Under spark-submit without --master, the master is spark-submit's: leave it to Spark."""
    from brokerd.pipeline.session import under_spark_submit

    return args.master is None and under_spark_submit()


def _run_arrow(args: argparse.Namespace, prog: str) -> int | None:
    """The report on the Arrow engine; None when an input needs Spark and the engine is
    ``auto`` (the caller then runs it on Spark)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        if args.engine == "arrow":
            print(f"{prog}: pyarrow is not installed (pip install 'brokerd[pipeline]')", file=sys.stderr)
            return 2
        return None
    from brokerd.pipeline.arrowjson import NotConvertible
    from brokerd.pipeline.arrowread import TooLarge
    from brokerd.pipeline.report import run_report, text_summary, timed
    from brokerd.pipeline.session import Progress

    try:
        with Progress(None, enabled=not args.quiet) as progress:
            summary, elapsed = timed(
                run_report, None, args.data_dir, args.out, since_us=args.since, until_us=args.until, top=args.top,
                html_dir=args.html_dir, progress=progress, compact=args.compact, delete_json=args.delete_json,
                max_memory=args.arrow_max_memory,
            )
    except TooLarge as exc:
        if args.engine == "arrow":
            print(f"{prog}: {exc}; use --engine spark or auto, or raise --arrow-max-memory", file=sys.stderr)
            return 1
        if not args.quiet:
            print(f"[brokerd-report] {exc}: running on Spark", file=sys.stderr)
        return None
    except NotConvertible as exc:
        if args.engine == "arrow":
            print(f"{prog}: pyarrow cannot read the log ({str(exc).splitlines()[0]}); use --engine spark or auto",
                  file=sys.stderr)
            return 1
        if not args.quiet:
            print(f"[brokerd-report] pyarrow cannot read the log ({str(exc).splitlines()[0]}): running on Spark",
                  file=sys.stderr)
        return None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"{prog}: the report job failed: {first}", file=sys.stderr)
        return 1
    print(text_summary(summary, elapsed))
    return 0


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())
