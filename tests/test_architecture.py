"""The layering of STYLE.md, checked by import-linter's contracts in setup.cfg, and the contract
type ``no_cycles`` (tests/support/importcycles.py) shown failing on each kind of import cycle."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import REPO

LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def test_import_contracts_are_kept():
    # A subprocess: import-linter's own state must not mix with the test run's imports.
    result = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--config", "setup.cfg"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout


NO_CYCLES = """[importlinter]
root_package = toy
contract_types =
    no_cycles: tests.support.importcycles.NoCyclesContract

[importlinter:contract:no-cycles]
name = No import cycle anywhere in toy
type = no_cycles
"""

DOWNWARD = {
    "front/__init__.py": "from toy.front.shared import State\n",
    "front/shared.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from toy.base.names import Name\n\n"
                       "class State:\n    pass\n",
    "front/server.py": "from toy.front import State\n\n\ndef build():\n    from toy.base import names\n",
    "base/names.py": "Name = str\n",
}
"""A package that imports downward only: by package, by function, for type checking."""

CYCLES = {
    "inside a function": ({"base/names.py": "def late():\n    from toy.front import server\n"}, 4,
                          ["toy.base.names -> toy.front.server", "toy.front.server -> toy.front ",
                           "toy.front -> toy.front.shared", "toy.front.shared -> toy.base.names"]),
    "for type checking": ({"base/names.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                            "    from toy.front.shared import State\n"}, 2,
                          ["toy.base.names -> toy.front.shared", "toy.front.shared -> toy.base.names"]),
    # import-linter's acyclic_siblings does not see this one: a package and its own submodules.
    "package and submodule": ({"front/shared.py": "from toy.front import server\n\nclass State:\n    pass\n"}, 3,
                              ["toy.front -> toy.front.shared", "toy.front.shared -> toy.front.server",
                               "toy.front.server -> toy.front "]),
}
"""Each a change to DOWNWARD that makes a cycle: the modules in it, the imports that close it."""


def lint_toy(tmp_path: Path, changes: dict[str, str]) -> subprocess.CompletedProcess:
    """lint-imports with the no_cycles contract on package ``toy`` (DOWNWARD with ``changes``)."""
    for name, text in {**DOWNWARD, **changes}.items():
        path = tmp_path / "toy" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for directory in [tmp_path / "toy", *(p for p in (tmp_path / "toy").rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()
    (tmp_path / "setup.cfg").write_text(NO_CYCLES)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo", "setup.cfg"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_the_no_cycles_contract_keeps_imports_that_go_downward(tmp_path: Path):
    result = lint_toy(tmp_path, {})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


@pytest.mark.parametrize("shape", sorted(CYCLES))
def test_the_no_cycles_contract_fails_on_a_cycle(tmp_path: Path, shape: str):
    changes, modules, imports = CYCLES[shape]
    result = lint_toy(tmp_path, changes)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "0 kept, 1 broken" in result.stdout
    assert f"An import cycle of {modules} modules:" in result.stdout
    for line in imports:
        assert f"- {line}" in result.stdout
