"""The front ends as typed plugins: ``getPlugins(IFrontEnd)`` finds the five brokerd.tap builds
with, each builds over a :class:`Services` and answers its protocol on a real loopback socket;
no front end is found by module path, and the composition root has no string-keyed resources."""
from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from dataclasses import FrozenInstanceError, fields
from typing import Any, get_args, get_origin, get_type_hints

import pytest
import pytest_twisted
from twisted.internet import endpoints
from twisted.internet.protocol import Factory, Protocol
from twisted.plugin import IPlugin, getPlugins
from zope.interface.verify import verifyObject

from brokerd.config import PROTOCOLS, Settings
from brokerd.frontend import FrontEndPlugin, IFrontEnd, Services, build_front_end
from brokerd.frontends import FRONT_ENDS
from brokerd.protocols.mcchat.server import INFO_PACKET
from brokerd.protocols.smqp.codec import encode_greeting
from brokerd.protocols.smqp.factory import SMQPFrontEnd
from brokerd.protocols.smqp.server import SERVER_IDENT
from brokerd.runtime import Runtime
from brokerd.store.memory import MemoryStore
from tests.support.broker import REPO, repo_env
from tests.support.live import LOOPBACK, Waiter, reactor
from tests.support.sources import brokerd_modules
from tests.support.services import services_for

MQTT_CONNECT = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c"
"""MQTT 3.1.1 CONNECT: clean session, keep-alive 60 s, client id ``c``, no user name."""

EXCHANGES: dict[str, tuple[bytes, bytes]] = {
    "ssmp": (b"LOGIN alice open\n", b"200\n"),
    "mcchat": (b"", INFO_PACKET),  # the server speaks first: INFO, version 1
    "smqp": (b"", encode_greeting(SERVER_IDENT)),
    "socketmq": (b"GET /socket.mq/nothing-here HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"HTTP/1.1 404 "),
    "mqtt": (MQTT_CONNECT, b"\x20\x02\x00\x00"),  # CONNACK, no session present, accepted
}
"""What a client sends first, and what each front end answers (its first bytes)."""

DYNAMIC_IMPORTS = {"import_module", "__import__", "namedAny", "namedModule", "namedObject", "namedClass"}


def test_getplugins_finds_the_five_front_ends_the_tap_builds_with():
    found = [plugin for plugin in getPlugins(IFrontEnd) if isinstance(plugin, FrontEndPlugin)]
    assert sorted(plugin.name for plugin in found) == sorted(PROTOCOLS)
    assert {id(plugin) for plugin in found} == {id(plugin) for plugin in FRONT_ENDS}
    assert [plugin.name for plugin in FRONT_ENDS] == list(PROTOCOLS)
    for plugin in FRONT_ENDS:
        assert IPlugin.providedBy(plugin)
        assert verifyObject(IFrontEnd, plugin)


def test_each_front_end_names_its_own_settings():
    for plugin in FRONT_ENDS:
        assert all(option.startswith(f"{plugin.name}-") for option in plugin.settings)
    by_name = {plugin.name: plugin for plugin in FRONT_ENDS}
    assert "smqp-guest" in by_name["smqp"].settings and "mqtt-max-keep-alive" in by_name["mqtt"].settings
    assert "smqp-guest" not in by_name["mqtt"].settings


@pytest.mark.parametrize("name", PROTOCOLS)
@pytest_twisted.ensureDeferred
async def test_each_front_end_builds_over_services_and_answers_on_a_socket(name: str, tmp_path) -> None:
    plugin = next(plugin for plugin in FRONT_ENDS if plugin.name == name)
    settings = Settings(data_dir=tmp_path, open_login=True)
    services = services_for(settings, reactor(), store=MemoryStore())
    factory = build_front_end(plugin, services)
    if name == "smqp":
        await factory.started  # greeted once the durable service has read the store
    port = await endpoints.serverFromString(reactor(), LOOPBACK).listen(factory)
    received = Waiter()
    client = await endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port.getHost().port).connect(
        Factory.forProtocol(lambda: _Raw(received)))
    try:
        request, answer = EXCHANGES[name]
        client.transport.write(request)
        data = await received.until(lambda items: len(b"".join(items)) >= len(answer))
        assert b"".join(data).startswith(answer)
    finally:
        client.transport.abortConnection()
        await port.stopListening()
        if services.store is not None:
            await services.store.close()


def test_mqtt_mounts_its_websocket_where_socketmq_serves_them(tmp_path) -> None:
    services = services_for(Settings(data_dir=tmp_path), reactor())
    by_name = {plugin.name: plugin for plugin in FRONT_ENDS}
    site = by_name["socketmq"].build(services)
    assert b"mqtt" not in site.mounts
    by_name["mqtt"].build(services)
    assert b"mqtt" in site.mounts  # the registry socket.mq reads per request
    assert list(services.websocket_mounts) == [b"mqtt"]


def test_no_front_end_is_found_by_module_path():
    """Every edge from the composition root to a front end is an import statement, which
    import-linter sees: brokerd imports no module by a name computed at run time (but for
    the check that an optional extra is installed)."""
    dynamic = []
    for path, tree in brokerd_modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if called in DYNAMIC_IMPORTS:
                    dynamic.append((path, called))
    assert dynamic == [("brokerd/pipeline/cli.py", "__import__")]
    tree = ast.parse((REPO / "brokerd" / "frontends.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {f"brokerd.protocols.{name}.plugin" for name in PROTOCOLS} <= imported


@pytest.mark.parametrize("kind", [Runtime, Services])
def test_the_composition_root_has_no_string_keyed_resources(kind: type) -> None:
    assert not hasattr(kind, "resources")
    assert "resources" not in {f.name for f in fields(kind)}
    for name, hint in get_type_hints(kind).items():
        if get_origin(hint) is dict:
            assert get_args(hint)[1] is not Any, f"{kind.__name__}.{name} holds anything by a key"


def test_services_are_frozen(tmp_path) -> None:
    services = services_for(Settings(data_dir=tmp_path), reactor())
    with pytest.raises(FrozenInstanceError):
        services.store = MemoryStore()  # type: ignore[misc]


class _Raw(Protocol):
    def __init__(self, received: Waiter) -> None:
        self.received = received

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
        self.received(data)


def test_smqp_constructs_nothing_the_core_owns(tmp_path) -> None:
    """The Portal, the access list and the durable service are the services', and the factory
    has no way to make its own: each is a required argument."""
    services = services_for(Settings(data_dir=tmp_path), reactor(), store=MemoryStore())
    factory = next(plugin for plugin in FRONT_ENDS if plugin.name == "smqp").build(services)
    assert factory.portal is services.accounts_portal
    assert factory.access_list is services.access_list and factory.checker is services.accounts
    assert factory.durable is services.durable is services.broker.durable
    parameters = inspect.signature(SMQPFrontEnd.__init__).parameters
    for name in ("portal", "access_list", "durable"):
        assert parameters[name].default is inspect.Parameter.empty
    assert not {"ual", "ual_file", "throttle"} & set(parameters)


def test_importing_the_tap_and_the_plugins_installs_no_reactor() -> None:
    """twistd imports the plugins (and ``twistd brokerd`` the tap) before it installs the
    reactor ``--reactor`` names: none of the front ends' modules may import the global one."""
    check = ("import sys\nimport brokerd.tap\nfrom twisted.plugins import brokerd_frontends\n"
             "print('twisted.internet.reactor' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO, env=repo_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "False\n"
