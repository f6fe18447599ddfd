"""``--log-level`` and ``--log-format``: the observer twistd logs through.

twistd builds its log observer after the plugin's options are parsed, from its own
``--logger`` option (the dotted name of a factory).  Unless twistd is told to use another
logger (``--logger``, ``--syslog``), the plugin's options name :func:`twistd_observer` there
and leave the choices in :data:`_CHOSEN`; the factory then honours twistd's ``--logfile``,
``-n`` and SIGUSR1 (reopen the log) as twistd's own observer would.

Log lines carry what clients sent (MQTT client identifiers, user names, SSMP identifiers):
a control character in one could forge a line or drive the operator's terminal.  Both
formats escape them where the line is formatted (:func:`escape_controls`), so no log call
has to remember to.
"""
from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from types import FrameType
from typing import IO, Any

from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import (
    FileLogObserver,
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    formatEvent,
    formatEventAsClassicLogText,
)
from twisted.python import logfile
from twisted.python.failure import Failure

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
    """Do the settings ask for more than twistd's default (info, text)?"""
    return settings.log_level != "info" or settings.log_format != "text"


_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""C0 controls (line feed and carriage return among them), DEL, C1 controls (NEL, U+0085,
among them) and the Unicode line and paragraph separators: what ends a line for some
reader, or moves a terminal's cursor."""
_CONTROLS_BUT_LF = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape_controls(text: str) -> str:
    """``text`` with every control character written as a backslash escape (``\\x1b``,
    ``\\r``, ``\\n``, ``\\u2028``): one log event stays one line whatever a client put in
    a name, and shows the terminal no escape sequence."""
    return _CONTROLS.sub(_escaped, text)


def _escape_traceback(text: str) -> str:
    """A traceback keeps its line feeds (the text format indents the lines after the first,
    so none can pass for an event); every other control character is escaped."""
    return _CONTROLS_BUT_LF.sub(_escaped, text)


class _EscapedFailure:
    """Stands for an event's failure where the text format asks it for its traceback."""

    def __init__(self, failure: Failure) -> None:
        self._failure = failure

    def getTraceback(self) -> str:  # noqa: N802 (twisted's name)
        return _escape_traceback(self._failure.getTraceback())


def escaped_event(event: dict) -> dict:
    """A copy of ``event`` whose message is its formatted text with control characters
    escaped (whatever field, or object formatted into it, they came from)."""
    safe = {key: value for key, value in event.items() if key != "log_flattened"}
    safe["log_format"] = "{log_escaped_text}"
    safe["log_escaped_text"] = escape_controls(formatEvent(event))
    if event.get("log_failure") is not None:
        safe["log_failure"] = _EscapedFailure(event["log_failure"])
    return safe


def text_line(event: dict) -> str | None:
    """One log event as twistd's text format writes it, control characters escaped."""
    return formatEventAsClassicLogText(escaped_event(event))


def choose(settings: Settings, twistd_options: Mapping[str, object]) -> str:
    """Remember the choices for :func:`twistd_observer` and return its dotted name."""
    _CHOSEN.update(
        level=LEVELS[settings.log_level],
        format=settings.log_format,
        logfile=twistd_options.get("logfile"),
        nodaemon=bool(twistd_options.get("nodaemon")),
    )
    return OBSERVER


def make_observer(level: LogLevel, format: str, out: IO[str]) -> ILogObserver:
    """An observer writing events at ``level`` or above to ``out`` as text or JSON lines."""
    base = FileLogObserver(out, json_line if format == "json" else text_line)
    return FilteringLogObserver(base, [LogLevelFilterPredicate(defaultLogLevel=level)])


def json_line(event: dict) -> str:
    """One log event as one line of JSON for log shippers: ``time`` (ISO 8601, UTC),
    ``level``, ``source`` (the logger's namespace), ``message`` (the formatted text, control
    characters escaped as in the text format), the event's own fields under ``fields``, and
    ``failure`` (the traceback) when it carries one.  Values JSON cannot hold are written as
    their ``str``.  JSON escapes C0 controls itself; DEL, C1 controls and U+2028/U+2029 are
    written as ``\\uXXXX`` too (the same string to a JSON reader), so that no reader that
    splits lines on them (Python's ``splitlines``, JavaScript) sees two."""
    level = event.get("log_level")
    record: dict[str, Any] = {
        "time": datetime.fromtimestamp(event.get("log_time", 0), timezone.utc).isoformat(timespec="milliseconds"),
        "level": getattr(level, "name", "info"),
        "source": event.get("log_namespace") or event.get("log_system") or "-",
        "message": escape_controls(formatEvent(event).rstrip("\n")),
        "fields": {key: value for key, value in event.items() if not key.startswith("log_")},
    }
    failure = event.get("log_failure")
    if failure is not None:
        record["failure"] = failure.getTraceback()
    try:
        line = json.dumps(record, default=str, ensure_ascii=False)
    except (TypeError, ValueError):  # keys that are not strings, a value that contains itself
        record["fields"] = {str(key): str(value) for key, value in record["fields"].items()}
        line = json.dumps(record, default=str, ensure_ascii=False)
    return _CONTROLS.sub(_json_escaped, line) + "\n"


def _json_escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def twistd_observer() -> ILogObserver:
    """twistd's ``--logger`` factory: where twistd would log, in the chosen level and format."""
    name = _CHOSEN.get("logfile")
    if name == "-" or (not name and _CHOSEN.get("nodaemon", True)):
        out = sys.stdout
    else:
        out = logfile.LogFile.fromFullPath(name or "twistd.log")
        _reopen_on_sigusr1(out)
    return make_observer(_CHOSEN.get("level", LogLevel.info), _CHOSEN.get("format", "text"), out)


def _reopen_on_sigusr1(out: logfile.LogFile) -> None:
    """SIGUSR1 rotates the log file, as with twistd's own observer (logrotate's postrotate),
    unless something else already handles the signal."""
    if signal.getsignal(signal.SIGUSR1) in (None, signal.SIG_DFL):

        def rotate(signum: int, frame: FrameType | None) -> None:
            from twisted.internet import reactor

            IReactorFromThreads(reactor).callFromThread(out.rotate)

        signal.signal(signal.SIGUSR1, rotate)
