"""deploy/docker-compose.yml: read (tests/deploy/compose.py), checked for what a cluster of it
needs, and run without Docker: its access-list step and its three brokerd nodes are started
with their own commands (the image's ENTRYPOINT and each service's ``command``), paths and
ports moved to the test, against the test's own redis-server and PostgreSQL.  The nodes form
one cluster: an account added with brokerd-ctl on one node logs in on the others, a message
published on one reaches a subscriber on another, a client without credentials is refused,
nothing is warned about, and the dashboard's cluster metrics are on a node's /metrics."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import threads
from twisted.internet.defer import TimeoutError as DeferredTimeout

from brokerd.protocols.mqtt.client import MQTTConnectError
from brokerd.protocols.mqtt.client import connect as mqtt_connect
from tests.admin.support import http
from tests.deploy.compose import Unsupported, load, parse
from tests.deploy.dashboard import cluster_only, expressions, missing
from tests.deploy.support import DEPLOY, ETC, STATE, Installed, image_command, install, start
from tests.support import processes
from tests.support.broker import LineClient
from tests.support.live import TIMEOUT, Inbox, reactor
from tests.support.postgres import PostgresServer
from tests.support.redis import RedisServer, cluster_secret

pytestmark = pytest.mark.slow

COMPOSE = DEPLOY / "docker-compose.yml"
NODES = ("node1", "node2", "node3")
SHARED = "/var/lib/brokerd-shared"
SECRETS = "/run/secrets/"
PASSWORD = "alice-cluster-pw"


def compose() -> dict[str, Any]:
    return load(COMPOSE)


def exposed_ports() -> set[int]:
    found = re.search(r"^EXPOSE (.*)$", (DEPLOY / "Dockerfile").read_text(), re.M)
    assert found
    return {int(port) for port in found.group(1).split()}


def test_the_reader_reads_its_subset_and_refuses_the_rest() -> None:
    text = 'a:\n  b: ["x y", 2, {k: v}]\n  # note\n  c:\n    d: redis:7\n  e:\nf: {g: [h]}\n'
    assert parse(text) == {"a": {"b": ["x y", 2, {"k": "v"}], "c": {"d": "redis:7"}, "e": None}, "f": {"g": ["h"]}}
    for outside in ("a: &anchor 1\n", "a:\n  - item\n", "a: 'single'\n", "a: 1\na: 2\n", "a: [1\n"):
        with pytest.raises(Unsupported):
            parse(outside)


def test_the_compose_file_describes_a_cluster_of_three() -> None:
    document = compose()
    services = document["services"]
    assert set(services) == {"redis", "postgres", "access-list", *NODES}
    assert services["redis"]["image"].startswith("redis:") and services["postgres"]["image"].startswith("postgres:")
    assert "ports" not in services["redis"] and "ports" not in services["postgres"]  # the nodes' only
    build = services["access-list"]["build"]
    assert (build["context"], build["dockerfile"]) == ("..", "deploy/Dockerfile")
    names, data_volumes, host_ports = set(), set(), []
    for node in NODES:
        service = services[node]
        command = service["command"]
        assert (service["image"], service["build"]) == (services["access-list"]["image"], build)  # built, not pulled
        assert command[:2] == ["--config", f"{ETC}/brokerd.toml"]
        options = dict(zip(command[2::2], command[3::2]))
        names.add(options["--node-name"])
        assert options["--cluster"] == "redis://redis:6379" and options["--store"].startswith("postgresql://")
        assert options["--accounts"].startswith(SHARED) and options["--ual"].startswith(SHARED)
        used = {value.removeprefix(SECRETS) for value in options.values() if value.startswith(SECRETS)}
        assert used == set(service["secrets"]) and used <= set(document["secrets"]), node
        volumes = dict(volume.split(":")[::-1] for volume in service["volumes"])
        assert volumes[SHARED] == "shared"
        data_volumes.add(volumes[STATE])
        assert {int(port.split(":")[1]) for port in service["ports"]} == exposed_ports()
        host_ports += [port.split(":")[0] for port in service["ports"]]
        assert service["depends_on"] == {"redis": {"condition": "service_healthy"},
                                         "postgres": {"condition": "service_healthy"},
                                         "access-list": {"condition": "service_completed_successfully"}}
    assert len(names) == len(data_volumes) == 3 and len(set(host_ports)) == len(host_ports)
    assert set(document["volumes"]) == {"postgres", "shared", *data_volumes}
    for service in ("redis", "postgres"):
        assert "healthcheck" in services[service]


class Cluster:
    """The compose file's services run on this machine: paths and hosts mapped to the test's."""

    def __init__(self, root: Path, redis: RedisServer, store_url: str, secrets: Path) -> None:
        self.root = root
        self.shared = root / "shared"
        self.shared.mkdir(mode=0o700)
        self.hosts = {"redis://redis:6379": redis.url, "postgresql://brokerd@postgres:5432/brokerd": store_url}
        self.secrets = secrets
        self.nodes: dict[str, Installed] = {}
        self.image: Installed | None = None
        """The image's files (its /var/lib/brokerd), for the access-list step."""

    def mapped(self, argument: str, installed: Installed) -> str:
        argument = self.hosts.get(argument, argument)
        if argument.startswith(SECRETS):
            return str(self.secrets / argument.removeprefix(SECRETS))
        return (argument.replace(SHARED, str(self.shared)).replace(f"{ETC}/brokerd.toml", str(installed.config))
                .replace(STATE, str(installed.state)))

    def run_access_list_step(self, service: dict[str, Any]) -> subprocess.CompletedProcess:
        if self.image is None:
            self.image = install(self.root / "access-list-image")
        command = [self.mapped(part, self.image) for part in service["entrypoint"]]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    def start_node(self, name: str, service: dict[str, Any]) -> Any:
        installed = install(self.root / name)  # each container has the config's ports to itself
        self.nodes[name] = installed
        command = image_command(installed.config)
        command += [self.mapped(part, installed) for part in service["command"][2:]]
        return start(installed, command, self.root / f"{name}.log")


@pytest.fixture
def cluster(tmp_path: Path, postgres_server: PostgresServer) -> Any:
    started = processes.mark()  # what the session runs (a private Tor network) is not this test's
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for name, value in (("admin-token", b"cluster-admin-token"), ("redis-password", b"redis-pw-for-the-test"),
                        ("store-password", b"unused-with-trust-auth")):
        cluster_secret(secrets / name, value)
    cluster_secret(secrets / "cluster-secret")
    redis = RedisServer(tmp_path / "redis", "--requirepass", "redis-pw-for-the-test").start()
    running = Cluster(tmp_path, redis, postgres_server.create_database(), secrets)
    try:
        yield running
    finally:
        processes.stop_started_since(started)
        redis.stop()


def warnings(log: Path) -> list[str]:
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any("listening on" in event["message"] for event in events)  # the log is there and read
    return [event["message"] for event in events  # start-up's warnings (refused logins are warnings too)
            if (event["level"] == "warn" and event["source"] == "brokerd.tap") or event["level"] in ("error", "critical")]


def ssmp_publish(port: int, topic: str, text: str) -> None:
    client = LineClient.connect(port)
    try:
        assert client.request(f"LOGIN alice password {PASSWORD}").startswith(b"200")
        assert client.request(f"MCAST {topic} {text}").startswith(b"200")
    finally:
        client.close()


@pytest_twisted.ensureDeferred
async def test_the_compose_services_run_as_one_cluster(cluster: Cluster) -> None:
    services = compose()["services"]
    # the access-list step fills the shared volume once, and never over a list already there
    done = await threads.deferToThread(cluster.run_access_list_step, services["access-list"])
    assert done.returncode == 0, done
    shipped = (DEPLOY / "brokerd.ual").read_text()
    assert (cluster.shared / "smqp.ual").read_text() == shipped
    with open(cluster.shared / "smqp.ual", "a") as edited:
        edited.write("/sensors  @accounts  ps\n")
    again = await threads.deferToThread(cluster.run_access_list_step, services["access-list"])
    assert again.returncode == 0 and (cluster.shared / "smqp.ual").read_text() == shipped + "/sensors  @accounts  ps\n"
    for node in NODES:
        await threads.deferToThread(cluster.start_node, node, services[node])
    one, two, three = (cluster.nodes[node] for node in NODES)
    token = ["--admin", f"http://127.0.0.1:{one.ports['admin']}", "--token-file", str(cluster.secrets / "admin-token")]
    added = await threads.deferToThread(
        subprocess.run, [*image_command(one.config)[:1], "-m", "brokerd.cli.ctl", *token, "accounts", "add", "alice"],
        input=PASSWORD + "\n", capture_output=True, text=True, timeout=60, env=processes.repo_env())
    assert added.returncode == 0, added
    # node 2: no credentials refused; the account added on node 1 logs in
    mqtt = f"tcp:127.0.0.1:{two.ports['mqtt']}"
    with pytest.raises(MQTTConnectError):
        await mqtt_connect(reactor(), mqtt, client_id="nobody")
    inbox = Inbox()
    subscriber = await mqtt_connect(reactor(), mqtt, client_id="alice-2", username="alice", password=PASSWORD.encode(),
                                    on_message=lambda packet: inbox.on_message(packet.topic, packet.payload))
    try:
        assert list((await subscriber.subscribe([("sensors/#", 0)])).reason_codes) == [0]
        # node 3 publishes until node 2 has its subscription from Redis (bounded)
        for attempt in range(30):
            await threads.deferToThread(ssmp_publish, three.ports["ssmp"], "sensors/t1", f"reading-{attempt}")
            try:
                await inbox.count(1).addTimeout(1, reactor())
                break
            except DeferredTimeout:
                continue
        assert inbox.messages and inbox.messages[0][0] == "sensors/t1", inbox.messages
        assert inbox.messages[0][1].startswith(b"reading-")
    finally:
        subscriber.abort()
    metrics = await threads.deferToThread(http, one.ports["admin"], "GET", "/metrics", "cluster-admin-token")
    assert metrics.status == 200 and "brokerd_cluster_nodes 3.0" in metrics.body.decode()
    cluster_queries = [expression for expression in expressions() if cluster_only(expression)]
    assert len(cluster_queries) >= 8 and missing(cluster_queries, metrics.body.decode()) == []  # the dashboard's cluster row
    for node in NODES:
        assert warnings(cluster.root / f"{node}.log") == [], node
