"""``onion:PORT[:tls=yes]``: a listener published as a Tor onion service (v3).

The factory listens on an ephemeral port of 127.0.0.1 (plain TCP, or brokerd's TLS with the
``tls:`` listeners' certificate and client-certificate check), and Tor is asked (ADD_ONION)
to publish a service whose virtual port PORT leads there.  The service's key comes from
DATA_DIR/onion/PROTOCOL-PORT.key, made on first start, so the address stays the same across
restarts.  With --onion-client-auth only the clients whose keys it lists can reach the
service (v3 client authorization: the others cannot even read its descriptor).

Listening succeeds once Tor has uploaded the service's descriptor to at least one HSDir:
from then on clients can reach it.  Stopping removes the service from Tor (DEL_ONION).
Every connection arrives from 127.0.0.1: per-address limits count all of Tor's clients as
one address (docs/tor.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import SSL4ServerEndpoint, TCP4ServerEndpoint
from twisted.internet.interfaces import IAddress, IListeningPort, IProtocolFactory, IStreamServerEndpoint
from twisted.logger import Logger
from zope.interface import implementer

from brokerd.auth.tls import ServerTLS
from brokerd.errors import ConfigurationError
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols.onion.control import OnionStatus, TorControl, TorControlConnection
from brokerd.protocols.onion.keys import authorized_clients, keys_dir, read_service_key, write_private

_log = Logger()

_YES = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}


@implementer(IAddress)
@dataclass(frozen=True)
class OnionAddress:
    """Where an onion listener is reached: ``host`` (the .onion name) and ``port``."""

    host: str
    port: int
    type: str = "onion"


def parse_onion(description: str) -> tuple[int, bool]:
    """(virtual port, over TLS) of ``onion:PORT[:tls=yes]``; ConfigurationError otherwise."""
    fields = description.split(":")
    usage = "expected onion:PORT[:tls=yes] (and --tor-control or --tor-config for the tor)"
    if fields[0] != "onion" or len(fields) < 2 or not fields[1].isdigit() or not 0 < int(fields[1]) < 65536:
        raise ConfigurationError(f"{description}: {usage}")
    tls = False
    for field in fields[2:]:
        name, equals, value = field.partition("=")
        if name != "tls" or value.lower() not in _YES:
            raise ConfigurationError(f"{description}: unknown option {field!r}: {usage}")
        tls = _YES[value.lower()]
    return int(fields[1]), tls


@implementer(IStreamServerEndpoint)
class OnionServerEndpoint:
    """One onion listener (see the module docstring); ``control`` is the broker's TorControl."""

    def __init__(self, reactor: IBrokerReactor, description: str, name: str, control: TorControl,
                 tls: ServerTLS | None = None) -> None:
        self.reactor = reactor
        self.port, self.tls = parse_onion(description)
        if self.tls and tls is None:
            raise ConfigurationError(f"{description}: tls=yes needs --tls-cert and --tls-key")
        self.name = f"{name}-{self.port}"
        self.control = control
        self.server_tls = tls

    def _local(self) -> IStreamServerEndpoint:
        if self.server_tls is not None and self.tls:
            return SSL4ServerEndpoint(self.reactor, 0, self.server_tls.context_factory, interface="127.0.0.1")
        return TCP4ServerEndpoint(self.reactor, 0, interface="127.0.0.1")

    def listen(self, factory: IProtocolFactory) -> Deferred[IListeningPort]:
        return Deferred.fromCoroutine(self._publish(factory))

    async def _publish(self, factory: IProtocolFactory) -> IListeningPort:
        settings = self.control.settings
        directory = keys_dir(settings.data_dir)
        key_path = directory / f"{self.name}.key"
        key = read_service_key(key_path)
        clients = authorized_clients(settings.onion_client_auth) if settings.onion_client_auth else {}
        local = await self._local().listen(factory)
        loopback = local.getHost()
        assert isinstance(loopback, IPv4Address)  # the TCP4 and SSL4 endpoints of _local() listen on IPv4
        try:
            tor = await self.control.tor()
            service_id, new_key = await publish(tor.protocol, self.port, loopback.port, key, clients,
                                                self.reactor, settings.tor_timeout)
        except BaseException:
            local.stopListening()
            raise
        if new_key is not None:
            write_private(key_path, new_key)
        address = f"{service_id}.onion"
        (directory / f"{self.name}.hostname").write_text(address + "\n")
        _log.info("Onion service {address}:{port} published (key {key}{auth})", address=address, port=self.port,
                  key=str(key_path), auth=f", {len(clients)} authorized clients" if clients else "")
        port = OnionPort(OnionAddress(address, self.port), local, tor.protocol, service_id, self.tls)
        self.control.published.append(port)
        return port


def publish(protocol: TorControlConnection, virtual_port: int, local_port: int, key: str | None,
            clients: dict[str, str], reactor: IBrokerReactor, timeout: float) -> Deferred[tuple[str, str | None]]:
    """ADD_ONION, then wait for the first descriptor upload: Deferred[(service id, the new
    key or None when ``key`` was given)]."""
    uploaded: Deferred[None] = Deferred()
    service: dict[str, str] = {}

    def descriptor_event(text: str) -> None:
        words = text.split()
        if len(words) > 1 and words[0] == "UPLOADED" and words[1] == service.get("id") and not uploaded.called:
            uploaded.callback(None)

    command = f"ADD_ONION {key or 'NEW:ED25519-V3'} Port={virtual_port},127.0.0.1:{local_port}"
    if clients:
        command += " Flags=V3Auth" + "".join(f" ClientAuthV3={public}" for public in clients.values())

    async def run() -> tuple[str, str | None]:
        await protocol.add_event_listener("HS_DESC", descriptor_event)
        try:
            answer = await protocol.queue_command(command)
            for line in answer.splitlines():
                name, _, value = line.partition("=")
                service[name.strip()] = value.strip()
            service["id"] = service.get("ServiceID", "")
            await uploaded.addTimeout(timeout, reactor)
        finally:
            await protocol.remove_event_listener("HS_DESC", descriptor_event)
        return service["id"], service.get("PrivateKey")

    return Deferred.fromCoroutine(run())


@implementer(IListeningPort)
class OnionPort:
    """A published onion service over its loopback port."""

    def __init__(self, address: OnionAddress, local: IListeningPort, protocol: TorControlConnection, service_id: str,
                 tls: bool) -> None:
        self.address = address
        self.local = local
        self.protocol = protocol
        self.service_id = service_id
        self.tls = tls

    def startListening(self) -> None:
        """Already listening (the endpoint started it)."""

    def stopListening(self) -> Deferred[None]:
        return Deferred.fromCoroutine(self._withdraw())

    async def _withdraw(self) -> None:
        try:
            await self.protocol.queue_command(f"DEL_ONION {self.service_id}")
        except Exception as exc:  # the control connection went first: the service went with it
            _log.debug("DEL_ONION {id}: {reason}", id=self.service_id, reason=str(exc))
        await maybeDeferred(self.local.stopListening)

    def getHost(self) -> OnionAddress:
        return self.address

    def status(self) -> OnionStatus:
        """What the admin API shows of this service."""
        return {"address": self.address.host, "port": self.address.port, "tls": self.tls}


def onion_listen_endpoint(reactor: IBrokerReactor, description: str, option: str, control: TorControl,
                          tls: ServerTLS | None) -> OnionServerEndpoint:
    """The endpoint of an ``onion:`` listener of ``--OPTION``; ConfigurationError names it."""
    try:
        return OnionServerEndpoint(reactor, description, option, control, tls)
    except ConfigurationError as exc:
        raise ConfigurationError(f"--{option} {exc}") from None


__all__ = ["OnionAddress", "OnionServerEndpoint", "onion_listen_endpoint", "parse_onion"]
