"""The SparkSession the pipeline runs on, and progress lines while Spark works.

``local[*]`` unless ``--master`` says otherwise; under ``spark-submit`` the master and every
setting come from spark-submit and are left alone.  Timestamps are handled in UTC whatever
the machine's zone (the event log is UTC).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

DEFAULT_MASTER = "local[*]"
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": str(max(4, 2 * (os.cpu_count() or 1))),
    "spark.driver.memory": "4g",
}
"""Settings for an embedded local run (a cluster has its own); --conf overrides them.
Progress is printed by :class:`Progress`, so Spark's own console bar is off."""
ALWAYS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
}
"""Settings the jobs depend on: UTC minutes, and date=/hour= partition values as strings."""


def under_spark_submit() -> bool:
    """True when spark-submit launched this Python driver (it then owns master and conf)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(
    master: str | None = None,
    app_name: str = "brokerd-report",
    conf: dict[str, str] | None = None,
    log_level: str = "ERROR",
    quiet: bool = False,
) -> Any:
    """Create (or join) the SparkSession.  ``quiet``: the driver JVM logs errors only from
    its start (Spark's default profile prints warnings before ``setLogLevel`` can act)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    settings: dict[str, str] = {}
    if not under_spark_submit():
        # Python workers must be this interpreter (it has brokerd and pyarrow installed)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.master(master or DEFAULT_MASTER)
        settings["spark.ui.showConsoleProgress"] = "false"  # Progress prints its own lines
        if (master or DEFAULT_MASTER).startswith("local"):
            settings.update(LOCAL_DEFAULTS)
    elif master:
        builder = builder.master(master)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = _quietly(builder) if quiet and not under_spark_submit() else builder.getOrCreate()
    for key, value in ALWAYS.items():
        spark.conf.set(key, value)
    spark.sparkContext.setLogLevel(log_level)
    return spark


QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


JVM_NOISE = ("WARNING: Using incubator modules", "Setting default log level", "To adjust logging level use")
"""Lines the driver JVM prints on start whatever its log configuration says."""


def _quietly(builder: Any) -> Any:
    """Start the driver JVM logging errors only, and with its stderr passed through a filter
    that drops :data:`JVM_NOISE` (the JVM inherits the stderr it has at start)."""
    from pyspark import SparkContext

    if SparkContext._gateway is not None:  # the JVM runs already
        return builder.getOrCreate()
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--driver-java-options -Dlog4j2.configurationFile=file:{_quiet_log_config()} pyspark-shell"
    )
    read_end, write_end = os.pipe()
    saved = os.dup(2)
    sys.stderr.flush()
    os.dup2(write_end, 2)
    try:
        return builder.getOrCreate()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write_end)  # the JVM holds the only write end now
        threading.Thread(target=_filter_lines, args=(read_end,), name="brokerd-jvm-stderr", daemon=True).start()


def _filter_lines(read_end: int) -> None:
    with os.fdopen(read_end, "r", errors="replace") as lines:
        for line in lines:
            if not line.startswith(JVM_NOISE):
                sys.stderr.write(line)
                sys.stderr.flush()


def _quiet_log_config() -> str:
    """A log4j2 configuration that lets only errors through, in the temp dir (one per user)."""
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"brokerd-log4j2-quiet-{os.getuid()}.properties")
    if not os.path.exists(path):
        with open(path + ".tmp", "w", encoding="ascii") as handle:
            handle.write(QUIET_LOG4J2)
        os.replace(path + ".tmp", path)
    return path


class Progress:
    """Prints what the pipeline is doing and how far Spark's active stages are, on ``out``
    (stderr): a line per step and, while a step runs, a line per change at most every
    ``interval`` seconds (rewritten in place on a terminal).  ``spark`` None (the Arrow
    engine, no JVM): the step lines only."""

    def __init__(self, spark: Any, out: TextIO | None = None, interval: float = 1.0, enabled: bool = True) -> None:
        self.spark = spark
        self.out = out or sys.stderr
        self.interval = interval
        self.enabled = enabled
        self._step = ""
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tty = hasattr(self.out, "isatty") and self.out.isatty()
        self._last = ""

    def __enter__(self) -> Progress:
        if self.enabled and self.spark is not None:
            self._thread = threading.Thread(target=self._watch, name="brokerd-report-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._end_line()

    def step(self, name: str) -> None:
        """A new phase: name Spark's jobs after it and print it."""
        self._step = name
        if self.spark is not None:
            self.spark.sparkContext.setJobDescription(name)
        if self.enabled:
            self._end_line()
            self.out.write(f"[brokerd-report {time.monotonic() - self._started:6.1f}s] {name}\n")
            self.out.flush()

    def _end_line(self) -> None:
        if self._tty and self._last:
            self.out.write("\n")
            self.out.flush()
        self._last = ""

    def _watch(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self._stop.wait(self.interval):
            try:
                stages = [tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds()]
            except Exception:  # the context is stopping
                return
            parts = [f"stage {info.stageId}: {info.numCompletedTasks}/{info.numTasks} tasks"
                     for info in stages if info is not None]
            line = f"    {self._step}: " + ", ".join(parts)
            if not parts or line == self._last:
                continue
            self._last = line
            self.out.write("\r" + line[:150].ljust(150) if self._tty else line + "\n")
            self.out.flush()
