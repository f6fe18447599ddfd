"""deploy/'s files installed in a test directory as the image and the unit install them, with
only their paths and ports changed, and started with the image's own command."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support import processes
from tests.support.broker import REPO, free_port

DEPLOY = REPO / "deploy"
ETC = "/etc/brokerd"
STATE = "/var/lib/brokerd"
LISTENER = re.compile(r'^(ssmp|mcchat|smqp|socketmq|mqtt|admin) = "tcp:(\d+)(:interface=127\.0\.0\.1)?"', re.M)
TOKEN = "deploy-admin-token"

TWISTD = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"
"""``twistd`` run by the test's interpreter, with the checkout on PYTHONPATH."""


@dataclass
class Installed:
    etc: Path
    state: Path
    config: Path
    ports: dict[str, int]
    """listener -> the free port it got in place of the file's."""
    loopback: set[str]
    """listeners the file binds to 127.0.0.1 only."""


def shipped_listeners() -> dict[str, tuple[int, bool]]:
    """listener -> (port, bound to loopback only) as deploy/brokerd.toml names them."""
    text = (DEPLOY / "brokerd.toml").read_text()
    return {name: (int(port), bool(loopback)) for name, port, loopback in LISTENER.findall(text)}


def install(root: Path, config_edits: dict[str, str] | None = None,
            policy_edits: dict[str, str] | None = None) -> Installed:
    """The Dockerfile's install steps into ``root``/etc and ``root``/state (a fresh data
    volume), the admin token an operator mounts, and every port replaced by a free one (the
    interfaces stay: tcp:PORT binds every interface, on a free port).  ``config_edits`` and
    ``policy_edits`` change more of brokerd.toml's and socketmq-policy.toml's text (old: new)."""
    etc, state = root / "etc", root / "state"
    etc.mkdir(parents=True)
    state.mkdir(mode=0o700)
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "install -m 0644 /src/deploy/brokerd.toml /src/deploy/socketmq-policy.toml /etc/brokerd/" in dockerfile
    assert f"install -o brokerd -g brokerd -m 0600 /src/deploy/brokerd.ual {STATE}/smqp.ual" in dockerfile
    (etc / "socketmq-policy.toml").write_text(_edited((DEPLOY / "socketmq-policy.toml").read_text(), policy_edits))
    shutil.copyfile(DEPLOY / "brokerd.ual", state / "smqp.ual")
    (state / "smqp.ual").chmod(0o600)
    token = etc / "admin-token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    text = (DEPLOY / "brokerd.toml").read_text()
    ports: dict[str, int] = {}
    loopback: set[str] = set()
    for name, (port, local) in shipped_listeners().items():
        ports[name] = free_port()
        interface = ":interface=127.0.0.1" if local else ""
        text = text.replace(f'{name} = "tcp:{port}{interface}"', f'{name} = "tcp:{ports[name]}{interface}"')
        if local:
            loopback.add(name)
    text = text.replace(ETC, str(etc)).replace(STATE, str(state))
    config = etc / "brokerd.toml"
    config.write_text(_edited(text, config_edits))
    return Installed(etc, state, config, ports, loopback)


def _edited(text: str, edits: dict[str, str] | None) -> str:
    for old, new in (edits or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def image_command(config: Path) -> list[str]:
    """The image's ENTRYPOINT and CMD, with the config at ``config``."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    command = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    assert entrypoint[0] == "twistd" and command == ["--config", f"{ETC}/brokerd.toml"]
    return [sys.executable, "-c", TWISTD, *entrypoint[1:], "--config", str(config)]


def read_only(directory: Path, command: list[str]) -> list[str]:
    """``command`` run where ``directory`` is read-only, as ProtectSystem=strict makes /etc
    (and as a root-owned /etc/brokerd is to the container's user): a read-only bind mount in
    a mount namespace of its own when this test runs as root (root ignores permission bits),
    else the directory's write permission is taken away."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return command
    script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" "$1" && shift && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(directory), *command]


def can_mount() -> bool:
    """Whether :func:`read_only` can work here (root needs mount namespaces)."""
    if os.geteuid() != 0:
        return True
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def start(installed: Installed, command: list[str], log: Path, timeout: float = 60.0) -> subprocess.Popen:
    """Start ``command``; return once every listener accepts connections on 127.0.0.1."""
    process = processes.spawn(command, log, env=processes.repo_env())
    deadline = time.monotonic() + timeout
    for port in installed.ports.values():
        processes.wait_for_port(port, process, log, deadline)
    return process


def ctl(config: Path, *args: str, typed: str | None = None) -> subprocess.CompletedProcess:
    """``brokerd-ctl --config CONFIG ARGS``: the admin listener and token the config names."""
    return subprocess.run([sys.executable, "-m", "brokerd.cli.ctl", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=60, env=processes.repo_env(), input=typed)
