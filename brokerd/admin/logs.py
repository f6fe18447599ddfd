"""``--log-level`` and ``--log-format``: the observer twistd logs through.

twistd builds its log observer after the plugin's options are parsed, from its own
``--logger`` option (the dotted name of a factory).  When either option asks for something
other than twistd's default (info, text), the plugin's options name :func:`twistd_observer`
there and leave the choices in :data:`_CHOSEN`; the factory then honours twistd's
``--logfile`` and ``-n`` as twistd's own observer would.
"""
from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any

from twisted.logger import (
    FileLogObserver,
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    formatEvent,
    textFileLogObserver,
)
from twisted.python import logfile

from brokerd.config import Settings
from brokerd.errors import ConfigurationError

LEVELS = {"debug": LogLevel.debug, "info": LogLevel.info, "warn": LogLevel.warn,
          "error": LogLevel.error, "critical": LogLevel.critical}
FORMATS = ("text", "json")
OBSERVER = "brokerd.admin.logs.twistd_observer"
"""What twistd's ``--logger`` is set to (twistd takes a dotted name, not an object)."""

_CHOSEN: dict[str, Any] = {}


def check_log_settings(settings: Settings) -> None:
    if settings.log_level not in LEVELS:
        raise ConfigurationError(f"--log-level {settings.log_level}: expected one of {', '.join(LEVELS)}")
    if settings.log_format not in FORMATS:
        raise ConfigurationError(f"--log-format {settings.log_format}: expected text or json")


def wants_own_observer(settings: Settings) -> bool:
    return settings.log_level != "info" or settings.log_format != "text"


def choose(settings: Settings, twistd_options: Any) -> str:
    """Remember the choices for :func:`twistd_observer` and return its dotted name."""
    _CHOSEN.update(
        level=LEVELS[settings.log_level],
        format=settings.log_format,
        logfile=twistd_options.get("logfile"),
        nodaemon=bool(twistd_options.get("nodaemon")),
    )
    return OBSERVER


def make_observer(level: LogLevel, format: str, out: Any) -> ILogObserver:
    """An observer writing events at ``level`` or above to ``out`` as text or JSON lines."""
    base = FileLogObserver(out, json_line) if format == "json" else textFileLogObserver(out)
    return FilteringLogObserver(base, [LogLevelFilterPredicate(defaultLogLevel=level)])


def json_line(event: dict) -> str:
    """One log event as one line of JSON for log shippers: ``time`` (ISO 8601, UTC),
    ``level``, ``source`` (the logger's namespace), ``message`` (the formatted text), the
    event's own fields under ``fields``, and ``failure`` (the traceback) when it carries one.
    Values JSON cannot hold are written as their ``str``."""
    level = event.get("log_level")
    record: dict[str, Any] = {
        "time": datetime.fromtimestamp(event.get("log_time", 0), timezone.utc).isoformat(timespec="milliseconds"),
        "level": getattr(level, "name", "info"),
        "source": event.get("log_namespace") or event.get("log_system") or "-",
        "message": formatEvent(event).rstrip("\n"),
        "fields": {key: value for key, value in event.items() if not key.startswith("log_")},
    }
    failure = event.get("log_failure")
    if failure is not None:
        record["failure"] = failure.getTraceback()
    try:
        return json.dumps(record, default=str, ensure_ascii=False) + "\n"
    except (TypeError, ValueError):  # keys that are not strings, a value that contains itself
        record["fields"] = {str(key): str(value) for key, value in record["fields"].items()}
        return json.dumps(record, default=str, ensure_ascii=False) + "\n"


def twistd_observer() -> ILogObserver:
    """twistd's ``--logger`` factory: where twistd would log, in the chosen level and format."""
    name = _CHOSEN.get("logfile")
    if name == "-" or (not name and _CHOSEN.get("nodaemon", True)):
        out = sys.stdout
    else:
        out = logfile.LogFile.fromFullPath(name or "twistd.log")
    return make_observer(_CHOSEN.get("level", LogLevel.info), _CHOSEN.get("format", "text"), out)
