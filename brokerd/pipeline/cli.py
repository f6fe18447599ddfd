"""``brokerd-report`` (and ``python -m brokerd.pipeline report``): the report job's command line.

Exit status: 0 done; 2 bad arguments, a local data dir that does not exist or holds no event
log, or PySpark missing; 1 the job failed (one line on stderr saying why).  Bad lines in the
log are never a failure: they are counted and shown.  ``--engine`` (both subcommands): where
the job runs, in this process with pyarrow (no JVM) or on Spark; ``auto`` falls back to Spark.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from brokerd import __version__
from brokerd.pipeline.localfs import COMPACTED_DIR, local_path
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


def _common(parser: argparse.ArgumentParser, what: str) -> None:
    """The options of both subcommands: where the log is, and where and how Spark runs."""
    parser.add_argument("--data-dir", required=True, help="the broker's data dir (local path or cluster URI)")
    parser.add_argument("--master", help="Spark master URL [local[*]; under spark-submit: spark-submit's]")
    parser.add_argument("--driver-memory", help="Spark driver memory for local runs [4g]")
    parser.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                        help="any Spark setting (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--delete-json", action="store_true",
                        help="delete an hour's JSON files once it is compacted [keep them]")
    parser.add_argument("--engine", choices=ENGINES, default="auto",
                        help=f"auto: pyarrow in this process (no JVM) when {what} local (whatever the master) "
                        "and every input parses with pyarrow, else Spark; spark: always Spark; arrow: never Spark "
                        "(fails when an input needs Spark's reader) [auto]")


def report_parser(prog: str = "brokerd-report") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Read a broker's event log (pyarrow in this process when it is local, else "
        "Spark); write Parquet tables, an HTML report and print a summary.",
    )
    parser.add_argument("--version", action="version", version=f"{prog} {__version__}")
    _common(parser, "the data dir and out are")
    parser.add_argument("--out", required=True, help="directory for the tables (local path or cluster URI)")
    parser.add_argument("--since", type=_time, help="first instant included: ISO time, @EPOCH, or relative as --since=-6h")
    parser.add_argument("--until", type=_time, help="first instant excluded: ISO time, @EPOCH, or relative as --until=-1h")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"rows of the top-N tables [{DEFAULT_TOP}]")
    parser.add_argument("--html-dir", help="where report.html and summary.json go when --out is a cluster URI [.]")
    parser.add_argument("--no-compact", dest="compact", action="store_false",
                        help="do not compact closed hours first (e.g. a read-only data dir)")
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
    _common(parser, "the data dir is")
    parser.add_argument("--hours-per-job", type=int, default=24, help="hours converted and published together [24]")
    return parser


def missing_log(data_dir: str) -> str | None:
    """Why a local ``data_dir`` has nothing to report on (it does not exist, or holds no hour
    of event log, raw or compacted), or None.  Cluster storage is not looked at here."""
    local = local_path(data_dir)
    if local is None:
        return None
    root = Path(local)
    if not root.is_dir():
        return f"{data_dir}: no such data dir"
    if all(next((root / directory).glob("date=*/hour=*"), None) is None for directory in ("events", COMPACTED_DIR)):
        return f"{data_dir}: no event log in it (no events/date=*/hour=*/; is it the broker's --data-dir?)"
    return None


def _has(module: str, prog: str) -> bool:
    """Whether ``module`` (of the optional extra) imports; if not, says so in one line."""
    try:
        __import__(module)
    except ImportError:
        print(f"{prog}: {module} is not installed (pip install '.[pipeline]' in brokerd's checkout)", file=sys.stderr)
        return False
    return True


def _session(args: argparse.Namespace, **options: Any) -> Any:
    """The Spark session of both subcommands, from --master, --conf, --driver-memory, --quiet."""
    from brokerd.pipeline.session import build_session

    conf = dict(args.conf)
    if args.driver_memory:
        conf["spark.driver.memory"] = args.driver_memory
    return build_session(args.master, conf=conf, quiet=args.quiet, **options)


def _in_process(args: argparse.Namespace, prog: str, out: str) -> bool | None:
    """Whether the job runs in this process first; None after saying why ``--engine arrow``
    cannot.  Under ``auto`` local paths are enough, whatever the master: the driver does what
    it sees (pyarrow's parsing costs about a twentieth of Spark's, and a session's start-up
    alone is most of a second report), and Spark starts only for what pyarrow cannot parse or
    hold.  Under spark-submit without --master the job is left to spark-submit's Spark."""
    from brokerd.pipeline.localfs import usable
    from brokerd.pipeline.session import under_spark_submit

    if args.engine == "arrow":
        if not usable(args.master, args.data_dir, out):
            print(f"{prog}: --engine arrow needs a local master (local[*], local[N]) and local paths", file=sys.stderr)
            return None
        return True
    if args.engine == "spark" or (args.master is None and under_spark_submit()):
        return False
    arrow = local_path(args.data_dir) is not None and local_path(out) is not None
    if arrow and not args.quiet and not usable(args.master, args.data_dir, out):
        print(f"[brokerd-report] the log and the output are local: pyarrow in this process first, Spark on "
              f"{args.master} only for what it cannot parse or hold (--engine spark: all on Spark)", file=sys.stderr)
    return arrow


def _first_line(exc: BaseException) -> str:
    """An exception in one line (Spark's errors are long)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _timed(function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> tuple[_T, float]:
    started = time.monotonic()
    return function(*args, **kwargs), time.monotonic() - started


def run_compact(argv: list[str], prog: str = "brokerd-report compact") -> int:
    """Compact in this process with pyarrow where it may, Spark for the rest (cluster storage
    or master, ``--engine spark``, or the hours pyarrow cannot parse under ``auto``)."""
    args = compact_parser(prog).parse_args(argv)
    if args.hours_per_job <= 0:
        print(f"{prog}: --hours-per-job must be positive", file=sys.stderr)
        return 2
    problem = missing_log(args.data_dir)
    if problem is not None and problem.endswith("no such data dir"):
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    arrow = _in_process(args, prog, args.data_dir)
    if arrow is None or not _has("pyarrow", prog):
        return 2
    from brokerd.pipeline.compact import Compaction, compact
    from brokerd.pipeline.session import Progress

    options = {"delete_json": args.delete_json, "hours_per_job": args.hours_per_job}
    done, elapsed, spark = Compaction(), 0.0, None
    try:
        if arrow:
            with Progress(None, enabled=not args.quiet) as progress:
                done, elapsed = _timed(compact, None, args.data_dir, progress=progress, **options)
            if done.unconvertible and args.engine == "arrow":
                print(f"{prog}: pyarrow cannot parse {len(done.unconvertible)} hour(s) of the log; use --engine "
                      "spark or auto", file=sys.stderr)
                return 1
        if not arrow or done.unconvertible:
            if done.unconvertible and not args.quiet:
                print(f"[brokerd-report] pyarrow cannot parse {len(done.unconvertible)} hour(s): compacting "
                      "them on Spark", file=sys.stderr)
            if not _has("pyspark", prog):
                return 2
            spark = _session(args, app_name="brokerd-compact")
            with Progress(spark, enabled=not args.quiet) as progress:
                more, seconds = _timed(compact, spark, args.data_dir, progress=progress, **options)
            done = Compaction(done.compacted + more.compacted, [h for h in more.already if h not in done.compacted],
                              more.open, done.lines + more.lines, done.deleted_files + more.deleted_files)
            elapsed += seconds
    except Exception as exc:
        print(f"{prog}: the compaction failed: {_first_line(exc)}", file=sys.stderr)
        return 1
    finally:
        if spark is not None:
            spark.stop()
    counted = f" ({done.lines:,} lines) in {elapsed:.1f} s" if done.compacted else ""
    print(f"compacted {len(done.compacted)} hour(s){counted}; {len(done.already)} compacted before; "
          f"{len(done.open)} still open" + (f"; deleted {done.deleted_files} JSON file(s)" if args.delete_json else ""))
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
    arrow = _in_process(args, prog, args.out)
    if arrow is None or not _has("pyarrow", prog):
        return 2
    from brokerd.pipeline.arrowjson import NotConvertible
    from brokerd.pipeline.read import TooLarge

    if arrow:
        try:
            return _report(args, None)
        except (NotConvertible, TooLarge) as exc:
            reason = str(exc) if isinstance(exc, TooLarge) else f"pyarrow cannot read the log ({_first_line(exc)})"
            if args.engine == "arrow":
                advice = ", or raise --arrow-max-memory" if isinstance(exc, TooLarge) else ""
                print(f"{prog}: {reason}; use --engine spark or auto{advice}", file=sys.stderr)
                return 1
            if not args.quiet:
                print(f"[brokerd-report] {reason}: running on Spark", file=sys.stderr)
        except Exception as exc:
            print(f"{prog}: the report job failed: {_first_line(exc)}", file=sys.stderr)
            return 1
    if not _has("pyspark", prog):
        return 2
    spark = _session(args)
    try:  # after an in-process attempt (auto), what is left to compact is what pyarrow cannot parse
        return _report(args, spark)
    except Exception as exc:
        print(f"{prog}: the report job failed: {_first_line(exc)}", file=sys.stderr)
        return 1
    finally:
        spark.stop()


def _report(args: argparse.Namespace, spark: Any) -> int:
    """The report, in this process (``spark`` None) or on Spark; prints the summary."""
    from brokerd.pipeline.report import run_report, text_summary
    from brokerd.pipeline.session import Progress

    with Progress(spark, enabled=not args.quiet) as progress:
        summary, elapsed = _timed(
            run_report, spark, args.data_dir, args.out, since_us=args.since, until_us=args.until, top=args.top,
            html_dir=args.html_dir, progress=progress, compact=args.compact, delete_json=args.delete_json,
            max_memory=args.arrow_max_memory)
    print(text_summary(summary, elapsed))
    return 0


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())
