"""brokerd's options as its command line (the rows of ``brokerd.tap.Options``) and as
docs/operations.md's option table, both made from the fields of
:class:`brokerd.config.Settings`, so that neither can drift from the code.

``python -m brokerd.optiontable`` prints the table; ``--write docs/operations.md`` puts it in
place of the one there (tests/test_settings_contract.py checks the committed one is current).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import Field
from pathlib import Path
from typing import Any

from brokerd.config import LISTENER_OPTIONS, PROTOCOLS, default_listener, setting_fields, settings_default
from brokerd.settingspec import (
    Option,
    command_line_name,
    command_option,
    kind,
    metavar,
    option_name,
    option_of,
    range_text,
)

COMMAND_OPTIONS = {
    "config": Option(
        metavar="FILE",
        help="Read settings from this TOML file (the command line wins).",
        meaning="TOML file with any of these settings"),
    "check-config": Option(
        help="Check --config and the options given without starting: exit 0, or 1 with one line per problem.",
        meaning="check `--config` and the options given, start nothing: `brokerd: configuration OK` and exit 0 "
                "(after the start-up warnings, `brokerd: warning: ...` on stderr, one per listener reachable "
                "without credentials), or one line per problem and exit 1"),
}
"""Options that act on the command line itself: they set nothing a broker runs with."""

HEADER = "| option | default | meaning |\n| --- | --- | --- |\n"


def help_line(text: str, default: str | None = None, values: str = "") -> str:
    """A --help line: the text, the range (``(1 to 1024)``) and the default (``[30]``); a
    text that ends with its own ``[...]`` (a default that depends on other settings) keeps it."""
    line = text.rstrip(".")
    own_default = line.endswith("]")
    if values:
        line = f"{line} ({values})"
    if default is not None and not own_default:
        line = f"{line} [{default}]"
    return f"{line}."


def setting_help(name: str, spec: Field) -> str:
    return help_line(option_of(spec).help, settings_default(name), range_text(spec))


def negative_flags() -> dict[str, str]:
    """Flags that turn off a setting that is on by default: ``no-NAME`` -> NAME (and
    ``no-FORMER`` -> FORMER for its former names, which brokerd.config takes as NAME)."""
    return {f"no-{key}": key for name, spec in setting_fields().items() if kind(spec) == "negative flag"
            for key in (name, *option_of(spec).former)}


def former_options() -> dict[str, str]:
    """The former names on the command line -> the option now (``no-FORMER`` -> ``no-NAME``
    for a setting on by default): taken, with a warning, but not listed by ``--help``."""
    return {command_option(former, spec): command_option(name, spec)
            for name, spec in setting_fields().items() for former in option_of(spec).former}


def parameters() -> list[list[Any]]:
    """``optParameters``: ``--config`` and every setting that takes one value, under its name
    and its former names."""
    rows: list[list[Any]] = [["config", None, None, COMMAND_OPTIONS["config"].help]]
    for name, spec in setting_fields().items():
        if kind(spec) not in ("flag", "negative flag", "repeatable"):
            rows.append([name, None, None, setting_help(name, spec)])
            rows += [[former, None, None, former_help(name)] for former in option_of(spec).former]
    return rows


def flags() -> list[list[Any]]:
    """``optFlags``: every boolean setting (``--no-NAME`` for one on by default), under its
    name and its former names, and ``--check-config``."""
    rows: list[list[Any]] = []
    for name, spec in setting_fields().items():
        if kind(spec) in ("flag", "negative flag"):
            option = command_option(name, spec)
            rows.append([option, None, setting_help(name, spec)])
            rows += [[command_option(former, spec), None, former_help(option)] for former in option_of(spec).former]
    rows.append(["check-config", None, COMMAND_OPTIONS["check-config"].help])
    return rows


def former_help(option: str) -> str:
    return f"Former name of --{option}, going away."


def repeatable_help(name: str) -> str:
    """The help of a listener option or another repeatable setting (an ``opt_`` method)."""
    if name in LISTENER_OPTIONS:
        return help_line(LISTENER_OPTIONS[name].help, default_listener(name))
    return setting_help(name, setting_fields()[name])


def default_cell(spec: Field) -> str:
    """The docs' default column: the field's own text, else ``off``, ``—`` or the value."""
    option = option_of(spec)
    if option.shown is not None:
        return option.shown
    if kind(spec) == "flag":
        return "off"
    value = settings_default(option_name(spec))
    if value is None:
        return "—"
    return value if kind(spec) == "number" else f"`{value}`"


def option_cell(name: str, spec: Field) -> str:
    if kind(spec) == "negative flag":
        return f"`--no-{name}`"
    if kind(spec) == "flag":
        return f"`--{name}`"
    return f"`--{name} {metavar(spec)}`"


def former_text(name: str, spec: Field) -> str:
    """The end of an option's meaning naming its former names: ``; formerly `--smqp-max-attempts```."""
    formers = option_of(spec).former
    if not formers:
        return ""
    return "; formerly " + ", ".join(f"`{command_line_name(former, spec)}`" for former in formers)


def rows() -> list[tuple[str, str, str]]:
    """docs/operations.md's option rows: the listeners, ``--config``, ``--check-config``,
    then every setting in the order of Settings."""
    table = [(f"`--{protocol} ENDPOINT`", f"`{default_listener(protocol)}`", LISTENER_OPTIONS[protocol].meaning)
             for protocol in PROTOCOLS]
    table.append(("`--config FILE`", "—", COMMAND_OPTIONS["config"].meaning))
    table.append(("`--check-config`", "off", COMMAND_OPTIONS["check-config"].meaning))
    for name, spec in setting_fields().items():
        values = range_text(spec)
        meaning = option_of(spec).meaning + (f"; {values}" if values else "") + former_text(name, spec)
        table.append((option_cell(name, spec), default_cell(spec), meaning))
    return table


def markdown() -> str:
    """The option table of docs/operations.md, header included."""
    return HEADER + "".join(f"| {option} | {default} | {meaning} |\n" for option, default, meaning in rows())


def table_in(text: str) -> tuple[int, int]:
    """Where the option table (header to its last row) is in docs/operations.md's ``text``."""
    start = text.index(HEADER)
    end = start + len(HEADER)
    while text.startswith("|", end):
        end = text.index("\n", end) + 1
    return start, end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brokerd.optiontable", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", metavar="FILE", type=Path,
                        help="replace the option table of FILE (docs/operations.md) instead of printing it")
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write(markdown())
        return 0
    text = args.write.read_text()
    start, end = table_in(text)
    args.write.write_text(text[:start] + markdown() + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
