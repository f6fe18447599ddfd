"""Every command says which brokerd it is: ``brokerd --version`` and each ``brokerd-*``
console script's print ``NAME VERSION`` (brokerd.__version__, the package's version) and exit
0, and CHANGELOG.md has a section for that version."""
from __future__ import annotations

import configparser
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


@pytest.mark.parametrize("name", sorted(console_scripts()))
def test_each_command_reports_the_version(name: str) -> None:
    module, function = console_scripts()[name].split(":")
    call = f"import sys; sys.argv = [{name!r}, '--version']; from {module} import {function}; {function}()"
    done = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True, timeout=60,
                          env=repo_env(), cwd=REPO, stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{name} {__version__}\n", "")


def test_the_changelog_has_the_version() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(__version__)}\b", changelog, re.M), "CHANGELOG.md has no section for it"
    assert set(console_scripts()) >= {"brokerd", "brokerd-ssmp", "brokerd-mcchat", "brokerd-smqp", "brokerd-mqtt",
                                      "brokerd-ctl"}  # the commands the changelog says report it
