"""The Redis engine: nodes share routing through Redis sharded pub/sub.

Each node keeps two connections to each Redis shard, both non-blocking (txredisapi's command
builder on the reactor): one publishes, one subscribes.  A plain server is one shard; on a
Redis Cluster every master is one, and each channel's commands go to the master owning its
slot (brokerd.cluster.shards, which also follows MOVED redirections and resharding).  A run of
messages a local publisher sends is routed to the local members at once and queued here; once
per reactor turn every queued run is encoded (once per node, whatever the recipients) and
written as one pipelined batch of ``SPUBLISH brokerd:t:<topic> <envelope>`` per shard.  The
node subscribes (``SSUBSCRIBE``) only to the topics it has members of, and follows the
Broker's topic listeners as topics come and go.  A node skips its own echo (the envelope names
its sender), so local members get each message once.  Sharded pub/sub hashes the channel to
one shard, so order per topic holds on a Redis Cluster too.  Nothing is stored in Redis keys:
the directory travels on channels as well.

Redis is not trusted: everything the flush writes is sealed (brokerd.cluster.seal, under the
secret of ``--cluster-secret-file``), and :meth:`RedisEngine.received` opens what arrives
before anything decodes it; what does not open (forged, replayed, stale, this node's own
echo) stops there.

When Redis (or a shard of it) is unreachable the node keeps serving its own clients: runs for
other nodes through that shard are dropped and counted, one line is logged when a connection
goes and one when all are back, and the engine reconnects with a capped exponential backoff
and subscribes again.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from brokerd.cluster import directory as control
from brokerd.cluster import envelope, frames, seal, sharing
from brokerd.cluster.address import RedisAddress
from brokerd.cluster.connection import CHANNEL_PREFIX, RespReply, channel
from brokerd.cluster.damaged import DamagedLog
from brokerd.cluster.localbroker import LocalBroker
from brokerd.cluster.shards import Shards
from brokerd.cluster.stats import ClusterStats
from brokerd.config import Settings
from brokerd.core.message import BROADCAST, MULTICAST, UNICAST, Message
from brokerd.core.principal import Principal
from brokerd.core.publication import RemoteBroadcast, RemoteRun, RemoteUnicast
from brokerd.interfaces import IBrokerReactor, IEngine, ISubscriber
from brokerd.jsontypes import JSONValue

_log = Logger()

CONTROL_CHANNEL = b"brokerd:c"
"""Where nodes announce logins, topic members, heartbeats (brokerd.cluster.directory)."""
NODE_PREFIX = b"brokerd:n:"
"""A node's own channel (the prefix, then its instance id in hex): unicasts to its sessions."""
FILTER_CHANNEL = b"brokerd:f"
"""Runs for the nodes with topic filters (MQTT's ``+``/``#``): a publishing node sends a run
here too when another node announced a filter matching its topic; a node follows it while it
has a filter subscription, and delivers from it only topics it does not follow (those arrive on
their own channel, and the core's routing adds the filters' members)."""


class _QueuedRun:
    """One topic's runs queued in one reactor turn, and their rendered bytes by wire format
    (None once one of the runs came without: the other nodes render that topic's whole)."""

    __slots__ = ("messages", "sections")

    def __init__(self, messages: list[Message], sections: dict[str, list[bytes]] | None) -> None:
        self.messages = messages
        self.sections = sections


@implementer(IEngine)
class RedisEngine:
    """Routes between the nodes of a cluster through one Redis server (or Redis Cluster
    shard set); ``max_backlog`` bounds the bytes published and not yet acknowledged by Redis
    (runs beyond are dropped and counted)."""

    shared = True

    def __init__(
        self,
        address: RedisAddress,
        reactor: IBrokerReactor,
        node_name: str,
        *,
        secrets: Sequence[bytes],
        secret_file: Path | str | None = None,
        password: str | None = None,
        tls_ca: Path | None = None,
        max_backlog: int = Settings.cluster_max_backlog,
        heartbeat: float = Settings.cluster_heartbeat,
        node_timeout: float = Settings.cluster_node_timeout,
        clock_skew: float = Settings.cluster_clock_skew,
        max_control: int = Settings.cluster_max_control,
        max_shared_pending: int = Settings.cluster_max_shared_pending,
    ) -> None:
        self.address = address
        self.reactor = reactor
        self.node_name = node_name
        self.password = address.password if address.password is not None else password
        self.username = address.username
        self.tls_ca = tls_ca
        self.max_backlog = max_backlog
        self.instance = os.urandom(8)
        """This process's id in the envelopes it sends: how it recognises its own echo."""
        self.origin = self.instance.hex()
        self.node_channel = NODE_PREFIX + self.origin.encode()
        self.heartbeat = heartbeat
        self.max_control = max_control
        """Bytes of one control message at most, sent or received (a longer one is refused)."""
        self.node_timeout = node_timeout
        self.sealer = seal.Sealer(secrets, self.instance, node_timeout, skew=clock_skew)
        """Seals what this node writes to Redis and opens what it reads (brokerd.cluster.seal)."""
        self.sealer.log = self._rejections
        self.secret_file = secret_file
        """Read again at each heartbeat; changed lines are installed (key rotation, docs/cluster.md)."""
        self._secret_reading = False
        self._secret_error: str | None = None
        self._secrets_installed = list(secrets)
        self.secret_listeners: list[Callable[[list[str]], None]] = []
        """Called with the key ids after the secret file was read again and installed."""
        self.directory = control.Directory(self._remote_presence, self._remote_address,
                                           lambda: self.broker.remote_topics_changed())
        self._raw: list[tuple[bytes, bytes]] = []
        self._durable_tree = False
        self._durable_subscribers: set[str] = set()
        self._durable_pending: set[str] = set()
        """This turn's durable changes, sent as one DURABLE control message at the flush."""
        """Encoded control messages and unicasts waiting for this turn's flush, in order."""
        self._beat: LoopingCall | None = None
        self._last_beat = 0.0
        self._expiry: IDelayedCall | None = None
        """The call that forgets the quietest other node at its deadline (None: no other node)."""
        self._watching = True
        """Whether other nodes' silences are watched (until the engine stops)."""
        self._logins: dict[tuple[str, bytes], float] = {}
        """This node's addresses and the wall-clock time each was taken: of two logins with
        one address on two nodes, the later one (then the higher node id) stays."""
        self.stats = ClusterStats()
        self.damaged = DamagedLog(reactor)
        self._broker: LocalBroker | None = None
        self._queued: dict[bytes, _QueuedRun] = {}
        """This turn's runs by topic."""
        self._flush_call: IDelayedCall | None = None
        self._backlog = 0
        self._down = False
        self.shards: Shards | None = None
        self._ready: list[Deferred] = []
        self._services: dict[str, Callable[[str, bytes], None]] = {}
        """Front ends' handlers of node messages (:meth:`serve`), by service name."""
        self.node_listeners: list[Any] = []
        self.sharing = sharing.SharedPlacement(self, max_shared_pending)
        """Shared groups across the nodes: the node of each run's group member (brokerd.cluster.sharing)."""

    @property
    def broker(self) -> LocalBroker:
        """The node's Broker, from :meth:`start` on."""
        if self._broker is None:
            raise RuntimeError("the engine is not started")
        return self._broker

    @broker.setter
    def broker(self, broker: LocalBroker) -> None:
        self._broker = broker

    # ------------------------------------------------------------------ IEngine

    def start(self, broker: LocalBroker) -> None:
        self.broker = broker
        broker.topic_listeners.append(self._topic_changed)
        self.shards = Shards(self, self.address, self.tls_ca)
        self.shards.essential = {CONTROL_CHANNEL, self.node_channel}
        for name in (CONTROL_CHANNEL, self.node_channel, *map(channel, broker.topics.active())):
            self.shards.follow(name, True)
        if broker.filtered.counts:
            self.shards.follow(FILTER_CHANNEL, True)
        self.shards.start()
        self._beat = LoopingCall(self._heartbeat)
        self._beat.clock = self.reactor
        self._last_beat = self.reactor.seconds()
        self._beat.start(self.heartbeat, now=False)

    def stop(self) -> Deferred:
        if self._beat is not None and self._beat.running:
            self._beat.stop()
        if self._expiry is not None and self._expiry.active():
            self._expiry.cancel()
        self._expiry = None
        self._watching = False
        self._announce(control.BYE)
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush()  # what the sessions' logouts announced, and the goodbye
        if self._broker is not None and self._topic_changed in self._broker.topic_listeners:
            self._broker.topic_listeners.remove(self._topic_changed)
        return self.shards.stop() if self.shards is not None else DeferredList([])

    def forward(self, messages: Sequence[Message], rendered: dict[str, bytes] | None = None) -> None:
        """Queue a run for the other nodes, with its ``rendered`` bytes by portable wire
        format; it leaves at the end of this reactor turn.  Runs of one topic queued in one
        turn travel as one: their rendered bytes are joined per format, and a format one of
        them lacks is not sent for the whole (the other nodes render it)."""
        if not self._online():
            self.stats.dropped_unreachable += len(messages)
            return
        topic = messages[0].target
        if topic is None:
            raise ValueError("a forwarded run has no topic (a broadcast goes through broadcast())")
        queued = self._queued.get(topic)
        if queued is None:
            self._queued[topic] = _QueuedRun(
                list(messages), {name: [data] for name, data in rendered.items()} if rendered else None)
        else:
            queued.messages.extend(messages)
            sections = queued.sections
            if sections is not None:
                if not rendered:
                    queued.sections = None
                else:
                    for name in [name for name in sections if name not in rendered]:
                        del sections[name]
                    for name, chunks in sections.items():
                        chunks.append(rendered[name])
        self._schedule()

    def _schedule(self) -> None:
        if self._flush_call is None:
            self._flush_call = self.reactor.callLater(0, self._flush)

    def unicast(self, message: Message, namespace: str) -> bool:
        """Send a unicast to the node whose session has the address; False when none has."""
        if message.target is None:
            return False
        origin = self.directory.owner.get((namespace, message.target))
        if origin is None:
            return False
        if not self._online():
            self.stats.dropped_unreachable += 1
            return True
        self._raw.append((NODE_PREFIX + origin.encode(), frames.unicast(self.instance, namespace, message)))
        self._schedule()
        return True

    def broadcast(self, message: Message, topics: Sequence[bytes]) -> None:
        """Send a broadcast once to each other node with members of any of ``topics``."""
        wanted = set(topics)
        origins = [node.origin for node in self.directory.nodes.values() if not wanted.isdisjoint(node.members)]
        if not origins:
            return
        if not self._online():
            self.stats.dropped_unreachable += 1
            return
        data = frames.broadcast(self.instance, message, topics)
        for origin in origins:
            self._raw.append((NODE_PREFIX + origin.encode(), data))
        self._schedule()

    def claim(self, namespace: str, name: bytes) -> None:
        """Announce a name this node serves, as a login announces an address."""
        at = self._logins[(namespace, name)] = time.time()
        self._announce(control.ATTACH, **control.address_fields(namespace, name, at))

    def release(self, namespace: str, name: bytes) -> None:
        if self._logins.pop((namespace, name), None) is not None:
            self._announce(control.DETACH, **control.address_fields(namespace, name))

    def owner(self, namespace: str, name: bytes) -> str | None:
        return self.directory.owner.get((namespace, name))

    def principal_of(self, namespace: str, address: bytes) -> Principal | None:
        """The principal of the other node's session at ``address``, when known."""
        return self.directory.principals.get((namespace, address))

    def serve(self, service: str, handler: Callable[[str, bytes], None]) -> None:
        self._services[service] = handler

    def send(self, origin: str, service: str, data: bytes) -> bool:
        """Queue ``data`` for ``service`` on node ``origin`` (this turn's flush sends it)."""
        if not self._online():
            self.stats.dropped_unreachable += 1
            return False
        self._raw.append((NODE_PREFIX + origin.encode(), frames.service(self.origin, service, data)))
        self._schedule()
        return True

    def place_shared(self, messages: list[Message]) -> frozenset[tuple[bytes, bytes]] | None:
        """Choose the node of each shared group the run matches; the groups this one serves."""
        return self.sharing.place(messages)

    def shared_changed(self, key: tuple[bytes, bytes], members: int) -> None:
        """Tell the other nodes how many members this node has of the shared group ``key``."""
        self._announce(control.SHARE, **control.share_fields(key, members))

    def queue_frame(self, origin: str, data: bytes) -> None:
        """Queue a frame for node ``origin``'s channel (this turn's flush sends it)."""
        self._raw.append((NODE_PREFIX + origin.encode(), data))
        self._schedule()

    def _node_gone(self, origin: str) -> None:
        self.sharing.node_gone(origin)
        for listener in tuple(self.node_listeners):
            listener(origin)

    def session_attached(self, session: ISubscriber) -> None:
        if session.address is not None:
            at = self._logins[(session.protocol, session.address)] = time.time()
            self._announce(control.ATTACH, **control.address_fields(session.protocol, session.address, at,
                                                                    session.principal))

    def session_detached(self, session: ISubscriber) -> None:
        if session.address is not None:
            self._logins.pop((session.protocol, session.address), None)
            self._announce(control.DETACH, **control.address_fields(session.protocol, session.address))

    def member_changed(self, topic: bytes, session: ISubscriber, joined: bool, presence: bool) -> None:
        self._announce(control.JOIN if joined else control.LEAVE,
                       **control.member_fields(topic, session.protocol, session.name or b"", presence))

    def filter_changed(self, topic_filter: bytes, active: bool) -> None:
        """Tell the other nodes; follow the filter channel while this node has filters."""
        self._announce(control.FILTER, **control.filter_fields(topic_filter, active))
        if self.shards is not None:
            self.shards.follow(FILTER_CHANNEL, bool(self.broker.filtered.counts))

    def members(self, topic: bytes) -> list:
        return self.directory.members(topic)

    def topics(self) -> set[bytes]:
        return self.directory.topics()

    # ------------------------------------------------------------------ the other nodes

    def other_nodes(self) -> set[str]:
        """The nodes in the directory: a node leaves it with its BYE, or once silent for
        ``node_timeout``."""
        return {node.name for node in self.directory.nodes.values()}

    def _announce(self, kind: str, **fields: JSONValue) -> None:
        """Queue a control message for this turn's flush (dropped while Redis is away: the
        hello and state sent on reconnection bring the other nodes up to date)."""
        if not self._online():
            return
        data = control.encode(self.origin, self.node_name, kind, **fields)
        if len(data) > self.max_control:
            _log.error("Cluster: this node's {kind} message of {size} bytes is over --cluster-max-control "
                       "({limit}): the other nodes would refuse it; not sent (raise the limit on every node)",
                       kind=kind, size=len(data), limit=self.max_control)
            return
        self._raw.append((CONTROL_CHANNEL, data))
        self._schedule()

    def durable_changed(self, tree: bool = False, subscribers: Iterable[str] = (),
                        pending: Iterable[str] = ()) -> None:
        """Tell the other nodes what this node committed to the shared store (one DURABLE
        control message per turn, however many changes the turn made)."""
        if not self._online():
            return  # the hello on reconnection does not carry these: see docs/cluster.md
        self._durable_tree = self._durable_tree or tree
        self._durable_subscribers.update(subscribers)
        self._durable_pending.update(pending)
        self._schedule()

    def keep_out(self, principal: Principal, seconds: float) -> None:
        """Tell the other nodes to keep ``principal`` out for ``seconds`` (a control message;
        lost while Redis is away, like every announcement)."""
        self._announce(control.KEEP_OUT, **control.keep_out_fields(principal, seconds))

    def _heartbeat(self) -> None:
        now = self.reactor.seconds()
        stalled = now - self._last_beat > self.node_timeout
        self._last_beat = now
        if stalled:
            # The others took this node for dead, and what it read meanwhile is older than the
            # freshness window (dropped as stale): exchange state as after an outage.
            _log.warn("Cluster: this node was stalled longer than --cluster-node-timeout ({timeout} s); "
                      "exchanging state with the other nodes again", timeout=self.node_timeout)
            self._announce(control.HELLO, re=1)
            self.broker.durable_resync()
            self._announce(control.STATE, **control.state_fields(self.broker, self._logins))
        self._announce(control.BEAT)
        self.sharing.unanswered(now - self.node_timeout)
        self.sealer.expire()
        self._check_secret()

    def _expire(self) -> None:
        """Forget every node not heard of for ``node_timeout`` seconds (its sessions leave
        presence, its addresses are free), then wait for the next one's deadline."""
        self._expiry = None
        now = self.reactor.seconds()
        for origin in self.directory.expired(now, self.node_timeout):
            node = self.directory.forget(origin)
            if node is not None:
                self._node_gone(origin)
                _log.warn("Cluster: node {node} not heard of for {timeout} s: its sessions left every topic",
                          node=node.name, timeout=self.node_timeout)
        self._watch_silence(now)

    def _watch_silence(self, now: float) -> None:
        """Wake up when the quietest other node's silence reaches ``node_timeout``: the
        deadline itself, not a periodic sweep, so a dead node is forgotten within the timeout
        of its last message (docs/cluster.md, node liveness).  A node heard of since simply
        moves the next wake-up on."""
        nodes = self.directory.nodes
        if self._expiry is not None or not nodes or not self._watching:
            return
        deadline = min(node.last_seen for node in nodes.values()) + self.node_timeout
        self._expiry = self.reactor.callLater(max(0.0, deadline - now), self._expire)

    def _check_secret(self) -> None:
        """Read the secret file again, in a thread, and install its lines if they changed (a
        few dozen bytes each heartbeat): a bad file is logged once and the keys in use stay."""
        if self.secret_file is None or self._secret_reading:
            return
        def install(secrets: list[bytes]) -> None:
            self._secret_error = None
            if secrets != self._secrets_installed:
                self._install_secrets(secrets)

        def failed(failure: Failure) -> None:
            error = str(failure.value)
            if error != self._secret_error:
                self._secret_error = error
                _log.error("Cluster: the secret file was not read again, the keys in use stay: {error}", error=error)

        def done(_: object) -> None:
            self._secret_reading = False

        self._secret_reading = True
        d = deferToThreadPool(self.reactor, self.reactor.getThreadPool(), seal.read_secret_file, self.secret_file)
        d.addCallbacks(install, failed).addBoth(done)

    def _install_secrets(self, secrets: list[bytes]) -> None:
        self.sealer.install(secrets)
        self._secrets_installed = list(secrets)
        ids = [key_id.hex() for key_id in self.sealer.key_ids]
        _log.info("Cluster: secret file read again: sealing with key {sealing}, opening with {opening}",
                  sealing=ids[0], opening=", ".join(ids))
        for listener in tuple(self.secret_listeners):
            listener(ids)

    def _rejections(self, counts: dict[str, int]) -> None:
        _log.warn("Cluster: dropped messages on Redis that no node of this cluster sealed, or replays: {counts} "
                  "(brokerd_cluster_rejected_total; logged at most once a minute)",
                  counts=", ".join(f"{count} {reason}" for reason, count in counts.items()))

    def _control(self, data: bytes) -> None:
        try:
            message = control.decode(data, self.max_control)
        except control.ControlError as exc:
            self.drop_damaged("the control channel", str(exc))
            return
        if message["o"] == self.origin:
            return
        if message["k"] == control.DURABLE:
            self.broker.durable_announced(*control.read_durable(message))
            return
        if message["k"] == control.KEEP_OUT:
            self.broker.keep_out_announced(*control.read_keep_out(message))
            return
        if message["k"] == control.HELLO:
            if message.get("re"):
                self.broker.durable_resync()
            self._announce(control.STATE, **control.state_fields(self.broker, self._logins))
        now = self.reactor.seconds()
        self.directory.apply(message, now)
        if message["k"] == control.BYE:
            self._node_gone(message["o"])
        if self._expiry is None:
            self._watch_silence(now)

    def drop_damaged(self, where: str, error: str) -> None:
        """Drop and count a message that does not parse (logged at most once per interval)."""
        self.stats.bad_envelopes += 1
        self.damaged.dropped(where, error)

    def _remote_presence(self, topic: bytes, member: control.RemoteMember, joined: bool, presence: bool) -> None:
        self.broker.tell_presence(topic, member, joined, presence)

    def _remote_address(self, namespace: str, address: bytes, at: float, origin: str,
                        principal: Principal | None) -> None:
        """Another node's login took an address a local session has: the Broker closes one of
        the two, the same choice on both nodes (the later login of one principal, the earlier of
        two).  The one that stays here is announced again, so that every node's directory
        names this node, whatever order it heard the two logins in."""
        local = self._logins.get((namespace, address))
        if local is None:
            return
        if self.broker.replace_address(namespace, address, principal, (at, origin) > (local, self.origin)):
            return
        session = self.broker.session_for(namespace, address)
        if session is not None:  # (a name a front end claimed is no session: the last claim is followed)
            self._announce(control.ATTACH, **control.address_fields(namespace, address, local, session.principal))

    def _node_message(self, data: bytes) -> None:
        """A frame on this node's own channel: a unicast, a broadcast, a service's message, or a
        shared group's run or answers (brokerd.cluster.sharing)."""
        try:
            name, start = frames.kind(data)
            if name in sharing.NAMES:
                self._shared_frame(name, data, start)
                return
            if name.startswith(frames.SERVICE):
                handler = self._services.get(name[len(frames.SERVICE):])
                if handler is None:
                    raise frames.FrameError(f"no service {name!r} here")
                origin, body = frames.read_service(data, start)
                try:
                    handler(origin, body)
                except Exception:  # noqa: BLE001 - a front end's bug must not cut the Redis link
                    _log.failure("Cluster: the {service} service failed on a message from node {origin}",
                                 service=name, origin=origin)
                return
            if name == frames.BROADCAST:
                topics, message = frames.read_broadcast(data, start)
                if message.kind != BROADCAST:
                    raise frames.FrameError("a broadcast frame whose message is not a broadcast")
                self.stats.messages_received += 1
                self.broker.route(RemoteBroadcast(message, topics))
                return
            message = frames.one_message(data, start)
            if message.kind != UNICAST or message.target is None:
                raise frames.FrameError("a unicast frame whose message is not a unicast")
        except frames.FrameError as exc:
            self.drop_damaged("this node's channel", str(exc))
            return
        self.stats.messages_received += 1
        self.broker.route(RemoteUnicast(message.target, name, message))

    def _shared_frame(self, name: str, data: bytes, start: int) -> None:
        """A run this node was chosen to serve a shared group with, or answers to the runs it
        sent (brokerd.cluster.sharing); a damaged one is dropped and counted."""
        try:
            if name == sharing.SHARE:
                self.stats.messages_received += self.sharing.received(data, start)
                self._schedule()
            else:
                self.sharing.answered(data, start)
        except sharing.ShareFrameError as exc:
            self.drop_damaged("this node's channel", str(exc))

    # ------------------------------------------------------------------ state

    def _online(self) -> bool:
        """Some shard takes publishes (each shard's own state is checked at the flush)."""
        return self.shards is not None and self.shards.up

    @property
    def connected(self) -> bool:
        """Every shard's two connections are up and prepared, the slot map known, and the
        node subscribed to its control and unicast channels."""
        return self.shards is not None and self.shards.connected

    @property
    def following(self) -> set[bytes]:
        """Channels Redis confirmed this node is subscribed to (on any shard)."""
        return self.shards.following if self.shards is not None else set()

    def when_connected(self) -> Deferred:
        """Fires once every shard's two connections are up (at once if they are)."""
        if self.connected:
            return succeed(self)
        d: Deferred = Deferred()
        self._ready.append(d)
        return d

    def shards_ready(self) -> None:
        """Every shard is connected (again): tell the other nodes, wake the waiters."""
        self.stats.connected = 1
        again = self._down
        if self._down:
            self._down = False
            _log.info("Cluster: connected to Redis at {address} again; routing between nodes resumed",
                      address=str(self.address))
        # Ask the others for their state and tell them ours (new, or back after an outage).
        # Back after an outage ("re"): every node reads the durable state again, since the
        # DURABLE announcements of the outage were lost (this node's and the others').
        self._announce(control.HELLO, **({"re": 1} if again else {}))
        if again:
            self.broker.durable_resync()
        self._announce(control.STATE, **control.state_fields(self.broker, self._logins))
        ready, self._ready = self._ready, []
        for d in ready:
            d.callback(self)

    def went_down(self, server: str, why: str) -> None:
        """A connection to ``server`` failed or went (logged once per outage, whatever the
        number of shards and attempts)."""
        self.stats.connected = 0
        if self._down or self.shards is None or self.shards.stopped:
            return
        self._down = True
        self.stats.outages += 1
        _log.warn(
            "Cluster: Redis at {address} is unreachable ({why}); serving local clients only, "
            "messages for other nodes through it are dropped until it is back (reconnecting)",
            address=server, why=why,
        )

    # ------------------------------------------------------------------ routing

    def _flush(self) -> None:
        """Encode every run queued this turn, once, and write them as one pipeline."""
        self._flush_call = None
        queued, self._queued = self._queued, {}
        if self._durable_tree or self._durable_subscribers or self._durable_pending:
            self._raw.append((CONTROL_CHANNEL, control.encode(
                self.origin, self.node_name, control.DURABLE,
                **control.durable_fields(self._durable_tree, self._durable_subscribers, self._durable_pending))))
            self._durable_tree = False
            self._durable_subscribers, self._durable_pending = set(), set()
        for origin, data in self.sharing.answers():
            self._raw.append((NODE_PREFIX + origin.encode(), data))
        raw, self._raw = self._raw, []
        shards = self.shards
        stats = self.stats
        sealer = self.sealer
        if shards is None or not shards.up:
            stats.dropped_unreachable += sum(len(pending.messages) for pending in queued.values())
            return
        for topic, pending in queued.items():
            run, sections = pending.messages, pending.sections
            rendered = None
            if sections:
                rendered = {name: chunks[0] if len(chunks) == 1 else b"".join(chunks)
                            for name, chunks in sections.items()}
            name = channel(topic)
            data = sealer.seal(name, envelope.encode(self.instance, run, rendered))
            if self._backlog + len(data) > self.max_backlog:
                stats.dropped_backlog += len(run)
                continue
            if not shards.publish(name, data):
                stats.dropped_unreachable += len(run)
                continue
            self._backlog += len(data)
            stats.envelopes_sent += 1
            stats.messages_sent += len(run)
            if self.directory.filter_nodes(topic):
                data = sealer.seal(FILTER_CHANNEL, envelope.encode(self.instance, run, rendered))
                if shards.publish(FILTER_CHANNEL, data):
                    self._backlog += len(data)
        for name, data in raw:
            data = sealer.seal(name, data)
            if shards.publish(name, data):
                self._backlog += len(data)
        shards.write()

    def acknowledged(self, size: int, reply: RespReply) -> None:
        """Redis answered one SPUBLISH (or the connection went): free its bytes."""
        self._backlog -= size
        if isinstance(reply, Exception):
            _log.error("Cluster: Redis refused a publish: {error}", error=str(reply))

    def received(self, name: bytes, data: bytes) -> None:
        """A message arrived on a channel: opened first (this node's own echo and anything no
        node of the cluster sealed for this channel stop here), then decoded and handled."""
        opened = self.sealer.open(name, data)
        if opened is None:
            return
        data = opened
        if name == CONTROL_CHANNEL:
            self._control(data)
            return
        if name == self.node_channel:
            self._node_message(data)
            return
        try:
            if envelope.origin_of(data) == self.instance:
                return
            if name == FILTER_CHANNEL:
                run = envelope.open_run(data)
                if run.first.kind != MULTICAST or run.first.target is None:
                    raise envelope.EnvelopeError("a run on the filter channel that is not a multicast")
                if self.shards is not None and channel(run.first.target) in self.shards.following:
                    return  # its topic's own channel brings it
                run.topic = run.first.target  # every message of the run is checked against it
            else:
                run = envelope.open_run(data, name[len(CHANNEL_PREFIX):] if name.startswith(CHANNEL_PREFIX) else None)
            self.broker.route(RemoteRun(run))
        except envelope.EnvelopeError as exc:
            self.drop_damaged(repr(name[:100]), str(exc))
            return
        stats = self.stats
        stats.envelopes_received += 1
        stats.messages_received += run.count
        if run.decoded:
            stats.envelopes_decoded += 1

    def when_following(self, topic: bytes, at: tuple[str, int] | None = None) -> Deferred:
        """Fires once Redis (the shard at ``at``, when given) confirmed this node receives
        ``topic``'s messages from the other nodes (a message published elsewhere before that
        is not seen here)."""
        if self.shards is None:
            raise RuntimeError("the engine is not started")
        return self.shards.when_following(channel(topic), at)

    def _topic_changed(self, name: bytes, active: bool) -> None:
        if self.shards is not None:
            self.shards.follow(channel(name), active)
