"""One source of settings: every field of brokerd.config.Settings is an option of `brokerd`
(and a TOML key), has its line in docs/operations.md with the default Settings holds, and
no option exists without its field; the option table of docs/operations.md is the one
brokerd.optiontable makes from Settings; no module reads a setting with a fallback of its own."""
from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from brokerd.config import PROTOCOLS, Settings, former_names, setting_fields, settings_default, settings_from
from brokerd.optiontable import COMMAND_OPTIONS, markdown, table_in
from brokerd.settingspec import command_line_name, kind, option_of
from brokerd.tap import FORMER_OPTIONS, NEGATIVE_FLAGS, Options
from tests.support.sources import brokerd_modules

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = ROOT / "docs" / "operations.md"
NOT_SETTINGS = set(COMMAND_OPTIONS)
"""Options that act on the command line itself: they set nothing a broker runs with."""
METHOD_OPTIONS = {"smqp-link": "opt_smqp_link", "mqtt-bridge": "opt_mqtt_bridge"}
"""Settings given by a repeatable option (an ``opt_`` method of Options)."""


def option_table() -> dict[str, str]:
    """Option name -> the kind of option: ``parameter``, ``flag``, ``negative flag``, ``method``
    (the former names of options are left out: they are checked below)."""
    table = {key: "parameter" for key, *_ in Options.optParameters}
    table.update({key: "flag" for key, *_ in Options.optFlags if key not in NEGATIVE_FLAGS})
    table.update({setting: "negative flag" for setting in NEGATIVE_FLAGS.values()})
    table.update({name: "method" for name, method in METHOD_OPTIONS.items() if hasattr(Options, method)})
    return {name: kind for name, kind in table.items() if name not in NOT_SETTINGS and name not in former_names()}


def documented_defaults() -> dict[str, str]:
    """Option name -> the default column of its row in docs/operations.md's option table
    (a row may name several options, as ``--tls-cert FILE``, ``--tls-key FILE`` do)."""
    rows: dict[str, str] = {}
    for line in OPERATIONS.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`--"):
            continue
        for name in re.findall(r"`--([a-z0-9-]+)", cells[0]):
            rows[name] = cells[1]
    return rows


def test_every_setting_has_an_option_and_every_option_a_setting() -> None:
    settings = setting_fields()
    options = option_table()
    assert sorted(set(settings) - set(options)) == [], "settings no option sets"
    assert sorted(set(options) - set(settings)) == [], "options that set no setting"


def test_every_former_name_is_taken_by_the_command_line_hidden_by_help_and_named_by_its_row() -> None:
    """A former name (Option.former) is an option of the command line and a key of the file
    (both go through settings_from), is no name of another setting, is not listed by --help,
    and docs/operations.md's row of the option now names it."""
    formers = former_names()
    assert formers["smqp-retry-timeout"] == "durable-retry-timeout"
    assert len(formers) == sum(len(option_of(spec).former) for spec in setting_fields().values()), \
        "a former name given to two settings"
    command_line = {key for key, *_ in (*Options.optParameters, *Options.optFlags)}
    usage = str(Options())
    rows = {row.split(" | ")[0]: row for row in markdown().splitlines()}
    for former, current in formers.items():
        spec = setting_fields()[current]
        assert former not in setting_fields() and former not in PROTOCOLS and former not in NOT_SETTINGS, former
        option, now = command_line_name(former, spec), command_line_name(current, spec)
        assert FORMER_OPTIONS[option[2:]] == now[2:]
        assert option[2:] in command_line, f"{option} is not an option of the command line"
        assert f"{now}=" in usage or f"{now} " in usage, now
        assert f"{option} " not in usage and f"{option}=" not in usage, f"--help lists {option}"
        row = next(text for cell, text in rows.items() if cell.startswith(f"| `{now}"))
        assert f"formerly `{option}`" in row, row


def test_flags_match_the_defaults_they_turn_around() -> None:
    for name, spec in setting_fields().items():
        if isinstance(spec.default, bool):
            expected = "negative flag" if spec.default else "flag"
            assert option_table()[name] == expected, name
        else:
            assert option_table()[name] in ("parameter", "method"), name


def test_every_option_has_its_line_in_operations_md_with_the_settings_default() -> None:
    documented = documented_defaults()
    flags = {key for key, *_ in Options.optFlags}
    for name in setting_fields():
        option = next((flag for flag, setting in NEGATIVE_FLAGS.items() if setting == name), name)
        assert option in documented, f"--{option} has no line in docs/operations.md"
        default = settings_default(name)
        if default is not None and option not in flags:
            shown = documented[option].strip("`").removeprefix("./")
            assert shown == default, f"--{option}: docs/operations.md says {documented[option]!r}, Settings {default!r}"
    for name in documented:
        assert name in setting_fields() or name in flags or name in NOT_SETTINGS or name in PROTOCOLS, \
            f"docs/operations.md documents --{name}, which brokerd does not have"


def test_help_shows_the_settings_default() -> None:
    helps = {key: text for key, _, _, text in Options.optParameters}
    assert helps["login-timeout"].endswith("[5].")
    assert helps["event-log-sample"].endswith("[0.1].")
    assert helps["socketmq-origins"].endswith("[self].")
    assert helps["smqp-max-notify-window"] == "SMQP: largest SET NOTIFY WINDOW a session may ask for (1 to 1024) [64]."
    for name, text in helps.items():
        default = settings_default(name)
        if default is not None:
            assert text.endswith(f"[{default}]."), name
    assert Options.opt_smqp.__doc__ == "Listen for SMQP on ENDPOINT (repeatable) [tcp:7720:interface=127.0.0.1]."
    assert Options.opt_mqtt_bridge.__doc__.startswith("MQTT bridge to another broker")


def test_the_option_table_of_operations_md_is_made_from_settings() -> None:
    """docs/operations.md's table is what ``python -m brokerd.optiontable`` makes: an option
    added, renamed or given another default in Settings without the docs regenerated fails."""
    text = OPERATIONS.read_text()
    start, end = table_in(text)
    assert text[start:end] == markdown(), \
        "docs/operations.md's option table is stale: python -m brokerd.optiontable --write docs/operations.md"


def test_the_table_check_sees_a_drift() -> None:
    """The check above can fail: a table whose default differs from Settings' is not the made one."""
    text = OPERATIONS.read_text()
    start, end = table_in(text)
    drifted = text[start:end].replace("| `--login-timeout S` | 5 |", "| `--login-timeout S` | 6 |")
    assert drifted != text[start:end]
    assert drifted != markdown()


def test_every_setting_is_defined_with_its_help_and_meaning() -> None:
    for spec in fields(Settings):
        if spec.name == "listeners":
            continue
        option = option_of(spec)
        assert option.help and option.meaning, spec.name
        if kind(spec) == "negative flag":
            assert option.shown, f"{spec.name}: a setting on by default says how the docs show it"


@pytest.mark.parametrize("option, value, attribute, expected", [
    ("--socketmq-request-timeout", "0.5", "socketmq_request_timeout", 0.5),
    ("--no-smqp-guest", None, "smqp_guest", False),
    ("--no-event-log", None, "event_log", False),
    ("--smqp-max-one-held", "3", "smqp_max_one_held", 3),
])
def test_the_command_line_sets_the_field(tmp_path: Path, option: str, value: str | None, attribute: str,
                                         expected: object) -> None:
    options = Options()
    options.parseOptions(["--data-dir", str(tmp_path), option, *([value] if value is not None else [])])
    assert getattr(options.settings, attribute) == expected
    assert getattr(Settings(), attribute) != expected  # the default differs


def test_the_toml_file_sets_a_default_on_setting_off(tmp_path: Path) -> None:
    config = tmp_path / "brokerd.toml"
    config.write_text("smqp-guest = false\nsocketmq-request-timeout = 2.5\n")
    settings = settings_from({}, str(config))
    assert (settings.smqp_guest, settings.socketmq_request_timeout) == (False, 2.5)


def settings_reads_with_a_fallback(tree: ast.AST) -> list[int]:
    """Lines of ``getattr(<...settings>, "name", default)``: a second copy of a default."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            target = ast.unparse(node.args[0]) if node.args else ""
            if target.endswith("settings"):
                found.append(node.lineno)
    return found


def test_no_module_reads_a_setting_with_its_own_default() -> None:
    offenders = {}
    for path, tree in brokerd_modules():
        lines = settings_reads_with_a_fallback(tree)
        if lines:
            offenders[path] = lines
    assert offenders == {}


def test_the_guard_finds_a_fallback_read() -> None:
    """The check above can fail: it finds the pattern it forbids."""
    assert settings_reads_with_a_fallback(ast.parse('x = getattr(self.settings, "a", 1)\ny = settings.a')) == [1]
