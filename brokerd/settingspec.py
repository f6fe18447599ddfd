"""How one field of :class:`brokerd.config.Settings` meets an operator: its ``--help`` line,
its row in docs/operations.md, its range, and how a value from the command line or the TOML
file becomes the field's value, or one error line naming the option.

Each field carries an :class:`Option` (``setting(default, help=..., meaning=...)``), so that a
setting is added in one place and the option, the config key, the help and the docs follow.
"""
from __future__ import annotations

import math
from dataclasses import Field, dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable, TypeVar

from brokerd.errors import ConfigurationError

_T = TypeVar("_T")

OPTION = "option"
"""The key of a Settings field's metadata that holds its :class:`Option`."""


@dataclass(frozen=True)
class Option:
    """What the operator sees of one setting.  A boolean that is on by default is the flag
    ``--no-NAME``: its ``help`` and ``meaning`` say what that flag does."""

    help: str
    """One line of ``brokerd --help``; the default (``[30]``) and the range are appended."""
    meaning: str
    """The meaning column of docs/operations.md's option table (Markdown)."""
    metavar: str | None = None
    """What the value is called in the docs (``S``, ``BYTES``); None: from the field's type."""
    shown: str | None = None
    """The docs' default column when the default is no plain value (``host name``, ``guest on``)."""
    zero: str | None = None
    """What 0 means (``none``, ``any``) where 0 is a documented value; else numbers are positive."""
    maximum: int | None = None
    """The largest value of a number, where there is one."""
    repeatable: bool = False
    """Given by repeating the option (an ``opt_`` method of brokerd.tap.Options) or a TOML list."""
    name: str | None = None
    """The option's name when it is not the field's (DESIGN.md names ``--accounts``, ``--ual``)."""
    former: tuple[str, ...] = ()
    """The option's former names (without ``--``): still taken, on the command line and as TOML
    keys, each with a warning line at start, so that an upgrade does not stop a broker whose
    unit file or config file still says them; not in ``--help``, named in the docs' row."""


def setting(default: _T, metavar: str | None = None, **option: Any) -> _T:
    """A Settings field: its default (still ``Settings.name``) and its :class:`Option` (the
    keywords are Option's fields).  Typed as its default, as :func:`dataclasses.field` is."""
    return field(default=default, metadata={OPTION: Option(metavar=metavar, **option)})


def option_of(spec: Field) -> Option:
    return spec.metadata[OPTION]


def option_name(spec: Field) -> str:
    """The option (and TOML key) that sets the field: its name with dashes, or its own."""
    return option_of(spec).name or spec.name.replace("_", "-")


NUMBERS = ("int", "float", "float | None")
"""Field types read as numbers: whole ones, and seconds (a float that may be None is off
until given)."""
PATHS = ("Path", "Path | None")
LISTS = ("str | list[str]", "str | list[Any]")
"""Fields that take several values: a string of them (commas or blanks) or a TOML list."""


def kind(spec: Field) -> str:
    """``flag``, ``negative flag``, ``path``, ``number``, ``list``, ``repeatable`` or ``text``."""
    if spec.type == "bool":
        return "negative flag" if spec.default else "flag"
    if option_of(spec).repeatable:
        return "repeatable"
    if spec.type in PATHS:
        return "path"
    if spec.type in NUMBERS:
        return "number"
    if spec.type in LISTS:
        return "list"
    return "text"


def metavar(spec: Field) -> str:
    """What the docs call the option's value: its own, else S (seconds), N, FILE or LIST."""
    own = option_of(spec).metavar
    if own is not None:
        return own
    return {"float": "S", "float | None": "S", "int": "N", "list": "LIST", "path": "FILE"}.get(
        spec.type if spec.type in NUMBERS else kind(spec), "VALUE")


def range_text(spec: Field) -> str:
    """The range of a number where it is not just "positive": ``1 to 1024``, ``0: none``."""
    option = option_of(spec)
    parts = []
    if option.maximum is not None:
        parts.append(f"{0 if option.zero else 1} to {option.maximum}")
    if option.zero:
        parts.append(f"0: {option.zero}")
    return ", ".join(parts)


def command_option(key: str, spec: Field) -> str:
    """The command line's option for ``key`` of ``spec`` (its name, or a former one), without
    the dashes: ``no-KEY`` for a setting on by default, else ``KEY``."""
    return f"no-{key}" if kind(spec) == "negative flag" else key


def command_line_name(key: str, spec: Field) -> str:
    """How the command line spells ``key`` of ``spec``: ``--no-KEY`` or ``--KEY``."""
    return f"--{command_option(key, spec)}"


def former_name_use(given: Mapping[str, object], formers: dict[str, str], written: Callable[[str], str],
                    where: str = "") -> tuple[list[str], list[str]]:
    """The problems and the warnings of the former names among the keys of ``given`` (one
    source: the command line, or the TOML file).  ``formers`` maps a former name to the
    option's name now; ``written`` spells a name as that source does (``--NAME``, ``NAME``),
    ``where`` begins each line (``--config FILE: ``).  A former name is a warning line naming
    both; given with the name now, an error naming both (which should win is the operator's
    to say, not the order of the lines)."""
    problems: list[str] = []
    warnings: list[str] = []
    for key in given:
        current = formers.get(key)
        if current is None:
            continue
        former, now = written(key), written(current)
        if current in given:
            problems.append(f"{where}{former} and {now} are the same setting ({former} is its former name): "
                            f"give {now} only")
        else:
            warnings.append(f"{where}{former} is now {now}: the former name still works but is going away")
    return problems, warnings


def convert(key: str, spec: Field, value: object) -> object:
    """The field's value from a command-line string or a TOML value; ConfigurationError
    (one line naming ``key``) for anything the setting does not take."""
    found = kind(spec)
    if found in ("flag", "negative flag"):
        return boolean(key, value)
    if found == "number":
        return number(key, spec, value)
    if found == "path":
        if isinstance(value, (str, Path)) and str(value):
            return Path(value)
        raise ConfigurationError(f"{key}: {value!r} is not a file name")
    if found == "list":
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return value
        raise ConfigurationError(f"{key}: {value!r} is not a string or a list of strings")
    if found == "text" and not isinstance(value, str):
        raise ConfigurationError(f"{key}: {value!r} is not a string")
    return value  # a repeatable setting's own module checks its values (MQTT bridges' tables)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def boolean(key: str, value: object) -> bool:
    """A flag's value, strictly: a TOML boolean, or one of the words both ways; anything else
    is a mistake named as such (``mqtt-anonymous = "flase"`` must not quietly mean false)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(f"{key}: {value!r} is not a boolean (true or false)")


def number(key: str, spec: Field, value: object) -> int | float:
    """A number within the setting's range.  A whole-number setting takes no fraction (2.5
    connections would quietly be 2), no setting takes a boolean, NaN or infinity."""
    found = _parse_number(value)
    if found is None:
        raise ConfigurationError(f"{key}: {value!r} is not a number")
    if spec.type == "int":
        if found != int(found):
            raise ConfigurationError(f"{key}: {value!r} is not a whole number")
        found = int(found)
    else:
        found = float(found)
    option = option_of(spec)
    if found < 0 or (found == 0 and not option.zero):
        least = "must be 0 or more" if option.zero else "must be positive"
        raise ConfigurationError(f"{key}: {least}, not {value!r}")
    if option.maximum is not None and found > option.maximum:
        raise ConfigurationError(f"{key}: at most {option.maximum}, not {value!r}")
    return found


def _parse_number(value: object) -> int | float | None:
    """A finite number from a TOML number or a command-line string (a whole one kept exact),
    else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
        try:
            value = float(value)
        except ValueError:
            return None
    return value if math.isfinite(value) else None
