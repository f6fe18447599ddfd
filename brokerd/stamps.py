"""Time stamps as brokerd writes them into message ids and SMQP's date attributes.

One format, ``DYYYYMMDDTHHMMSSccZ`` (GMT, hundredths of a second: the SMQP draft's
datetime), used by the core when it numbers a stored message (its Smuid, whatever protocol
published it) and by the SMQP codec on the wire.  It lives below both so that neither
copies it: the core may not import a codec, and a codec imports nothing of the broker.
"""
from __future__ import annotations

import time


_last_second: tuple[int, str] = (-1, "")
"""The whole second formatted last and its text: every stored message is stamped (twice
for an SMQP publish), and under load many share a second, which strftime need not format
again."""


def format_datetime(seconds: float) -> str:
    """POSIX seconds as ``DYYYYMMDDTHHMMSSccZ`` (GMT, hundredths of a second)."""
    global _last_second
    whole = int(seconds // 1)
    hundredths = min(99, int(round((seconds - whole) * 100)))
    last, text = _last_second
    if last != whole:
        text = time.strftime("D%Y%m%dT%H%M%S", time.gmtime(whole))
        _last_second = (whole, text)
    return f"{text}{hundredths:02d}Z"
