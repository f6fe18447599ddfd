"""Run the real ``twistd brokerd`` as a subprocess on free loopback ports, for end-to-end tests.

Blocking on purpose (subprocess + sockets): these tests talk to the broker the way a
third-party client does, not through the test's reactor.
"""
from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import processes
from tests.support.processes import REPO, repo_env, wait_for_port

__all__ = ["REPO", "LineClient", "RunningBroker", "free_port", "free_run", "repo_env", "start_broker", "twistd"]


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out by itself (``bind`` to port 0, a ``connect``'s source)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_range()
#: Ports below the ephemeral range, so that no socket the kernel numbers itself (a listener on
#: port 0, any client connection) can take a port between this answer and the test's bind.
_CHOSEN_FROM = range(10000, _EPHEMERAL[0]) if _EPHEMERAL[0] > 12000 else range(_EPHEMERAL[1] + 1, 65536)
_handed_out: set[int] = set()
LISTENER_OPTIONS = frozenset(("--ssmp", "--mcchat", "--smqp", "--socketmq", "--mqtt", "--config"))
"""Options that name what a started broker listens on."""
_pick = random.Random()


def free_port() -> int:
    """A loopback port free now and outside the kernel's ephemeral range.

    A port taken by binding to 0 and closing is in that range: the kernel may give it to the
    next listener on port 0 or to an outgoing connection before the test binds it (CI failed
    on exactly that, ``Address already in use``).  Ports handed out once in this process are
    not handed out again."""
    for _ in range(1000):
        port = _pick.choice(_CHOSEN_FROM)
        if _take(port):
            return port
    raise RuntimeError(f"no free loopback port in {_CHOSEN_FROM}")


def free_run(count: int) -> int:
    """A base port whose next ``count`` ports are free too, all outside the ephemeral range."""
    for _ in range(1000):
        base = free_port()
        run = range(base + 1, base + count + 1)
        if run.stop <= _CHOSEN_FROM.stop and all(_take(port) for port in run):
            return base
    raise RuntimeError(f"no run of {count + 1} free loopback ports in {_CHOSEN_FROM}")


def _take(port: int) -> bool:
    if port in _handed_out:
        return False
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    _handed_out.add(port)
    return True


def twistd() -> list[str]:
    """``twistd -n --pidfile= brokerd`` run by the interpreter running the tests."""
    launcher = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"
    return [sys.executable, "-c", launcher, "-n", "--pidfile=", "brokerd"]


@dataclass
class RunningBroker:
    process: subprocess.Popen
    ports: dict[str, int]
    data_dir: Path
    log_path: Path
    args: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = processes.STOP_TIMEOUT) -> int:
        return processes.stop(self.process, sig, timeout)


def start_broker(
    tmp_path: Path,
    *options: str,
    listeners: dict[str, str] | None = None,
    timeout: float = 30.0,
    wait_for: tuple[int, ...] = (),
) -> RunningBroker:
    """Start ``twistd brokerd``; ``listeners`` maps protocol to an endpoint template in which
    ``{port}`` is replaced by a free port (default: SSMP on plain TCP).  Returns once every
    listener port (and the ports in ``wait_for``) accepts connections."""
    if listeners is None:
        listeners = {"ssmp": "tcp:{port}:interface=127.0.0.1"}
    ports: dict[str, int] = {}
    args = list(twistd())
    for protocol, template in listeners.items():
        ports[protocol] = free_port()
        args += [f"--{protocol}", template.format(port=ports[protocol])]
    if not any(option in LISTENER_OPTIONS for option in (*args, *options)):
        # brokerd with no listener option binds the default ports (8787, 1502, 720, 8080,
        # 1883): the machine's, which a test never takes (test_startup checks them in a
        # network namespace of its own).
        raise ValueError("start_broker needs a listener option or a --config naming its listeners")
    data_dir = tmp_path / "data"
    args += ["--data-dir", str(data_dir), *options]
    log_path = tmp_path / "broker.log"
    process = processes.spawn(args, log_path)
    deadline = time.monotonic() + timeout
    for port in (*ports.values(), *wait_for):
        wait_for_port(port, process, log_path, deadline)
    return RunningBroker(process, ports, data_dir, log_path, args)


class LineClient:
    """A blocking SSMP-ish line client over a socket (plain or TLS) with bounded reads."""

    def __init__(self, sock: socket.socket, timeout: float = 5.0) -> None:
        self.sock = sock
        self.sock.settimeout(timeout)
        self.buffer = b""

    @classmethod
    def connect(cls, port: int, timeout: float = 5.0) -> LineClient:
        return cls(socket.create_connection(("127.0.0.1", port), timeout=timeout), timeout)

    def send(self, data: bytes | str) -> None:
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"connection closed; buffered {self.buffer!r}")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def request(self, line: str | bytes) -> bytes:
        self.send((line.encode() if isinstance(line, str) else line) + b"\n")
        return self.line()

    def closed(self) -> bool:
        """True if the server closed the connection (after any buffered data)."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buffer += chunk
        except (ConnectionResetError, BrokenPipeError):
            return True
        except (socket.timeout, TimeoutError):
            return False

    def close(self) -> None:
        self.sock.close()
