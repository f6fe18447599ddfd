"""README.md's command blocks, run as written on free loopback ports.

Each console script is put on PATH as a small shim that runs its setup.cfg entry point from
this checkout, ``twistd`` likewise; the README's port numbers are replaced by free ports, and
the shims add the default port a command relies on (``brokerd-ssmp sub news`` reaches 8787
by default).  Every broker and subscriber started here is stopped by the test.

Not run here: README command 2 (it is this test suite) and the ``pip install .`` half of
command 1 (tests/test_packaging.py installs the wheel in a fresh virtualenv); the ``twistd``
half of command 1 must be the "Trying it" broker, which is run.  The ``nc`` line runs only
where ``nc`` is installed.
"""
from __future__ import annotations

import configparser
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.broker import REPO, free_port
from tests.support.processes import default_sigint

pytestmark = pytest.mark.slow

def not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


DEFAULT_PORTS = {"ssmp": 8787, "mcchat": 1502, "smqp": 7720, "socketmq": 8080, "mqtt": 1883, "admin": 8081, "tls": 8788}
SHIM_DEFAULTS = {"brokerd-ssmp": ("ssmp", ["-p"]), "brokerd-mcchat": ("mcchat", ["-p"]),
                 "brokerd-smqp": ("smqp", ["-p"]), "brokerd-mqtt": ("mqtt", ["-p"]), "brokerd-ctl": ("admin", ["--admin", "http://127.0.0.1:{port}"])}
SHIM = """#!{python}
import os, sys
sys.path.insert(0, {repo!r})
args = sys.argv[1:]
default = {default!r}
if default and not any(a.split("=")[0] in ("-p", "--port", "--connect", "--admin", "--config") for a in args):
    args = [part.format(port=default[0]) for part in default[1]] + args
sys.argv = [{name!r}] + args
{call}
"""


def sh_blocks(text: str) -> list[list[str]]:
    return [block.strip().splitlines() for block in re.findall(r"```sh\n(.*?)```", text, re.S)]


def command_of(line: str) -> str:
    """The command without its trailing ``# comment``."""
    return re.sub(r"\s+#\s.*$", "", line).strip()


def write_shims(directory: Path, ports: dict[str, int]) -> None:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    scripts = parser["options.entry_points"]["console_scripts"].strip().splitlines()
    entries = {name.strip(): target.strip() for name, target in (line.split("=") for line in scripts)}
    entries["twistd"] = "twisted.scripts.twistd:run"
    for name, target in entries.items():
        module, function = target.split(":")
        default = None
        if name in SHIM_DEFAULTS:
            protocol, option = SHIM_DEFAULTS[name]
            default = (ports[protocol], option if option != ["-p"] else ["-p", "{port}"])
        call = f"from {module} import {function}\nsys.exit({function}())"
        path = directory / name
        path.write_text(SHIM.format(python=sys.executable, repo=str(REPO), default=default, name=name, call=call))
        path.chmod(0o755)


def with_ports(text: str, ports: dict[str, int]) -> str:
    for protocol, default in DEFAULT_PORTS.items():
        text = re.sub(rf"\b{default}\b", str(ports[protocol]), text)
    return text


class Shell:
    def __init__(self, cwd: Path, bin_dir: Path, ports: dict[str, int]) -> None:
        self.cwd = cwd
        self.ports = ports
        self.env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(REPO))
        self.background: list[subprocess.Popen] = []

    def run(self, line: str) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", "-c", with_ports(command_of(line), self.ports)], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        return done

    def start(self, line: str) -> subprocess.Popen:
        """Start ``line`` in its own process group, as a terminal would: with Ctrl-C's SIGINT at
        its default disposition even when pytest runs in the background with SIGINT ignored
        (children inherit an ignored signal, and bash cannot undo that)."""
        process = subprocess.Popen(["bash", "-c", "exec " + with_ports(command_of(line), self.ports)], cwd=self.cwd,
                                   env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=default_sigint)
        self.background.append(process)
        return process

    def stop_all(self) -> list[int]:
        codes = []
        for process in reversed(self.background):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(30)
            codes.append(process.returncode)
        return codes


def wait_for_ports(process: subprocess.Popen, ports: list[int], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            assert process.poll() is None, process.stdout.read().decode(errors="replace")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"nothing listens on {port}"
                time.sleep(0.05)


def read_until(process: subprocess.Popen, wanted: list[str], timeout: float = 30.0) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while not all(w in seen for w in wanted):
        left = deadline - time.monotonic()
        assert left > 0, f"waited for {wanted}, got {seen!r}"
        ready, _, _ = select.select([process.stdout], [], [], left)
        if ready:
            chunk = os.read(process.stdout.fileno(), 65536).decode(errors="replace")
            assert chunk, f"ended before {wanted}: {seen!r}"
            seen += chunk
    return seen


def wait_subscribed(shell: Shell, name_prefix: str, topic: str, timeout: float = 30.0) -> None:
    """Ask the admin listener until a session whose name starts with ``name_prefix`` is
    subscribed to ``topic``."""
    deadline = time.monotonic() + timeout
    while True:
        listing = shell.run("brokerd-ctl sessions").stdout
        for row in listing.splitlines():
            fields = row.split("\t")
            if fields[2].startswith(name_prefix) and topic in fields[4].split(","):
                return
        assert time.monotonic() < deadline, listing
        time.sleep(0.1)


def test_readme_commands(tmp_path: Path) -> None:
    blocks = sh_blocks((REPO / "README.md").read_text())
    install, trying, tls = blocks[0], blocks[1], blocks[2]
    ports = {protocol: free_port() for protocol in DEFAULT_PORTS}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_shims(bin_dir, ports)
    clone = tmp_path / "clone"
    (clone / "docs" / "examples").mkdir(parents=True)
    example = REPO / "docs" / "examples" / "try-it.toml"
    (clone / "docs" / "examples" / "try-it.toml").write_text(with_ports(example.read_text(), ports))
    shell = Shell(clone, bin_dir, ports)

    server_line, *client_lines = trying
    assert install[1].split(" && ")[-1] == command_of(server_line)  # command 1 starts this broker
    try:
        stops_with = [-signal.SIGINT]  # what each process started ends with on Ctrl-C, in order
        server = shell.start(server_line)
        wait_for_ports(server, [ports[p] for p in ("ssmp", "mcchat", "smqp", "socketmq", "mqtt", "admin")])
        subscriber = shell.start(client_lines[0])  # brokerd-ssmp sub news -v
        stops_with.append(0)  # subscribers end quietly
        wait_subscribed(shell, "brokerd-ssmp", "news")
        outputs = {}
        for line in client_lines[1:]:
            program = command_of(line).split("|")[-1].split()[0]
            if shutil.which(program, path=shell.env["PATH"]) is None:
                continue  # nc, where it is not installed
            if program == "nc":
                raw = shell.start(line)
                stops_with.append(-signal.SIGINT)  # nc, where it is installed, waits for the broker's end
                outputs[line] = read_until(raw, ["200\n200\n"])
                continue
            outputs[line] = shell.run(line).stdout
        got = read_until(subscriber, ["hello, world", "hello from MCCHAT", "hello from MQTT"])
        assert "hello, world" in got and "mcchat:" in got and "mqtt:" in got
        smqp_sub = next(line for line in client_lines if "sub -C 1" in line)
        assert "hello, SMQP" in outputs[smqp_sub]
        assert "each new subscriber gets it" in smqp_sub  # as the comment says: it is kept on the topic
        assert "hello, SMQP" in shell.run(smqp_sub).stdout
        status = outputs[next(line for line in client_lines if "brokerd-ctl status" in line)].splitlines()
        assert status[1].startswith("connections: ") and "ssmp 1" in status[1], status  # the subscriber
        assert status[3].startswith("messages: ") and "SMQP queues: " in status[5], status
        figures = json.loads(shell.run("brokerd-ctl status --json").stdout,
                             parse_constant=not_json)  # strict: what the dashboard's JSON.parse reads
        assert figures["messages"]["accepted_by_protocol"]["ssmp"] >= 1
        assert figures["store"]["commit_seconds_buckets"][-1][0] == "+Inf"  # SMQP's store runs

        shell.run(tls[0])
        tls_server = shell.start(tls[1])  # beside the first broker, in the same directory
        stops_with.append(-signal.SIGINT)
        wait_for_ports(tls_server, [ports["tls"]])
        tls_subscriber = shell.start(tls[2])
        stops_with.append(0)
        shell.run("brokerd-certs client pki bob")
        publish = (f"brokerd-ssmp --connect tcp:127.0.0.1:{ports['tls']} --ca pki/ca.pem --cert pki/bob.pem "
                   "--key pki/bob.key -i bob pub news over-tls")
        deadline = time.monotonic() + 30
        while True:  # the subscriber's SUBSCRIBE may not be in place for the first publish
            shell.run(publish)
            ready, _, _ = select.select([tls_subscriber.stdout], [], [], 0.5)
            if ready:
                break
            assert time.monotonic() < deadline, "the TLS subscriber printed nothing"
        assert "over-tls" in read_until(tls_subscriber, ["over-tls"])
    finally:
        codes = shell.stop_all()
    # last started, first stopped
    assert codes == stops_with[::-1], (codes, stops_with)


def test_readme_listener_example_serves_the_trying_it_commands(tmp_path: Path) -> None:
    """The paragraph's example of naming listeners: on this host only, and the "Trying it"
    commands of its protocols (SSMP and MQTT) work against it as written."""
    text = (REPO / "README.md").read_text()
    example = re.search(r"e\.g\. `(brokerd --ssmp [^`]*)`", text, re.S)
    assert example is not None
    command = " ".join(example.group(1).split())
    listeners = re.findall(r"--(ssmp|mqtt|mcchat|smqp|socketmq) (\S+)", command)
    assert {protocol for protocol, _ in listeners} == {"ssmp", "mqtt"}, command
    assert all(endpoint.endswith(":interface=127.0.0.1") for _, endpoint in listeners), command
    ports = {protocol: free_port() for protocol in DEFAULT_PORTS}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_shims(bin_dir, ports)
    shell = Shell(tmp_path, bin_dir, ports)
    trying = sh_blocks(text)[1]
    subscribe = next(line for line in trying if command_of(line).startswith("brokerd-ssmp sub"))
    publishes = [line for line in trying if command_of(line).startswith(("brokerd-ssmp pub", "brokerd-mqtt pub"))]
    try:
        server = shell.start(command)
        wait_for_ports(server, [ports["ssmp"], ports["mqtt"]])
        subscriber = shell.start(subscribe)
        deadline = time.monotonic() + 30
        while True:  # the subscriber's SUBSCRIBE may not be in place for the first publish
            shell.run(publishes[0])
            ready, _, _ = select.select([subscriber.stdout], [], [], 0.5)
            if ready:
                break
            assert time.monotonic() < deadline, "the subscriber printed nothing"
        for line in publishes[1:]:
            shell.run(line)
        got = read_until(subscriber, ["hello, world", "hello from MQTT"])
        assert "hello, world" in got and "hello from MQTT" in got, got
    finally:
        shell.stop_all()
