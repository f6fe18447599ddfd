"""How a front end finds the handler of a request: one style for every protocol.

A request's handler is the method ``do_<VERB>`` of the connection's class, the wire verb
verbatim (``do_SUBSCRIBE``, ``do_TLRQ``; an SMQP verb of several words joins them with ``_``:
``do_SET_LOGIN_PASSWORD``), as ``twisted.mail.smtp`` names them.  Unlike smtp, the method is
not looked up by name on every line: :func:`command_table` builds, once, when the module is
imported, a table from whatever the codec yields (a verb, an event class) to the unbound
method, and a read does one dict lookup per request.  A connection whose states allow
different verbs (before and after login) has one table per state; a key missing from the
table goes to the connection's fallback (the protocol's answer to an unknown or untimely
verb).  A misspelt handler name fails at import, not at the first request.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

PREFIX = "do_"


def handler_name(verb: str | bytes) -> str:
    """The method name for ``verb``: ``do_`` and the verb, spaces as ``_``."""
    text = verb.decode("ascii") if isinstance(verb, bytes) else verb
    return PREFIX + text.replace(" ", "_")


def command_table(cls: type, verbs: Iterable[str | bytes] | Mapping[Hashable, str]) -> dict[Any, Callable[..., Any]]:
    """``{key: cls.do_<VERB>}``: for a list of verbs, each verb is its own key (as the codec
    yields it, str or bytes); for a mapping, ``{key: verb}`` (an event class to its verb)."""
    pairs = verbs.items() if isinstance(verbs, Mapping) else ((verb, verb) for verb in verbs)
    return {key: getattr(cls, handler_name(verb)) for key, verb in pairs}


def verbs_of(cls: type) -> list[str]:
    """Every verb ``cls`` has a ``do_<VERB>`` for (``_`` read as a space)."""
    return [name[len(PREFIX):].replace("_", " ") for name in dir(cls)
            if name.startswith(PREFIX) and callable(getattr(cls, name))]
