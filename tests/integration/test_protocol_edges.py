"""Attacks on the edges of the protocols against a real ``twistd brokerd`` with every
protocol listening: the broker's own identities and ``~sys`` topics, metric series users
could multiply, the socket.mq connection gauge.  Each attack has its positive control, and
an innocent client of every protocol is served while it runs."""
from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from brokerd.protocols.mcchat.codec import encode_msg
from tests.integration.smqp_fixtures import ACCOUNTS, BlockingSMQP, write_test_accounts
from tests.support.broker import LineClient, RunningBroker, free_port, start_broker
from tests.support.innocent import ALL_PROTOCOLS, assert_serves_every_protocol

pytestmark = pytest.mark.slow

BOUND = 30.0
"""Seconds any wait on the broker may take before the test fails."""


def broker_with_admin(tmp_path: Path, *options: str, accounts_extra: dict[str, str] | None = None
                      ) -> tuple[RunningBroker, int]:
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts, {**ACCOUNTS, **(accounts_extra or {})})
    admin = free_port()
    broker = start_broker(tmp_path, "--open-login", "--accounts", str(accounts),
                          "--admin", f"tcp:{admin}:interface=127.0.0.1", *options,
                          listeners=ALL_PROTOCOLS, wait_for=(admin,))
    return broker, admin


def scrape(admin: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def until_scraped(admin: int, condition, what: str) -> dict:
    """Scrape /metrics until ``condition(values)`` holds (bounded by :data:`BOUND`)."""
    deadline = time.monotonic() + BOUND
    while True:
        values = scrape(admin)
        if condition(values):
            return values
        assert time.monotonic() < deadline, f"/metrics never showed {what}: {values}"
        time.sleep(0.1)


def series(values: dict, name: str) -> dict[tuple, float]:
    return {labels: value for (metric, labels), value in values.items() if metric == name}


def test_trash_series_are_bounded_to_the_fullest_queues_and_the_rest(tmp_path: Path) -> None:
    """300 topics, each with a message that times out into its Trash: /metrics names the 5
    fullest Trash queues (--metrics-top-queues 5) and sums the 295 others, so the series
    stay 6 and still add up to every trashed message."""
    broker, admin = broker_with_admin(tmp_path, "--metrics-top-queues", "5")
    try:
        client = BlockingSMQP(broker.ports["smqp"])
        client.login("alice", "c1")
        names = ["hot"] + [f"t{i:03d}" for i in range(299)]
        client.send(b"".join(f"CREATE TOPIC /{name}\r\n".encode() for name in names))
        assert [client.reply().code for _ in names] == [200] * len(names)
        expiring = ("Timeout", "00:00:01")
        publishes = [client.publish_bytes(f"/{name}", f"C-{name}", b"soon gone", expiring) for name in names]
        publishes += [client.publish_bytes("/hot", f"C-hot-{n}", b"soon gone", expiring) for n in range(2)]
        client.send(b"".join(publishes))
        assert [client.reply().code for _ in publishes] == [200] * len(publishes)
        values = until_scraped(admin, lambda v: v.get(("brokerd_smqp_trash_queues", ())) == 300
                               and sum(series(v, "brokerd_smqp_trash_messages").values()) == 302,
                               "302 trashed messages in 300 queues")
        trash = series(values, "brokerd_smqp_trash_messages")
        assert len(trash) == 6, trash
        assert trash[(("queue", "hot/trash"),)] == 3  # the fullest is named (positive control)
        assert trash[(("queue", "(others)"),)] == 295
        assert_serves_every_protocol(broker)
        client.close()
    finally:
        broker.stop()


UPGRADE = (
    "GET /socket.mq/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Protocol: socketmq.v1\r\n{extra}\r\n"
)


def websocket_answer(port: int, extra: str = "", request: str = UPGRADE) -> tuple[socket.socket, bytes]:
    """Send an upgrade request; the socket and the response's status line."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(request.format(port=port, extra=extra).encode())
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, head.partition(b"\r\n")[0]


def closed_by_peer(sock: socket.socket) -> None:
    """Wait (bounded by the socket's timeout) until the broker closes ``sock``."""
    while sock.recv(65536):
        pass
    sock.close()


def socketmq_open(values: dict) -> float:
    return values.get(("brokerd_connections", (("protocol", "socketmq"),)), 0.0)


def test_socketmq_connection_gauge_counts_only_open_connections(tmp_path: Path) -> None:
    """Accepted WebSockets, and WebSockets refused for their origin, for a bad handshake and
    over a connection limit: once closed, ``brokerd_connections{protocol="socketmq"}`` is back
    to the number still open."""
    broker, admin = broker_with_admin(tmp_path, "--max-connections-per-address", "4")
    port = broker.ports["socketmq"]
    try:
        until_scraped(admin, lambda v: not any(series(v, "brokerd_connections").values()),
                      "start_broker's probes closed")
        accepted, status = websocket_answer(port)
        assert status == b"HTTP/1.1 101 Switching Protocols"  # positive control
        until_scraped(admin, lambda v: socketmq_open(v) == 1, "the one open WebSocket")
        foreign, status = websocket_answer(port, "Origin: https://attacker.example\r\n")
        assert status.startswith(b"HTTP/1.1 403")
        bad, status = websocket_answer(port, request=UPGRADE.replace("Version: 13", "Version: 7"))
        assert status.startswith(b"HTTP/1.1 4")
        for sock in (foreign, bad):
            sock.close()
        until_scraped(admin, lambda v: socketmq_open(v) == 1, "only the accepted WebSocket open")
        second, status = websocket_answer(port)
        assert status == b"HTTP/1.1 101 Switching Protocols"
        third, status = websocket_answer(port)
        assert status == b"HTTP/1.1 101 Switching Protocols"
        fourth, status = websocket_answer(port)
        assert status == b"HTTP/1.1 101 Switching Protocols"
        over, status = websocket_answer(port)  # a fifth from 127.0.0.1: over the per-address limit
        assert status == b"HTTP/1.1 503 Service Unavailable"
        closed_by_peer(over)
        until_scraped(admin, lambda v: socketmq_open(v) == 4, "the four accepted WebSockets")
        assert_serves_every_protocol(broker)  # from another address: not over its limit
        for sock in (accepted, second, third, fourth):
            sock.close()
        until_scraped(admin, lambda v: socketmq_open(v) == 0, "no socket.mq connection open")
    finally:
        broker.stop()


def greeting_listener() -> tuple[socket.socket, list[bytes], threading.Thread]:
    """A client's notification listener on loopback: greets each connection the draft's way
    and records the SUID line it gets."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(BOUND)
    suids: list[bytes] = []

    def serve() -> None:
        try:
            connection, _peer = server.accept()
        except OSError:
            return
        with connection:
            connection.settimeout(BOUND)
            connection.sendall(b"SMQP/1.0 Ready.\r\n")
            line = b""
            while not line.endswith(b"\n"):
                chunk = connection.recv(1)
                if not chunk:
                    return
                line += chunk
            suids.append(line.strip())
            connection.sendall(b"200 OK\r\n")
            connection.recv(1)  # until the broker closes it

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, suids, thread


def test_connectto_does_not_scan_the_brokers_host(tmp_path: Path) -> None:
    """A guest on the broker's host asks CONNECTTO for an open and for a closed loopback port:
    both are 403, the same line, and nothing is dialled; the port the operator's allow-list
    names is connected (positive control)."""
    listener, suids, thread = greeting_listener()
    open_port = listener.getsockname()[1]
    allowed_listener, allowed_suids, allowed_thread = greeting_listener()
    allowed_port = allowed_listener.getsockname()[1]
    broker, _admin = broker_with_admin(tmp_path, "--smqp-connectto-allow", f"127.0.0.1:{allowed_port}")
    try:
        guest = BlockingSMQP(broker.ports["smqp"])
        guest.login("guest", "scan")
        ports = (open_port, free_port())
        answers = [guest.command(f"CONNECTTO guest:scan {port}") for port in ports]
        assert [reply.code for reply in answers] == [403, 403]
        texts = {reply.lines[-1].replace(str(port), "PORT") for reply, port in zip(answers, ports)}
        assert len(texts) == 1, texts  # open or closed: the same answer
        assert guest.command("CONNECTTO guest:scan 127.0.0.1:22").code == 403
        assert_serves_every_protocol(broker)
        reply = guest.command(f"CONNECTTO guest:scan {allowed_port}")
        assert reply.code == 200, reply
        allowed_thread.join(0)
        assert len(allowed_suids) == 1
        assert suids == [] and thread.is_alive()  # the open port was never dialled
        guest.close()
    finally:
        broker.stop()
        listener.close()
        allowed_listener.close()


class WebSocket:
    """A blocking socket.mq WebSocket client: text frames out (masked), frames in."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
        self.sock.sendall(UPGRADE.format(port=port, extra="").encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            assert chunk, self.buffer
            self.buffer += chunk
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 "), head
        assert self.next()["type"] == "hello"

    def send(self, message: dict) -> None:
        payload = json.dumps(message).encode()
        mask = os.urandom(4)
        size = len(payload)
        header = bytes((0x81, 0x80 | size)) if size < 126 else struct.pack("!BBH", 0x81, 0x80 | 126, size)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the broker closed the WebSocket")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def next(self) -> dict:
        first, second = self._read(2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack("!H", self._read(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", self._read(8))[0]
        payload = self._read(size)
        return json.loads(payload.partition(b"\n")[0])

    def result(self, message: dict) -> dict:
        self.send(message)
        while True:
            answer = self.next()
            if answer.get("type") == "result" and answer.get("id") == message["id"]:
                return answer

    def close(self) -> None:
        self.sock.close()


def test_the_brokers_own_name_and_sys_topics_are_the_brokers_only(tmp_path: Path) -> None:
    """``sys:brokerd`` (and every ``sys:...``) is refused as a login of SSMP, SMQP and
    socket.mq and as an MCCHAT username; nobody but the broker publishes under ``~sys`` (any
    protocol, any case); the broker's own statistics still arrive, from ``sys:brokerd``."""
    broker, _admin = broker_with_admin(tmp_path, "--sys-interval", "0.2", accounts_extra={"sys": "syspw"})
    ports = broker.ports
    try:
        watcher = LineClient.connect(ports["ssmp"], timeout=BOUND)
        assert watcher.request("LOGIN watcher open") == b"200"
        assert watcher.request("SUBSCRIBE ~sys/brokerd/sessions/ssmp") == b"200"
        assert watcher.request("SUBSCRIBE news") == b"200"
        # SSMP: the name, and names that would read as the broker's elsewhere
        for name in ("sys:brokerd", "SYS:brokerd", "sys", "sys/x"):
            impostor = LineClient.connect(ports["ssmp"])
            assert impostor.request(f"LOGIN {name} open") == b"401 open password", name  # with --accounts
            assert impostor.closed()
        ssmp = LineClient.connect(ports["ssmp"])
        assert ssmp.request("LOGIN mallory open") == b"200"  # positive control
        for topic in ("~sys/brokerd/sessions/ssmp", "~SYS/brokerd/sessions/ssmp", "~sys"):
            assert ssmp.request(f"MCAST {topic} forged") == b"405", topic
        assert ssmp.request("MCAST ~system-news allowed") == b"200"  # ~sys only, not every ~
        # MCCHAT: a reserved username or a ~sys topic is dropped; the next message arrives
        mcchat = LineClient.connect(ports["mcchat"])
        mcchat.send(encode_msg(b"news", b"sys:brokerd", b"forged")
                    + encode_msg(b"~sys/brokerd/sessions/ssmp", b"mallory", b"forged")
                    + encode_msg(b"news", b"mallory", b"honest"))
        # SMQP: the account sys exists (an operator made it) and still may not log in
        smqp = BlockingSMQP(ports["smqp"])
        assert smqp.command("LOGIN sys:brokerd CLEAR/1.0").code == 200
        assert smqp.command("PASS sys syspw").code == 401
        alice = BlockingSMQP(ports["smqp"])
        alice.login("alice", "c1")  # positive control
        # socket.mq: open login as the broker's name
        ws = WebSocket(ports["socketmq"])
        assert ws.result({"type": "auth", "id": 1, "method": "open", "identity": "sys:brokerd"})["status"] == 401
        assert ws.result({"type": "auth", "id": 2, "method": "open", "identity": "app"})["status"] == 200
        assert ws.result({"type": "publish", "id": 3, "event": "~sys/brokerd/sessions/ssmp",
                          "data": "forged"})["status"] == 403
        assert ws.result({"type": "publish", "id": 4, "event": "news", "data": "from app"})["status"] == 200
        # what the watcher got: the honest MCCHAT message, the app's, and the broker's own
        # statistics (positive control), never a forged one
        news, statistics = [], []
        deadline = time.monotonic() + BOUND
        while len(news) < 2 or not statistics:
            assert time.monotonic() < deadline, (news, statistics)
            line = watcher.line()
            assert b"forged" not in line, line
            (news if b" news " in line else statistics).append(line)
        assert [line.split(b" ", 2)[2] for line in news] == [b"MCAST news honest", b"MCAST news from app"], news
        assert news[0].startswith(b"000 mcchat:") and news[1].startswith(b"000 socketmq:app ")
        assert statistics[0].startswith(b"000 sys:brokerd MCAST ~sys/brokerd/sessions/ssmp "), statistics
        assert_serves_every_protocol(broker)
        for client in (watcher, ssmp, mcchat, smqp, alice, ws):
            client.close()
    finally:
        broker.stop()


def test_the_access_list_names_the_sys_tree(tmp_path: Path) -> None:
    """A UAL entry on ``/~sys`` (once "bad topic name") is read and applied: an open SSMP
    login may not watch the statistics here (only the account ``ops`` may), and still uses
    other topics."""
    ual = tmp_path / "smqp.ual"
    ual.write_text("/~sys  *    -\n/~sys  ops  s\n/      *    ps\n")
    broker, _admin = broker_with_admin(tmp_path, "--ual", str(ual), "--sys-interval", "0.2")
    try:
        outsider = LineClient.connect(broker.ports["ssmp"])
        assert outsider.request("LOGIN outsider open") == b"200"
        assert outsider.request("SUBSCRIBE ~sys/brokerd/sessions/ssmp") == b"405"
        assert outsider.request("SUBSCRIBE news") == b"200"  # positive control
        assert outsider.request("MCAST ~sys/brokerd/sessions/ssmp forged") == b"405"
        assert_serves_every_protocol(broker)
        outsider.close()
    finally:
        broker.stop()


def notifications_until_closed(client: BlockingSMQP) -> tuple[int, list]:
    """Read what ``client`` was sent until the broker closes it: NOTIFY MESSAGEs, and replies."""
    from brokerd.protocols.smqp.events import Notify

    count, replies = 0, []
    while True:
        try:
            event = client._next()
        except (EOFError, ConnectionResetError):
            return count, replies
        if isinstance(event, Notify):
            count += event.kind == "MESSAGE"
        else:
            replies.append(event)


def test_silent_subscribers_cannot_hoard_a_one_topic(tmp_path: Path) -> None:
    """Two guests subscribe to a ONE topic with SET NOTIFY WINDOW 64 and never answer; a
    working subscriber still gets all 100 messages: all but the guests' share (at most
    --smqp-max-one-held, 8, each) while the guests are still connected, and the rest once the
    guests' retry timeout has closed them with 421."""
    retry = 15
    broker, _admin = broker_with_admin(tmp_path, "--durable-retry-timeout", str(retry))
    ports = broker.ports
    try:
        alice = BlockingSMQP(ports["smqp"], timeout=BOUND)
        alice.login("alice", "pub")
        assert alice.command("CREATE TOPIC /jobs").code == 200
        assert alice.command("SET TOPIC DELIVERY /jobs ONE").code == 200
        guests = []
        for channel in ("g1", "g2"):
            guest = BlockingSMQP(ports["smqp"], timeout=BOUND)
            guest.login("guest", channel)
            assert guest.command("SUBSCRIBE MESSAGE /jobs").code == 200
            assert guest.command("SET NOTIFY WINDOW 64").code == 200
            guests.append(guest)
        worker = BlockingSMQP(ports["smqp"], timeout=BOUND)
        worker.login("bob", "worker")
        assert worker.command("SUBSCRIBE MESSAGE /jobs").code == 200
        publishes = [alice.publish_bytes("/jobs", f"J{n}", f"job {n}".encode()) for n in range(100)]
        alice.send(b"".join(publishes))
        assert [alice.reply().code for _ in publishes] == [200] * 100
        done: set[bytes] = set()

        def work(until: int) -> None:
            while len(done) < until:
                notify = worker.notify()
                done.add(notify.body.sections[0].data)
                worker.send(b"310 ACK\r\n")
                assert worker.reply().code == 310

        work(100 - 2 * 8)
        # the guests hold their share and are still connected: what the worker got did not
        # wait for their retry timeout
        for guest in guests:
            assert guest.command("NOOP").code == 200
        assert_serves_every_protocol(broker)
        work(100)  # the guests' share, once their retry timeout closed them
        assert done == {f"job {n}".encode() for n in range(100)}
        for guest in guests:
            held, replies = notifications_until_closed(guest)
            assert 0 < held <= 8, held  # each held its share, no more
            assert [reply.code for reply in replies][-1:] == [421], replies
        assert_serves_every_protocol(broker)
        for client in (alice, worker, *guests):
            client.close()
    finally:
        broker.stop()
