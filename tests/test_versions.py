"""Every command says which brokerd it is: ``brokerd --version`` and each ``brokerd-*``
console script's print ``NAME VERSION`` (brokerd.__version__, the package's version) and exit
0, and CHANGELOG.md has a section for that version."""
from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys

import pytest

from brokerd import __version__
from tests.support.broker import REPO
from tests.support.processes import repo_env


def console_scripts() -> dict[str, str]:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    lines = parser["options.entry_points"]["console_scripts"].strip().splitlines()
    return {name.strip(): target.strip() for name, target in (line.split("=") for line in lines)}


VERSIONS = """\
import contextlib, io, json, sys

answers = {}
for name, target in json.loads(sys.argv[1]).items():
    module, function = target.split(":")
    sys.argv = [name, "--version"]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            getattr(__import__(module, fromlist=[function]), function)()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
    answers[name] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(answers))
"""
"""Asks each command for its version, as its console script calls it, in one interpreter: a
Python process per command spent seconds importing Twisted and brokerd over again."""


@pytest.fixture(scope="module")
def versions() -> dict[str, list[object]]:
    """Each console script's (exit status, stdout, stderr) for ``--version``, by name."""
    done = subprocess.run([sys.executable, "-c", VERSIONS, json.dumps(console_scripts())], capture_output=True,
                          text=True, timeout=120, env=repo_env(), cwd=REPO, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and not done.stderr, done.stdout + done.stderr
    answers: dict[str, list[object]] = json.loads(done.stdout)
    return answers


@pytest.mark.parametrize("name", sorted(console_scripts()))
def test_each_command_reports_the_version(name: str, versions: dict[str, list[object]]) -> None:
    assert versions[name] == [0, f"{name} {__version__}\n", ""]


def test_the_changelog_has_the_version() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(__version__)}\b", changelog, re.M), "CHANGELOG.md has no section for it"
    assert set(console_scripts()) >= {"brokerd", "brokerd-ssmp", "brokerd-mcchat", "brokerd-smqp", "brokerd-mqtt",
                                      "brokerd-ctl"}  # the commands the changelog says report it
