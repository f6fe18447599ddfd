"""``--since`` / ``--until`` values: points in time as microseconds since the epoch (UTC).

Accepted forms: an ISO 8601 date or date-time (``2024-05-01``, ``2024-05-01T12:30``,
``2024-05-01 12:30:15.5+02:00``; no offset means UTC), ``@<epoch seconds>``, or a time relative
to now: ``-90s``, ``-30m``, ``-6h``, ``-7d``.
"""
from __future__ import annotations

import re
import time
from datetime import datetime, timezone

_RELATIVE = re.compile(r"-(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(value: str, now_us: int | None = None) -> int:
    """Microseconds since the epoch for ``value``; ValueError with a readable message."""
    text = value.strip()
    if now_us is None:
        now_us = time.time_ns() // 1000
    relative = _RELATIVE.fullmatch(text)
    if relative:
        return now_us - int(float(relative.group(1)) * _UNITS[relative.group(2)] * 1_000_000)
    if text.startswith("@"):
        try:
            return int(float(text[1:]) * 1_000_000)
        except ValueError:
            raise ValueError(f"{value!r}: not a number of seconds after '@'") from None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{value!r}: use an ISO date/time (2024-05-01T12:00Z), @EPOCH or -30m/-6h/-7d"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    delta = moment - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def format_time(ts_us: int) -> str:
    """``2024-05-01T12:00:00.000000Z`` for a timestamp in µs."""
    seconds, micros = divmod(ts_us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"
