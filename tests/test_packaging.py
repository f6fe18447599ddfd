"""`pip install .` (not editable) gives a package whose twistd lists and runs brokerd, from any
directory; the known packaging traps of twistd plugins are checked on the wheel itself."""
from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from brokerd.config import PROTOCOLS
from tests.support.broker import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True, capture_output=True, timeout=600,
    )
    (found,) = out.glob("brokerd-*.whl")
    return found


def test_wheel_carries_the_plugin_and_no_traps(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "twisted/plugins/brokerd_plugin.py" in names
    assert "twisted/plugins/brokerd_frontends.py" in names  # the front ends, for getPlugins(IFrontEnd)
    assert {f"brokerd/protocols/{name}/plugin.py" for name in PROTOCOLS} <= set(names)
    assert "twisted/plugins/__init__.py" not in names  # would shadow Twisted's own plugins
    assert not any(name.endswith("dropin.cache") for name in names)
    assert "brokerd/tap.py" in names
    assert "brokerd/protocols/ssmp/server.py" in names
    assert not any(name.startswith("tests/") for name in names)


def test_installed_wheel_runs_under_twistd_from_any_directory(wheel, tmp_path):
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True, timeout=900)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    twistd = env_dir / "bin" / "twistd"
    listing = subprocess.run([twistd, "--help"], cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert "brokerd" in listing.stdout
    usage = subprocess.run([twistd, "brokerd", "--help"], cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert "--ssmp=" in usage.stdout and "--tls-ca=" in usage.stdout
    found = subprocess.run(
        [python, "-c", "from twisted.plugin import getPlugins\nfrom brokerd.frontend import IFrontEnd\n"
                       "print(sorted(plugin.name for plugin in getPlugins(IFrontEnd)))"],
        cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert found.stdout == f"{sorted(PROTOCOLS)}\n", found.stderr
