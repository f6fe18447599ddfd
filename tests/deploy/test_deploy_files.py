"""deploy/: the container's build context holds no key, virtualenv or data file (computed
from .dockerignore by Docker's rules: no Docker engine here), ``systemd-analyze verify``
accepts the unit and ``systemd-analyze security`` finds it hardened (test_deployment.py
runs the config both use)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.broker import REPO
from tests.support.dockerignore import build_context, excluded, read_patterns

DEPLOY = REPO / "deploy"

PLANTED = [
    # what a checkout where someone followed README and docs holds beside the sources
    ".venv/bin/python", ".venv/pyvenv.cfg", "venv/lib/site.py", "pki/ca.key", "pki/ca.pem", "pki/alice.pem",
    "server.key", "server.pem", "etc/brokerd/admin-token", "brokerd-data/smqp.sqlite3",
    "brokerd-data/smqp.sqlite3-wal", "brokerd-data/broker-id", "brokerd-data/socketmq/server-key.asc",
    "brokerd-data/events/date=2024-05-01/hour=00/a.jsonl", "data1/broker-id", "node1.log", "node1.pid",
    "twistd.pid", "twistd.log", "accounts",
    "brokerd/auth/leftover.key", "brokerd/__pycache__/x.cpython-311.pyc", "twisted/plugins/dropin.cache",
]


def is_secret_venv_or_data(path: str) -> bool:
    """A key, certificate, token, virtualenv or data file, judged by its own name."""
    parts = path.split("/")
    name = parts[-1]
    return (any(part in (".venv", "venv") or part.startswith(("brokerd-data", "data")) for part in parts[:-1])
            or name.endswith((".key", ".pem", ".asc", ".sqlite3", ".sqlite3-wal", ".jsonl", ".pid", ".log"))
            or name in ("broker-id", "admin-token", "accounts", "pyvenv.cfg", "dropin.cache")
            or name.endswith(".pyc"))


def tracked_files() -> list[str]:
    listing = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    return listing.stdout.split()


def test_the_build_context_holds_no_key_venv_or_data_file(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    for name in [*tracked_files(), *PLANTED, "test-artifacts/admin-dashboard.png"]:
        target = checkout / name
        target.parent.mkdir(parents=True, exist_ok=True)
        source = REPO / name
        if source.is_file() and name not in PLANTED:
            shutil.copyfile(source, target)
        else:
            target.write_text("planted\n")
    context = build_context(checkout, (REPO / ".dockerignore").read_text())
    assert not [path for path in context if is_secret_venv_or_data(path)]
    # positive control: all pip needs (the package, the plugin, the metadata) and the config
    needed = {name for name in tracked_files() if name.startswith(("brokerd/", "twisted/plugins/"))}
    assert needed <= context, sorted(needed - context)
    assert {"setup.cfg", "pyproject.toml", "README.md", "deploy/brokerd.toml", "deploy/brokerd.ual",
            "deploy/socketmq-policy.toml"} <= context
    assert all(is_secret_venv_or_data(path) for path in PLANTED)  # the judge knows them all
    assert not [path for path in context if path.startswith(("tests/", "docs/", "benchmarks/", ".git", "test-artifacts/"))]
    # the real checkout, as it is now (its .venv, test output...), gives no more than that
    real = build_context(REPO, (REPO / ".dockerignore").read_text())
    assert not [path for path in real if is_secret_venv_or_data(path)]


def test_dockerignore_rules_as_docker_documents_them() -> None:
    patterns = read_patterns("# comment\n  *.md \n!README.md\n/build/\n**/*.key\ndocs/**\n!docs/keep/**\n")
    assert patterns[0] == ("*.md", False) and patterns[2] == ("build", False)
    assert excluded("CHANGES.md", patterns) and not excluded("README.md", patterns)
    assert not excluded("sub/CHANGES.md", patterns)  # * stops at /
    assert excluded("build/x/y.o", patterns)  # a directory's pattern covers what is in it
    assert excluded("a.key", patterns) and excluded("a/b/c.key", patterns)  # ** is zero or more dirs
    assert excluded("docs/a/b.txt", patterns) and not excluded("docs/keep/b.txt", patterns)
    assert not excluded("src/main.py", patterns)


def test_the_rules_agree_with_the_docker_sdk_where_it_is_installed(tmp_path: Path) -> None:
    build = pytest.importorskip("docker.utils.build", reason="the Docker SDK for Python is not installed")
    for name in [*PLANTED, "setup.cfg", "brokerd/__init__.py", "deploy/brokerd.toml", "docs/x.md"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    text = (REPO / ".dockerignore").read_text()
    sdk_patterns = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    files = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    sdk_included = set(build.exclude_paths(str(tmp_path), sdk_patterns)) & files  # it lists what stays
    assert build_context(tmp_path, text) == sdk_included


def _unit_root(tmp_path: Path) -> Path:
    """A root for ``systemd-analyze verify --root``: the system's unit files, the unit where
    docs/deploy.md installs it, and an executable where its ExecStart is (the install step
    makes /opt/brokerd/bin/twistd)."""
    root = tmp_path / "root"
    for system_units in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        if system_units.is_dir():
            shutil.copytree(system_units, root / "usr/lib/systemd/system", symlinks=True)
            break
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copyfile(DEPLOY / "brokerd.service", root / "etc/systemd/system/brokerd.service")
    twistd = root / "opt/brokerd/bin/twistd"
    twistd.parent.mkdir(parents=True)
    twistd.write_text("#!/bin/sh\n")
    twistd.chmod(0o755)
    return root


def verify(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", f"--root={root}", "brokerd.service"], capture_output=True,
                          text=True, timeout=60)


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    root = _unit_root(tmp_path)
    checked = verify(root)
    assert checked.returncode == 0 and checked.stdout + checked.stderr == "", checked
    # positive control: verify does find a broken unit (an ExecStart that is not there)
    (root / "opt/brokerd/bin/twistd").unlink()
    broken = verify(root)
    assert broken.returncode != 0 and "twistd" in broken.stderr, broken
    unit = (DEPLOY / "brokerd.service").read_text()
    assert "--config /etc/brokerd/brokerd.toml" in unit and "ReadWritePaths=/var/lib/brokerd" in unit


HARDENING = ("PrivateDevices=true", "ProtectKernelTunables=true", "ProtectKernelModules=true", "ProtectKernelLogs=true",
             "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "CapabilityBoundingSet=\n",
             "SystemCallFilter=@system-service", "MemoryMax=", "UMask=0077", "ProtectSystem=strict",
             "ReadWritePaths=/var/lib/brokerd")


def security(root: Path) -> subprocess.CompletedProcess:
    """``systemd-analyze security`` of the installed unit, offline: fails when its exposure
    score (0 hardened ... 10 exposed) is above 2."""
    return subprocess.run(["systemd-analyze", "security", "--offline=true", f"--root={root}", "--threshold=20",
                           "--no-pager", "brokerd.service"], capture_output=True, text=True, timeout=60)


def exposure(checked: subprocess.CompletedProcess) -> float:
    found = re.search(r"Overall exposure level for brokerd.service: (\d+\.\d)", checked.stdout)
    assert found, checked.stdout[-500:]
    return float(found.group(1))


def test_the_unit_is_hardened(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    unit = (DEPLOY / "brokerd.service").read_text()
    assert [line for line in HARDENING if line not in unit] == []
    root = _unit_root(tmp_path)
    checked = security(root)
    assert checked.returncode == 0 and exposure(checked) < 2.0, checked.stdout[-3000:] + checked.stderr
    # positive control: the same unit without its sandboxing lines is found exposed
    plain = [line for line in unit.splitlines(keepends=True)
             if not line.startswith(("Protect", "Private", "Restrict", "SystemCall", "Capability", "UMask",
                                     "LockPersonality", "RemoveIPC", "NoNewPrivileges"))]
    (root / "etc/systemd/system/brokerd.service").write_text("".join(plain))
    exposed = security(root)
    assert exposed.returncode != 0 and exposure(exposed) > 8.0, exposed.stdout[-500:]
