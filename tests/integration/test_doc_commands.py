"""The ``sh`` command blocks of docs/*.md, run as written on free loopback ports.

Every ``sh`` block of the docs is either run here (:data:`RUNNERS`) or listed with the reason
it cannot run here (:data:`NOT_RUN`); a new block that is neither fails
:func:`test_every_doc_command_block_is_run_or_listed`.  The commands run through the same
console-script shims and port replacement as README.md's (tests/integration/test_readme.py),
each block in a directory of its own, and every broker and client started is stopped.

Where a block names something this machine does not have, the test replaces it and says so
in :data:`SUBSTITUTIONS` (the system paths under /etc and /var, which a test must not write;
the host name ``broker``; the ``...`` that stands for "your other options").
"""
from __future__ import annotations

import os
import re
import select
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_readme import (
    DEFAULT_PORTS,
    Shell,
    command_of,
    read_until,
    wait_for_ports,
    with_ports,
    write_shims,
)
from tests.support.broker import REPO, LineClient, free_port, free_run

DOCS = REPO / "docs"
TIMEOUT = 30.0
EXTRA_PORTS = {"mcchat-tls": 1503, "smqp-example": 7200, "smqps-example": 7201}
"""Ports the docs use beyond README's (test_readme.DEFAULT_PORTS), replaced the same way."""


def with_extra_port(run: Callable, default: int, port: int) -> Callable:
    """``run`` (Shell.run or Shell.start) with ``default`` replaced by ``port`` in its line."""
    return lambda line: run(re.sub(rf"\b{default}\b", str(port), line))

NOT_RUN: dict[tuple[str, int], str] = {
    ("deploy.md", 0): "installs into /opt, adds a system user and enables a systemd unit: a host's setup, "
                      "as root (tests/deploy verifies deploy/brokerd.service with systemd-analyze and starts a "
                      "broker from deploy/brokerd.toml)",
    ("deploy.md", 1): "docker build/run: no Docker engine in the test environment (tests/deploy checks the "
                      "build context deploy/Dockerfile gets from .dockerignore)",
    ("deploy.md", 2): "docker compose: no Docker engine in the test environment (tests/deploy/test_compose.py "
                      "runs the compose file's commands without it)",
    ("tor.md", 0): "a tor on the public network (/run/tor/control): no tor here may leave loopback; "
                   "tests/tor runs the same listeners through a private Tor network's control port",
    ("tor.md", 1): "clients dialling onion addresses through a tor's SOCKS port: tests/tor runs each client "
                   "through the private network's client tor",
    ("tor.md", 2): "brokerd-onion and client authorization with a system tor: tests/tor/test_onion_client_auth.py "
                   "runs them on the private network",
    ("mqtt.md", 1): "Eclipse paho's interoperability suites: cloned from the public network and run by hand "
                    "(not part of brokerd's tests); tests/integration/test_example_configs.py starts brokerd "
                    "with docs/examples/paho-interop.toml",
}

NOT_RUN_PAGES: dict[str, str] = {
    "performance-mqtt.md": "benchmarks: minutes of full load beside mosquitto and other commits "
                           "(benchmarks/README.md)",
    "performance-history.md": "benchmarks: minutes of full load each, often against other commits or a "
                      "broker given by PORT/PID placeholders (benchmarks/README.md)",
}
"""Pages none of whose blocks runs here, with the reason."""

SUBSTITUTIONS: dict[str, list[tuple[str, str]]] = {
    # (what the doc says, what runs here): system paths become the test's own directories
    "admin.md": [("/etc/brokerd", "etc/brokerd"), (" ...", " --ssmp tcp:8787:interface=127.0.0.1 --open-login"),
                 ("http://broker:", "http://127.0.0.1:")],
    "deploy.md": [("/var/lib/brokerd", "var/lib/brokerd"), ("/var/backups/brokerd", "var/backups/brokerd")],
    # the optional part in brackets, given (the block's ca.pem is made by brokerd-certs init .)
    "mcchat.md": [("[--tls-ca ca.pem]", "--tls-ca ca.pem")],
}


def sh_blocks(path: Path) -> list[list[str]]:
    """The ``sh`` blocks of ``path``, each as its commands: continuation lines joined, blank
    and comment-only lines left out, substitutions applied."""
    blocks = []
    for text in re.findall(r"```sh\n(.*?)```", path.read_text(), re.S):
        text = re.sub(r"\\\n\s*", "", text)
        for old, new in SUBSTITUTIONS.get(path.name, []):
            text = text.replace(old, new)
        blocks.append([line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")])
    return blocks


def wait_printed(shell: Shell, command: str, reader: subprocess.Popen, wanted: str) -> str:
    """Run ``command`` until ``reader`` prints ``wanted`` (a subscriber's SUBSCRIBE may not be in
    place for the first publish)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        shell.run(command)
        ready, _, _ = select.select([reader.stdout], [], [], 0.5)
        if ready:
            return read_until(reader, [wanted])
        assert time.monotonic() < deadline, f"{wanted!r} never printed"


def s_client(shell: Shell, line: str, typed: bytes | None) -> subprocess.CompletedProcess:
    """An ``openssl s_client`` line with what the user types (None: stdin is /dev/null)."""
    command = with_ports(command_of(line), shell.ports)
    if typed is None:
        return subprocess.run(["bash", "-c", command], cwd=shell.cwd, env=shell.env, capture_output=True,
                              timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    process = subprocess.Popen(["bash", "-c", command], cwd=shell.cwd, env=shell.env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        process.stdin.write(typed)  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
        answer = read_until(process, ["200"])
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(TIMEOUT)
    return subprocess.CompletedProcess(command, 0, answer, "")


# ---------------------------------------------------------------------- the runners


def smqp_try_it(shell: Shell, blocks: list[list[str]]) -> None:
    server_line, create, sub, pub = blocks[0]
    server = shell.start(server_line)
    wait_for_ports(server, [shell.ports["smqp"]])
    shell.run(create)  # exits 0 (the sub below would get 404 without the topic)
    subscriber = shell.start(sub)
    assert "hello, SMQP" in wait_printed(shell, pub, subscriber, "hello, SMQP")
    assert shell.stop_all() == [0, -signal.SIGINT]  # the subscriber ends quietly on Ctrl-C


def tls_walkthrough(shell: Shell, blocks: list[list[str]]) -> None:
    init, client, server_line, login_line, typed = blocks[0]
    shell.run(init)
    shell.run(client)
    server = shell.start(server_line)
    wait_for_ports(server, [shell.ports["tls"]])
    assert "200" in s_client(shell, login_line, typed.encode() + b"\n").stdout  # LOGIN alice cert
    refused, works = blocks[1]
    assert s_client(shell, refused, None).returncode != 0  # a CBC suite: no handshake
    assert s_client(shell, works, None).returncode == 0
    with_cert, asks = blocks[2]
    assert "200" in s_client(shell, with_cert, b"LOGIN alice cert\n").stdout
    assert b"CertificateRequest" in s_client(shell, asks, None).stdout
    assert shell.stop_all() == [-signal.SIGINT]


def admin_token(shell: Shell, blocks: list[list[str]]) -> None:
    (shell.cwd / "etc" / "brokerd").mkdir(parents=True)
    make_token, server_line, curl = blocks[0]
    shell.run(make_token)
    assert oct((shell.cwd / "etc/brokerd/admin-token").stat().st_mode & 0o777) == "0o600"
    server = shell.start(server_line)
    wait_for_ports(server, [shell.ports["admin"]])
    assert "brokerd_connections" in shell.run(curl).stdout
    assert shell.stop_all() == [-signal.SIGINT]


def admin_sys_topics(shell: Shell, blocks: list[list[str]]) -> None:
    """The block follows "With --sys-interval S": this broker has it."""
    server = shell.start("twistd -n brokerd --ssmp tcp:8787:interface=127.0.0.1 --mcchat tcp:1502:interface=127.0.0.1"
                         " --open-login --sys-interval 0.2 --data-dir sys-data")
    wait_for_ports(server, [shell.ports["ssmp"], shell.ports["mcchat"]])
    ssmp_line, mcchat_line = blocks[1]
    ssmp = shell.start(ssmp_line)
    mcchat = shell.start(mcchat_line)
    printed = "sys:brokerd ~sys/brokerd/sessions/ssmp 1\n"  # the subscriber itself is the one session
    assert printed in read_until(ssmp, [printed])
    shell.run('brokerd-ssmp pub news "hello, world"')  # a figure exists once SSMP accepted a message
    assert "~sys/brokerd/messages/accepted_by_protocol/ssmp" in read_until(
        mcchat, ["~sys/brokerd/messages/accepted_by_protocol/ssmp"])
    assert shell.stop_all() == [0, 0, -signal.SIGINT]


def admin_ctl(shell: Shell, blocks: list[list[str]]) -> None:
    """brokerd-ctl's examples against README's try-it broker started again with an (empty)
    accounts file, as the page says; the password is typed (one line of standard input),
    ``ID`` is the id ``sessions`` printed for alice's SSMP session."""
    touch, server_line, status, add, listing, ual_set, ual_list, sessions, close, ual_remove = blocks[1]
    examples = shell.cwd / "docs" / "examples"
    examples.mkdir(parents=True, exist_ok=True)
    (examples / "try-it.toml").write_text(with_ports((REPO / "docs/examples/try-it.toml").read_text(), shell.ports))
    shell.run(touch)
    server = shell.start(server_line)
    wait_for_ports(server, [shell.ports["ssmp"], shell.ports["admin"]])
    assert shell.run(status).stdout.startswith("brokerd ")
    typed = subprocess.run(["bash", "-c", with_ports(command_of(add), shell.ports)], cwd=shell.cwd, env=shell.env,
                           input="alicepw\n", capture_output=True, text=True, timeout=TIMEOUT)
    assert typed.returncode == 0 and typed.stdout == "added alice\n", typed
    assert shell.run(listing).stdout == "alice\n"
    assert shell.run(ual_set).stdout == "set /news alice s\n"
    assert shell.run(ual_list).stdout == "/news\talice\ts\n"
    alice = LineClient.connect(shell.ports["ssmp"])
    assert alice.request("LOGIN alice password alicepw") == b"200"
    assert alice.request("MCAST news refused").startswith(b"4")  # the entry: subscribe only
    session = next(line.split("\t")[0] for line in shell.run(sessions).stdout.splitlines() if "\talice\t" in line)
    assert "refused at login for 600 s" in shell.run(close.replace("ID", session)).stdout
    assert alice.closed()
    again = LineClient.connect(shell.ports["ssmp"])
    assert again.request("LOGIN alice password alicepw").startswith(b"401")
    assert shell.run(ual_remove).stdout == "removed /news alice\n"
    anyone = LineClient.connect(shell.ports["ssmp"])
    assert anyone.request("LOGIN bob open") == b"200" and anyone.request("MCAST news open-again") == b"200"
    assert shell.stop_all() == [-signal.SIGINT]


def admin_commands(shell: Shell, blocks: list[list[str]]) -> None:
    admin_token(shell, blocks)
    shell.background.clear()
    admin_ctl(shell, blocks)
    shell.background.clear()
    admin_sys_topics(shell, [blocks[0], blocks[2]])


def mcchat_commands(shell: Shell, blocks: list[list[str]]) -> None:
    """The two broker lines are alternatives (plain TCP or TLS): each is run on its own."""
    plain, tls, sub, pub, topics = blocks[0]
    server = shell.start(plain)
    wait_for_ports(server, [shell.ports["mcchat"]])
    subscriber = shell.start(sub)
    assert "hello" in wait_printed(shell, pub, subscriber, "hello")
    assert "news" in shell.run(topics).stdout.split()
    assert shell.stop_all() == [0, -signal.SIGINT]
    shell.background.clear()
    shell.run("brokerd-certs init .")  # server.pem, server.key and ca.pem here
    server = shell.start(tls)
    wait_for_ports(server, [shell.ports["mcchat-tls"]])
    assert shell.stop_all() == [-signal.SIGINT]


def mqtt_commands(shell: Shell, blocks: list[list[str]]) -> None:
    """An MQTT subscriber (mosquitto_sub) gets mosquitto_pub's message and an SSMP one."""
    server_line, sub, pub, ssmp_pub = blocks[0]
    server = shell.start(server_line)
    wait_for_ports(server, [shell.ports["mqtt"], shell.ports["ssmp"]])
    subscriber = shell.start(sub)
    assert "sensors/kitchen 21.5" in wait_printed(shell, pub, subscriber, "sensors/kitchen 21.5")
    shell.run(ssmp_pub)
    assert "sensors/kitchen 22.0" in read_until(subscriber, ["sensors/kitchen 22.0"])
    shell.stop_all()


def deploy_backup(shell: Shell, blocks: list[list[str]]) -> None:
    (shell.cwd / "var" / "backups" / "brokerd").mkdir(parents=True)
    server = shell.start("twistd -n brokerd --smqp tcp:7720:interface=127.0.0.1 --data-dir var/lib/brokerd"
                         " --smqp-guest-permissions psc")
    wait_for_ports(server, [shell.ports["smqp"]])
    shell.run("brokerd-smqp -p 7720 create /kept")
    shell.run(blocks[3][0])
    copies = list((shell.cwd / "var" / "backups" / "brokerd").glob("smqp-*.sqlite3"))
    assert len(copies) == 1, copies
    with sqlite3.connect(copies[0]) as copy:
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert "kept" in str(copy.execute("SELECT * FROM topics").fetchall())
    assert shell.stop_all() == [-signal.SIGINT]


def smqp_client_examples(shell: Shell, blocks: list[list[str]]) -> None:
    """The server setup the page names (alice's account and certificate, SMQP on 7200 and
    SMQPS on 7201), then the examples as one pasted script against it."""
    account, certificates, server_line = blocks[1]
    shell.run(account)
    shell.run(certificates)
    server = shell.start(server_line)
    wait_for_ports(server, [shell.ports["smqp-example"], shell.ports["smqps-example"]])
    script = "set -e\n" + "\n".join(command_of(line) for line in blocks[2])
    printed = shell.run(script).stdout
    assert printed.endswith("02:00:00:00\n") or "02:00:00:00" in printed.splitlines()[-1], printed
    assert shell.stop_all() == [-signal.SIGINT]


def operations_check_and_daemon(shell: Shell, blocks: list[list[str]]) -> None:
    """--check-config on README's try-it config, then that broker as a twistd daemon: twistd
    returns once it listens, and SIGTERM through its pid file stops it."""
    check, daemon_line, kill = blocks[0]
    examples = shell.cwd / "docs" / "examples"
    examples.mkdir(parents=True)
    (examples / "try-it.toml").write_text(with_ports((REPO / "docs/examples/try-it.toml").read_text(), shell.ports))
    assert shell.run(check).stdout == "brokerd: configuration OK\n"
    assert not (shell.cwd / "brokerd-data").exists()  # checked, not started
    pid_file = shell.cwd / "brokerd.pid"
    try:
        shell.run(daemon_line)
        pid = int(pid_file.read_text())
        with socket.create_connection(("127.0.0.1", shell.ports["ssmp"]), timeout=5) as ssmp:
            ssmp.sendall(b"LOGIN alice open\n")
            assert ssmp.recv(100) == b"200\n"
        shell.run(kill)
        deadline = time.monotonic() + TIMEOUT
        while pid_file.exists() or Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline, "the daemon did not stop"
            time.sleep(0.05)  # polling a process that is not the test's child, bounded
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert "Server Shut Down." in (shell.cwd / "brokerd.log").read_text()


README_PORTS = {8787, 1502, 7720, 8080, 1883, 8081}
"""README command 1's try-it broker (docs/examples/try-it.toml)."""


def recipe_ports(lines: list[str]) -> set[int]:
    """Every port the cluster recipe names, with ``$n`` as each of its nodes 1 to 3."""
    text = "\n".join(lines)
    return {int(port.replace("$n", str(n))) for n in (1, 2, 3)
            for port in re.findall(r"(?:tcp:|-p |--port |127\.0\.0\.1:)(\d+(?:\$n)?)", text)}


def cluster_recipe(shell: Shell, blocks: list[list[str]]) -> None:
    """The three-node recipe, line by line, beside README command 1's broker: its ports are
    none of README's; it starts (daemon mode), routes, and stops cleanly (no pid file left,
    no traceback in a node's log).  Here each port range is moved to free ports."""
    lines = blocks[0]
    assert not recipe_ports(lines) & README_PORTS, recipe_ports(lines) & README_PORTS
    (shell.cwd / "try-it.toml").write_text(with_ports((REPO / "docs/examples/try-it.toml").read_text(), shell.ports))
    readme_broker = shell.start("twistd -n brokerd --config try-it.toml")
    wait_for_ports(readme_broker, [shell.ports[p] for p in ("ssmp", "mcchat", "smqp", "socketmq", "mqtt", "admin")])
    bases = {"878": free_run(3), "151": free_run(3), "809": free_run(3)}
    redis = free_port()

    def moved(line: str) -> str:
        line = line.replace("6379", str(redis))
        for prefix, base in bases.items():
            line = line.replace(f"{prefix}$n", f"$(({base}+n))")
            line = re.sub(rf"\b{prefix}([1-3])\b", lambda m: str(base + int(m.group(1))), line)  # noqa: B023
        return line

    commands = [moved(line) for line in lines]
    loop_start = next(i for i, line in enumerate(commands) if line.startswith("for "))
    loop_end = next(i for i, line in enumerate(commands) if line.strip() == "done")
    redis_line, loop, rest = commands[0], "\n".join(commands[loop_start:loop_end + 1]), commands[loop_end + 1:]
    subscribe, publish, stop_subscriber, stop_nodes, stop_redis = rest
    assert redis_line.endswith("&") and subscribe.split("#")[0].strip().endswith("&")
    redis_server = shell.start(redis_line.rstrip("& "))
    wait_for_ports(redis_server, [redis])
    for setup in commands[1:loop_start]:  # the nodes' shared secret
        shell.run(setup)
    shell.run(loop)  # daemon mode: returns once the nodes are started
    ssmp_ports = [bases["878"] + n for n in (1, 2, 3)]
    for port in ssmp_ports:
        deadline = time.monotonic() + TIMEOUT
        while not _listening(port):
            assert time.monotonic() < deadline, (port, [(shell.cwd / f"node{n}.log").read_text() for n in (1, 2, 3)])
            time.sleep(0.05)
    subscriber = shell.start(command_of(subscribe).rstrip("& "))
    assert "hello from node 1" in wait_printed(shell, publish, subscriber, "hello from node 1")
    assert command_of(stop_subscriber) == "kill $!"  # each line runs in a shell of its own here: $! is this one
    os.killpg(subscriber.pid, signal.SIGTERM)
    assert subscriber.wait(TIMEOUT) is not None
    shell.run(stop_nodes)
    deadline = time.monotonic() + TIMEOUT
    while any((shell.cwd / f"node{n}.pid").exists() for n in (1, 2, 3)):
        assert time.monotonic() < deadline, "a node left its pid file"
        time.sleep(0.05)
    shell.run(stop_redis)
    assert redis_server.wait(TIMEOUT) == 0
    for n in (1, 2, 3):
        log = (shell.cwd / f"node{n}.log").read_text()
        assert "Traceback" not in log and f"Cluster: node node{n} joins through" in log, log
    assert readme_broker.poll() is None  # README's broker ran beside it throughout
    assert shell.stop_all()[-1] == -signal.SIGINT


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


RUNNERS: dict[str, tuple[list[int], Callable[[Shell, list[list[str]]], None]]] = {
    # doc -> (the blocks the runner runs, the runner)
    "smqp.md": ([0], smqp_try_it),
    "smqp.md#clients": ([1, 2], smqp_client_examples),
    "tls.md": ([0, 1, 2], tls_walkthrough),
    "admin.md": ([0, 1, 2], admin_commands),
    "mcchat.md": ([0], mcchat_commands),
    "mqtt.md": ([0], mqtt_commands),
    "deploy.md": ([3], deploy_backup),
    "operations.md": ([0], operations_check_and_daemon),
    "cluster.md": ([0], cluster_recipe),
}


def test_every_doc_command_block_is_run_or_listed() -> None:
    found = {(path.name, i) for path in DOCS.glob("*.md") if path.name not in NOT_RUN_PAGES
             for i in range(len(sh_blocks(path)))}
    run = {(name.partition("#")[0], i) for name, (indices, _runner) in RUNNERS.items() for i in indices}
    assert not run & set(NOT_RUN)
    assert found == run | set(NOT_RUN), sorted(found ^ (run | set(NOT_RUN)))


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted(RUNNERS))
def test_doc_commands(tmp_path: Path, doc: str) -> None:
    ports = {protocol: free_port() for protocol in [*DEFAULT_PORTS, *EXTRA_PORTS]}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_shims(bin_dir, ports)
    cwd = tmp_path / "work"
    cwd.mkdir()
    shell = Shell(cwd, bin_dir, ports)
    blocks = sh_blocks(DOCS / doc.partition("#")[0])
    for name, default in EXTRA_PORTS.items():
        blocks = [[re.sub(rf"\b{default}\b", str(ports[name]), line) for line in block] for block in blocks]
        shell.run = with_extra_port(shell.run, default, ports[name])  # type: ignore[method-assign]
        shell.start = with_extra_port(shell.start, default, ports[name])  # type: ignore[method-assign]
    try:
        RUNNERS[doc][1](shell, blocks)
    finally:
        shell.stop_all()
