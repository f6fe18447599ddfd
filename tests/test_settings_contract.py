"""One source of settings: every field of brokerd.config.Settings is an option of `brokerd`
(and a TOML key), has its line in docs/operations.md with the default Settings holds, and
no option exists without its field; no module reads a setting with a fallback of its own."""
from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from brokerd.config import PROTOCOLS, Settings, setting_fields, settings_default, settings_from
from brokerd.tap import NEGATIVE_FLAGS, Options

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = ROOT / "docs" / "operations.md"
NOT_SETTINGS = {"config", "check-config"}
"""Options that act on the command line itself: they set nothing a broker runs with."""
METHOD_OPTIONS = {"smqp-link": "opt_smqp_link", "mqtt-bridge": "opt_mqtt_bridge"}
"""Settings given by a repeatable option (an ``opt_`` method of Options)."""


def option_table() -> dict[str, str]:
    """Option name -> the kind of option: ``parameter``, ``flag``, ``negative flag``, ``method``."""
    table = {key: "parameter" for key, *_ in Options.optParameters}
    table.update({key: "flag" for key, *_ in Options.optFlags if key not in NEGATIVE_FLAGS})
    table.update({setting: "negative flag" for setting in NEGATIVE_FLAGS.values()})
    table.update({name: "method" for name, method in METHOD_OPTIONS.items() if hasattr(Options, method)})
    return {name: kind for name, kind in table.items() if name not in NOT_SETTINGS}


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
    for name, text in helps.items():
        default = settings_default(name)
        if default is not None and name != "data-dir":
            assert text.endswith(f"[{default}]."), name


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
    for path in sorted((ROOT / "brokerd").rglob("*.py")):
        lines = settings_reads_with_a_fallback(ast.parse(path.read_text(), str(path)))
        if lines:
            offenders[str(path.relative_to(ROOT))] = lines
    assert offenders == {}


def test_the_guard_finds_a_fallback_read() -> None:
    """The check above can fail: it finds the pattern it forbids."""
    assert settings_reads_with_a_fallback(ast.parse('x = getattr(self.settings, "a", 1)\ny = settings.a')) == [1]


def test_every_field_has_a_docstring_in_settings() -> None:
    source = (ROOT / "brokerd" / "config.py").read_text()
    body = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "Settings").body
    documented = set()
    for statement, following in zip(body, body[1:]):
        if isinstance(statement, ast.AnnAssign) and isinstance(following, ast.Expr) \
                and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str):
            documented.add(statement.target.id)  # type: ignore[attr-defined]
    assert [f.name for f in fields(Settings) if f.name not in documented] == []
