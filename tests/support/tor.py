"""A private Tor network on loopback for the onion-service tests, built from Debian's ``tor``.

Three directory authorities (relays too), two more relays, and two tors that are neither: a
``client`` (a SOCKS port and a control port, as a user's tor) and a ``service`` (a control
port, as the system tor an operator's broker would use).  Everything runs in one temp dir:
keys are made at start (``tor-gencert`` for the authorities' v3 keys, ``tor --list-fingerprint``
for every relay's identity), every process binds and connects to 127.0.0.1 only, and every
torrc names this network's own ``DirAuthority`` lines and nothing else (no default
authorities, no fallback directories: :func:`private_torrc_problems` checks a torrc for it,
and the tests check every torrc the suite writes).

``TestingTorNetwork`` with short voting intervals (a first consensus within ~10 s) and the
Testing* flags that make every relay a guard and an HSDir without waiting for uptime let the
network come up in 19-49 seconds (measured on a busy 2-core machine): :data:`BOOTSTRAP_TIMEOUT`
bounds it.  Without ``tor`` the tests skip (fail when ``CI`` is set: .ci/run installs it).

The session-scoped fixture ``tor_network`` builds it once per test session.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.broker import free_port

BOOTSTRAP_TIMEOUT = 120.0
"""Seconds the whole network gets to reach a consensus and bootstrap its client tors."""

AUTHORITIES = 3
RELAYS = 2

COMMON = (
    "TestingTorNetwork 1",
    "UseDefaultFallbackDirs 0",
    "Address 127.0.0.1",
    "ClientUseIPv6 0",
    "ClientUseIPv4 1",
    "AssumeReachable 1",
    "PathsNeededToBuildCircuits 0.67",
    "TestingDirAuthVoteGuard *",
    "TestingDirAuthVoteExit *",
    "TestingDirAuthVoteHSDir *",
    "V3AuthNIntervalsValid 2",
    "TestingMinExitFlagThreshold 0",
    "RunAsDaemon 0",
    "SafeLogging 0",
    "LogTimeGranularity 1",
    "ShutdownWaitLength 0",
)
"""Options of every tor of the network (``TestingTorNetwork`` first: it changes defaults)."""

VOTING = (
    "V3AuthVotingInterval 10",
    "V3AuthVoteDelay 2",
    "V3AuthDistDelay 2",
    "TestingV3AuthInitialVotingInterval 5",
    "TestingV3AuthInitialVoteDelay 2",
    "TestingV3AuthInitialDistDelay 2",
)
"""The authorities' voting schedule: the shortest Tor accepts, for a quick first consensus."""


def tor_binaries() -> tuple[str, str]:
    """(tor, tor-gencert); skipped without them, a failure when ``CI`` is set."""
    tor, gencert = shutil.which("tor"), shutil.which("tor-gencert")
    if tor is None or gencert is None:
        reason = "tor and tor-gencert are not installed: apt-get install tor (the onion-service tests need them)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return tor, gencert


def private_torrc_problems(text: str) -> list[str]:
    """What makes a torrc unfit for the tests: any way it could reach beyond loopback or the
    private network (an empty list when it is fit)."""
    options: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            options.setdefault(key.lower(), []).append(value.strip())
    problems = []
    for key, wanted in (("testingtornetwork", "1"), ("usedefaultfallbackdirs", "0"),
                        ("address", "127.0.0.1"), ("clientuseipv6", "0")):
        if options.get(key) != [wanted]:
            problems.append(f"{key} is {options.get(key)}, not {wanted}")
    authorities = options.get("dirauthority", [])
    if not authorities:
        problems.append("no DirAuthority line: tor would use the public network's")
    for line in authorities:
        if not re.search(r"\s127\.0\.0\.1:\d+\s+[0-9A-F]{40}$", line):
            problems.append(f"DirAuthority not on 127.0.0.1: {line}")
    for key in ("fallbackdir", "alternatedirauthority", "alternatebridgeauthority", "bridge", "usebridges",
                "hsdir", "socks5proxy", "httpsproxy", "socks4proxy", "tcpproxy", "outboundbindaddress"):
        if key in options:
            problems.append(f"{key} is set")
    for key, values in options.items():
        if key.endswith("port"):
            problems += [f"{key} {value} does not bind 127.0.0.1" for value in values
                         if value.split()[0] != "0" and not value.startswith(("127.0.0.1:", "unix:"))]
    return problems


@dataclass
class TorNode:
    """One tor process of the network, its directory and its torrc."""

    name: str
    directory: Path
    or_port: int = 0
    dir_port: int = 0
    socks_port: int = 0
    control_port: int = 0
    fingerprint: str = ""
    v3ident: str = ""
    process: subprocess.Popen | None = None

    @property
    def torrc(self) -> Path:
        return self.directory / "torrc"

    @property
    def log_path(self) -> Path:
        return self.directory / "tor.log"

    @property
    def control_endpoint(self) -> str:
        """The Twisted client endpoint of its control port."""
        return f"tcp:127.0.0.1:{self.control_port}"

    def cookie(self) -> Path:
        return self.directory / "control_auth_cookie"


@dataclass
class TorNetwork:
    """The running network: its authorities, relays, ``client`` and ``service`` tors."""

    root: Path
    tor: str
    authorities: list[TorNode] = field(default_factory=list)
    relays: list[TorNode] = field(default_factory=list)
    client: TorNode | None = None
    service: TorNode | None = None
    bootstrap_seconds: float = 0.0
    """How long the network took to come up (the client and service tors at 100%)."""

    @property
    def nodes(self) -> list[TorNode]:
        return [*self.authorities, *self.relays, *filter(None, [self.client, self.service])]

    def dir_authority_lines(self) -> list[str]:
        return [f"DirAuthority {node.name} orport={node.or_port} no-v2 v3ident={node.v3ident} "
                f"127.0.0.1:{node.dir_port} {node.fingerprint}" for node in self.authorities]

    def client_options(self) -> list[str]:
        """The options of a tor that uses this network as a client (brokerd's launched tor,
        the client tors): the common ones and the network's authorities."""
        return [*COMMON, *self.dir_authority_lines()]

    def write_torrc(self, path: Path, *extra: str) -> Path:
        """Write a client torrc for this network plus ``extra`` lines, checked to be private."""
        return write_private_torrc(path, [*self.client_options(), *extra])

    def torrcs(self) -> list[Path]:
        """Every torrc the network's tors were started with."""
        return [node.torrc for node in self.nodes]

    def stop(self) -> None:
        """SIGTERM to every tor at once, then wait for each (SIGKILL after a bound)."""
        running = [node.process for node in self.nodes if node.process is not None and node.process.poll() is None]
        for process in running:
            process.terminate()
        for process in running:
            processes.stop(process, timeout=5.0)
        for node in self.nodes:
            node.process = None


def write_private_torrc(path: Path, lines: list[str]) -> Path:
    """Write a torrc, refusing (AssertionError) one that :func:`private_torrc_problems` finds
    unfit: no tor of the tests ever starts with a torrc that could leave the private network."""
    text = "\n".join(lines) + "\n"
    problems = private_torrc_problems(text)
    if problems:
        raise AssertionError(f"refusing to write {path}: {problems}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _base_lines(node: TorNode) -> list[str]:
    return [
        *COMMON,
        f"Nickname {node.name}",
        f"DataDirectory {node.directory}",
        f"Log notice file {node.log_path}",
        f"ServerDNSResolvConfFile {node.directory.parent / 'resolv.conf'}",
        "ServerDNSDetectHijacking 0",
        "ServerDNSAllowBrokenConfig 1",
        f"__OwningControllerProcess {os.getpid()}",
    ]


def _make_authority_keys(node: TorNode, gencert: str) -> None:
    """The authority's v3 identity, signing key and certificate (tor-gencert, no passphrase)."""
    keys = node.directory / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [gencert, "--create-identity-key", "-m", "12", "-a", f"127.0.0.1:{node.dir_port}",
         "-i", str(keys / "authority_identity_key"), "-s", str(keys / "authority_signing_key"),
         "-c", str(keys / "authority_certificate"), "--passphrase-fd", "0"],
        input=b"\n", check=True, capture_output=True, timeout=60)
    found = re.search(r"^fingerprint ([0-9A-F]{40})$", (keys / "authority_certificate").read_text(), re.M)
    assert found, "tor-gencert wrote no fingerprint"
    node.v3ident = found.group(1)


def _make_relay_identity(node: TorNode, tor: str) -> None:
    """The relay's identity key and fingerprint (``tor --list-fingerprint``, which makes the
    key and exits).  Its torrc is this node's own with the network off (``DisableNetwork``)
    and a placeholder authority on loopback: tor refuses TestingTorNetwork without a
    DirAuthority, and the real lines need these very fingerprints."""
    keygen = node.directory / "torrc.keygen"
    write_private_torrc(keygen, [
        *_base_lines(node), "DisableNetwork 1", f"ORPort 127.0.0.1:{node.or_port}",
        f"DirAuthority keygen orport={node.or_port} no-v2 127.0.0.1:{node.dir_port or node.or_port} "
        + "0" * 40,
    ])
    output = subprocess.run([tor, "--defaults-torrc", os.devnull, "-f", str(keygen), "--list-fingerprint"],
                            check=True, capture_output=True, text=True, timeout=60).stdout
    found = re.search(rf"^{node.name} ([0-9A-F ]{{49}})$", output, re.M)
    assert found, f"no fingerprint from tor --list-fingerprint: {output}"
    node.fingerprint = found.group(1).replace(" ", "")


def _relay_lines(network: TorNetwork, node: TorNode, authority: bool) -> list[str]:
    lines = [
        *_base_lines(node), *network.dir_authority_lines(),
        f"ORPort 127.0.0.1:{node.or_port}",
        "SocksPort 0",
        "ExitRelay 0",
        "ExitPolicy reject *:*",
        "ContactInfo brokerd-tests@localhost",
    ]
    if authority:
        lines += [f"DirPort 127.0.0.1:{node.dir_port}", "AuthoritativeDirectory 1",
                  "V3AuthoritativeDirectory 1", *VOTING]
    return lines


def _spawn(network: TorNetwork, node: TorNode) -> None:
    node.process = processes.spawn([network.tor, "--defaults-torrc", os.devnull, "-f", str(node.torrc)],
                                   node.directory / "stdout.log", cwd=node.directory)


def start_network(root: Path, timeout: float = BOOTSTRAP_TIMEOUT) -> TorNetwork:
    """Make the keys, write the torrcs, start every tor and return once the client and the
    service tor report ``Bootstrapped 100%``."""
    tor, gencert = tor_binaries()
    started = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    (root / "resolv.conf").write_text("nameserver 127.0.0.1\n")  # no DNS query ever leaves loopback
    network = TorNetwork(root, tor)
    for index in range(AUTHORITIES):
        node = TorNode(f"auth{index}", root / f"auth{index}", or_port=free_port(), dir_port=free_port())
        node.directory.mkdir(mode=0o700)
        _make_authority_keys(node, gencert)
        _make_relay_identity(node, tor)
        network.authorities.append(node)
    for index in range(RELAYS):
        node = TorNode(f"relay{index}", root / f"relay{index}", or_port=free_port())
        node.directory.mkdir(mode=0o700)
        _make_relay_identity(node, tor)
        network.relays.append(node)
    network.client = TorNode("client", root / "client", socks_port=free_port(), control_port=free_port())
    network.service = TorNode("service", root / "service", control_port=free_port())
    for node in network.authorities:
        write_private_torrc(node.torrc, _relay_lines(network, node, authority=True))
    for node in network.relays:
        write_private_torrc(node.torrc, _relay_lines(network, node, authority=False))
    for node in (network.client, network.service):
        node.directory.mkdir(mode=0o700)
        socks = f"SocksPort 127.0.0.1:{node.socks_port} ExtendedErrors" if node.socks_port else "SocksPort 0"
        write_private_torrc(node.torrc, [
            *_base_lines(node), *network.dir_authority_lines(), socks,
            f"ControlPort 127.0.0.1:{node.control_port}", "CookieAuthentication 1",
            f"ClientOnionAuthDir {node.directory / 'onion_auth'}",
            "SocksTimeout 50",  # answer 0x06 before a test's attempt gives up (ATTEMPT_TIMEOUT)
        ])
        (node.directory / "onion_auth").mkdir(mode=0o700)
    try:
        for node in network.nodes:
            _spawn(network, node)
        deadline = started + timeout
        for node in (network.client, network.service):
            _wait_bootstrapped(node, deadline)
    except BaseException:
        network.stop()
        raise
    network.bootstrap_seconds = time.monotonic() - started
    return network


def _wait_bootstrapped(node: TorNode, deadline: float) -> None:
    """Return once the node's log says ``Bootstrapped 100%``; fail with every log's tail if a
    tor exits or the deadline passes."""
    while True:
        assert node.process is not None
        log = node.log_path.read_text(errors="replace") if node.log_path.exists() else ""
        if "Bootstrapped 100%" in log:
            return
        if node.process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"tor {node.name} did not bootstrap (exit status {node.process.poll()}):\n"
                                 f"{log[-3000:]}")
        time.sleep(0.2)  # polling the log file, bounded by the deadline


def control_command(node: TorNode, *commands: str, timeout: float = 10.0) -> str:
    """Send ``commands`` to a tor's control port (after AUTHENTICATE with its cookie) and
    return the replies: for a test's own look at a tor (GETINFO, ONION_CLIENT_AUTH_ADD)."""
    cookie = node.cookie().read_bytes().hex()
    with socket.create_connection(("127.0.0.1", node.control_port), timeout=timeout) as control:
        control.sendall(f"AUTHENTICATE {cookie}\r\n".encode())
        for command in commands:
            control.sendall(f"{command}\r\n".encode())
        control.sendall(b"QUIT\r\n")
        replies = b""
        while chunk := control.recv(65536):
            replies += chunk
    return replies.decode(errors="replace")


@pytest.fixture(scope="session")
def tor_network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorNetwork]:
    """The private Tor network, built once per test session and stopped at its end."""
    network = start_network(tmp_path_factory.mktemp("tor"))
    try:
        yield network
    finally:
        network.stop()


def socks_connect(socks_port: int, host: str, port: int, timeout: float = 60.0) -> socket.socket:
    """A TCP connection to ``host:port`` through a tor's SOCKS port (SOCKS5, the name given to
    tor to resolve: an onion address never leaves tor).  ConnectionRefusedError carrying
    SOCKS5's reply code when tor cannot connect (with the client tor's ExtendedErrors:
    0xF0 no descriptor found, 0xF4 a client authorization is missing)."""
    sock = socket.create_connection(("127.0.0.1", socks_port), timeout=timeout)
    try:
        sock.sendall(b"\x05\x01\x00")
        assert read_exactly(sock, 2) == b"\x05\x00", "the SOCKS port refused no-authentication"
        name = host.encode("ascii")
        sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + port.to_bytes(2, "big"))
        reply = read_exactly(sock, 4)
        if reply[1] != 0:
            raise ConnectionRefusedError(reply[1], f"SOCKS5 reply {reply[1]:#x} for {host}:{port}")
        address_length = {1: 4, 4: 16}.get(reply[3]) or read_exactly(sock, 1)[0]
        read_exactly(sock, address_length + 2)  # the bound address and port: unused
    except BaseException:
        sock.close()
        raise
    return sock


RETRIED_REPLIES = frozenset({0x01, 0x04, 0x06, 0xF0, 0xF2, 0xF3, 0xF7})
"""SOCKS5 replies a client tor gives while it still holds a stale descriptor of a service that
was republished (a restarted broker's new introduction points), or has not yet fetched a new
service's descriptor from an HSDir that has it, or gave up building a rendezvous circuit on a
loaded machine (0x06, TTL expired): a later attempt succeeds."""

ATTEMPT_TIMEOUT = 60.0
"""Seconds one SOCKS attempt may wait for tor's reply before it is abandoned and tried again."""


def socks_connect_retrying(socks_port: int, host: str, port: int, timeout: float = 240.0) -> socket.socket:
    """:func:`socks_connect`, tried again after a reply of :data:`RETRIED_REPLIES`, or after an
    attempt tor left unanswered for :data:`ATTEMPT_TIMEOUT` seconds, until ``timeout`` seconds
    have passed (what a client does after a service restarted).  A reply not in the set (0xF4:
    a client authorization is missing) is raised at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socks_connect(socks_port, host, port, timeout=ATTEMPT_TIMEOUT)
        except ConnectionRefusedError as exc:
            if exc.args[0] not in RETRIED_REPLIES or time.monotonic() > deadline:
                raise
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
        time.sleep(1.0)  # between attempts of a client, bounded by the deadline


def read_exactly(sock: socket.socket, count: int) -> bytes:
    """``count`` bytes from a blocking socket (ConnectionError if it closes first)."""
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"the connection closed after {len(data)} of {count} bytes")
        data += chunk
    return data


@dataclass
class OnionBroker:
    """A ``twistd brokerd`` whose listeners are onion services: ``addresses`` maps each
    protocol to the (onion address, port) its start-up log names."""

    process: subprocess.Popen
    data_dir: Path
    log_path: Path
    addresses: dict[str, tuple[str, int]]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        return processes.stop(self.process)


_LISTENING = re.compile(r"(\S+) listening on ([a-z2-7]{56}\.onion):(\d+) \(--([a-z]+) ")


def start_onion_broker(directory: Path, *options: str, listeners: dict[str, str],
                       timeout: float = BOOTSTRAP_TIMEOUT) -> OnionBroker:
    """Start ``twistd brokerd`` with ``listeners`` (protocol -> endpoint string) and return
    once every one of them logged its onion address (its descriptor is then published)."""
    from tests.support.broker import twistd

    directory.mkdir(parents=True, exist_ok=True)
    args = [*twistd(), "--data-dir", str(directory / "data"), *options]
    for protocol, description in listeners.items():
        args += [f"--{protocol}", description]
    log_path = directory / "broker.log"
    process = processes.spawn(args, log_path)
    deadline = time.monotonic() + timeout
    while True:
        found = {match[3]: (match[1], int(match[2])) for match in _LISTENING.findall(log_path.read_text(errors="replace"))}
        if set(found) >= set(listeners):
            return OnionBroker(process, directory / "data", log_path, found)
        if process.poll() is not None or time.monotonic() > deadline:
            processes.stop(process)
            raise AssertionError(f"brokerd did not publish {sorted(listeners)}:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.1)  # polling the log file, bounded by the deadline
