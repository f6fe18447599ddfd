"""The engine's connections to Redis, one pair per shard: a plain server is one shard that
owns every slot; a Redis Cluster is one shard per master, found with ``CLUSTER SLOTS``.

The node first connects to the ``--cluster`` address and asks it ``CLUSTER SLOTS``.  A
server with cluster support disabled answers an error: it is the only shard, and nothing
else changes.  A cluster node answers its slot map: the node opens a publishing and a
subscribing connection to every master, and sends each channel's SPUBLISH and SSUBSCRIBE to
the master that owns the channel's slot (:mod:`brokerd.cluster.slots`).  Publishes queued in
one reactor turn leave as one write per shard.

Resharding is followed as Redis Cluster clients are asked to: a ``-MOVED`` answer to a
SPUBLISH updates the slot, sends the publish again to the new owner and asks for the whole
map again; an ``-ASK`` answer sends it once to the named master after ``ASKING``; a master
that loses a slot ends its subscribers' subscriptions to the slot's channels with a
``sunsubscribe`` push, and the node asks for the map and subscribes on the new owner (a
``-MOVED`` answer to a SSUBSCRIBE does the same).  A shard whose connection fails is
reconnected with backoff (:class:`brokerd.cluster.connection.Link`); while the node is a
cluster client it also asks the map again, in case a replica took over.
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.cluster import slots
from brokerd.cluster.address import RedisAddress, client_endpoint
from brokerd.cluster.connection import Link, Pipelined, RespReply, load_txredisapi, protocols
from brokerd.cluster.seal import Sealer
from brokerd.cluster.stats import ClusterStats
from brokerd.interfaces import IBrokerReactor
from brokerd.twistedio import send_now

_log = Logger()

MAX_REDIRECTS = 5
"""Redirections one publish may follow before it is dropped (a slot moving back and forth)."""
_NOT_A_CLUSTER = "cluster support disabled"
"""What a server that is not in cluster mode answers to CLUSTER SLOTS."""
_ENVELOPE_PREFIX = b"brokerd:t:"
SLOT_CACHE = 65536
"""Channels whose slot is remembered (CRC16 in Python costs ~2 us per name); past this many
the memory is emptied and starts again, so it stays bounded whatever the topics."""


class ShardsEngine(Protocol):
    """What the shards need of their engine (brokerd.cluster.redis_engine.RedisEngine): a
    Protocol, since the engine imports this module."""

    password: str | None
    username: str | None
    sealer: Sealer
    stats: ClusterStats

    @property
    def reactor(self) -> IBrokerReactor:
        """Connects, and times the reconnections."""

    def acknowledged(self, size: int, reply: RespReply) -> None:
        """Redis answered one publish of ``size`` bytes (``reply``; None: the connection went first)."""

    def received(self, name: bytes, data: bytes) -> None:
        """A message on a followed channel."""

    def drop_damaged(self, where: str, error: str) -> None:
        """A message that does not parse was dropped."""

    def shards_ready(self) -> None:
        """Every shard is connected and follows its channels."""

    def went_down(self, server: str, why: str) -> None:
        """A connection to ``server`` failed or was lost."""


def _messages_in(engine: ShardsEngine, name: bytes, data: bytes) -> int:
    """How many messages a dropped publish carried (an envelope's count, read in the frame the
    engine sealed; 0 for control)."""
    if name.startswith(_ENVELOPE_PREFIX):
        opened = engine.sealer.open_own(name, data)
        if opened is not None and len(opened) >= 13:
            return int.from_bytes(opened[9:13], "big")
    return 0


class Shard:
    """One Redis server (a cluster's master, or the one plain server): the connections'
    owner, so that replies and pushes reach the engine with their shard known."""

    def __init__(self, shards: Shards, key: slots.Address, address: RedisAddress, endpoint: IStreamClientEndpoint) -> None:
        engine = shards.engine
        self.shards = shards
        self.engine = engine
        self.key = key
        self.address = address
        """Where this shard is (its ``db`` is SELECTed on each connection, as Link asks)."""
        self.endpoint = endpoint
        self.reactor = engine.reactor
        self.password = engine.password
        self.username = engine.username
        self.following: set[bytes] = set()
        """Channels this server confirmed subscribing the node to."""
        self.requested: set[bytes] = set()
        """Channels SSUBSCRIBEd here and not SUNSUBSCRIBEd since (confirmed or not yet)."""
        self.pending: deque[tuple[bool, bytes]] = deque()
        """(subscribe?, channel) of each SSUBSCRIBE/SUNSUBSCRIBE awaiting its answer."""
        self.batch: list[bytes] = []
        self.held: list[tuple[bytes, bytes, int, bool]] = []
        """Publishes redirected here while the connection is being made (their bytes count in
        the engine's backlog, which bounds them): sent once it is ready, dropped if it fails."""
        commands, subscriber = protocols()
        self.publisher = Link(self, "publisher", commands, lambda _: shards.publisher_ready(self))
        self.subscriber = Link(self, "subscriber", subscriber, lambda _: shards.subscriber_ready(self))

    def __str__(self) -> str:
        return str(self.address)

    @property
    def connected(self) -> bool:
        return self.publisher.protocol is not None and self.subscriber.protocol is not None

    def connect(self) -> None:
        self.publisher.connect()
        self.subscriber.connect()

    def stop(self) -> Deferred:
        self.drop_held()
        return DeferredList([d for d in (self.publisher.stop(), self.subscriber.stop()) if d is not None])

    # ------------------------------------------------------------------ publishing

    def queue(self, name: bytes, data: bytes, hops: int = 0) -> bool:
        """Add a SPUBLISH to this turn's write; False when the connection is down."""
        protocol = self.publisher.protocol
        if protocol is None or protocol.transport is None:
            return False
        self.batch.append(protocol._build_command(b"SPUBLISH", name, data))
        protocol.expected.append((name, data, hops))
        return True

    def write(self) -> None:
        """Write this turn's SPUBLISHes at once, in one send() when the connection's queue is
        empty (brokerd.twistedio): transport.write would wait for another reactor round."""
        batch, self.batch = self.batch, []
        protocol = self.publisher.protocol
        if batch and protocol is not None and protocol.transport is not None:
            send_now(protocol.transport, batch[0] if len(batch) == 1 else b"".join(batch))

    def resend(self, name: bytes, data: bytes, hops: int, asking: bool) -> None:
        """Send a redirected SPUBLISH here at once (after ASKING for an ``-ASK``), or hold
        it until the connection is ready."""
        protocol = self.publisher.protocol
        if protocol is None or protocol.transport is None:
            self.held.append((name, data, hops, asking))
            return
        command = protocol._build_command(b"SPUBLISH", name, data)
        if asking:
            answer: Deferred = Deferred()
            answer.addErrback(lambda _: None)
            protocol.expected.append(answer)
            command = protocol._build_command(b"ASKING") + command
        protocol.expected.append((name, data, hops))
        protocol.transport.write(command)

    def release_held(self) -> None:
        held, self.held = self.held, []
        for entry in held:
            self.resend(*entry)

    def drop_held(self) -> None:
        held, self.held = self.held, []
        for name, data, _hops, _asking in held:
            self.engine.stats.dropped_unreachable += _messages_in(self.engine, name, data)
            self.engine.acknowledged(len(data), None)

    def acknowledged(self, entry: Pipelined, reply: RespReply) -> None:
        """This server answered a SPUBLISH (reply None: the connection went first)."""
        name, data, hops = entry
        if isinstance(reply, Exception):
            try:
                moved = slots.redirect(str(reply), self.key[0])
            except slots.TopologyError as exc:
                moved = None
                reply = exc
            if moved is not None:
                self.shards.redirected(name, data, hops, moved, self)
                return
        self.engine.acknowledged(len(data), reply)

    # ------------------------------------------------------------------ subscribing

    def follow(self, name: bytes, active: bool) -> None:
        """SSUBSCRIBE (or SUNSUBSCRIBE) ``name`` here; nothing when the connection is down
        (it subscribes what it owns when it is back)."""
        protocol = self.subscriber.protocol
        if protocol is None or protocol.transport is None:
            return
        if active:
            self.requested.add(name)
            self.engine.sealer.subscribing(name)
        else:
            self.requested.discard(name)
            self.following.discard(name)
        self.pending.append((active, name))
        protocol.transport.write(protocol._build_command(b"SSUBSCRIBE" if active else b"SUNSUBSCRIBE", name))

    def confirmed(self, name: bytes, subscribed: bool) -> None:
        """A ``ssubscribe`` or ``sunsubscribe`` push: the answer to this node's command, or
        (a ``sunsubscribe`` nobody asked for) the slot of ``name`` moved to another master."""
        if self.pending and self.pending[0] == (subscribed, name):
            self.pending.popleft()
            if subscribed:
                self.following.add(name)
                self.shards.confirmed(name, self)
            return
        if not subscribed and name in self.requested:
            self.requested.discard(name)
            self.following.discard(name)
            self.engine.stats.redirects += 1
            _log.info("Cluster: {server} no longer serves channel {channel!r}; subscribing on its new owner",
                      server=str(self), channel=name)
            self.shards.refresh(via=self)

    def refused(self, error: Exception) -> None:
        """An error answer on the subscribing connection: to the oldest command waiting."""
        active, name = self.pending.popleft() if self.pending else (False, b"")
        try:
            moved = slots.redirect(str(error), self.key[0])
        except slots.TopologyError:
            moved = None
        if moved is not None and active:
            self.requested.discard(name)
            self.engine.stats.redirects += 1
            if moved.moved:
                self.shards.assign(moved.slot, moved.address)
            self.shards.reconcile()
            self.shards.refresh(via=self)
            return
        _log.error("Cluster: Redis at {server} refused to subscribe to {channel!r}: {error}",
                   server=str(self), channel=name, error=str(error))

    # ------------------------------------------------------------------ the connections' fate

    def received(self, name: bytes, data: bytes) -> None:
        """A message on a channel: the engine's.  Whatever it raises is dropped and counted
        here, so no message can cut the subscriber connection (the engine's decoders refuse
        damaged input themselves; this is the last line)."""
        try:
            self.engine.received(name, data)
        except Exception as exc:  # noqa: BLE001 - one message must never cost the node its Redis link
            self.engine.drop_damaged(repr(name[:100]), f"{type(exc).__name__}: {exc}")

    def protocol_error(self, why: str) -> None:
        _log.error("Cluster: unreadable reply from Redis at {address} ({why}); reconnecting",
                   address=str(self), why=why)

    def unreachable(self, role: str, failure: Failure) -> None:
        """A connection attempt failed."""
        if role == "publisher":
            self.drop_held()
        self.engine.went_down(str(self), failure.getErrorMessage())
        self.shards.refresh()

    def connection_lost(self, protocol: object, reason: Failure) -> None:
        for link in (self.publisher, self.subscriber):
            if link.protocol is protocol:
                if link is self.subscriber:
                    self.requested.clear()
                    self.pending.clear()
                else:
                    self.drop_held()
                link.lost()
                self.shards.lost()
                self.engine.went_down(str(self), reason.getErrorMessage())
                self.shards.refresh()


class Shards:
    """Every shard of the node's Redis, the slot map, and the channels the node wants."""

    def __init__(self, engine: ShardsEngine, seed: RedisAddress, tls_ca: Path | None = None) -> None:
        self.engine = engine
        self.seed = seed
        self.tls_ca = tls_ca
        self.cluster: bool | None = None
        """None until the first server answered CLUSTER SLOTS; then whether it is a cluster."""
        self.map: slots.SlotMap | None = None
        self.shards: dict[slots.Address, Shard] = {}
        self.wanted: set[bytes] = set()
        """Channels the node subscribes to, on whichever shard owns each."""
        self.essential: set[bytes] = set()
        """Channels whose subscription must be confirmed before the node is ready (its control
        and unicast channels: on a Redis Cluster they may live on other masters than the ones
        the node announces itself through)."""
        self.stopped = False
        self._seed_key: slots.Address = (seed.host, seed.port) if seed.host else (seed.path or "", 0)
        self._dirty: list[Shard] = []
        self._refreshing = False
        self._again: Shard | None | bool = False
        self._was_connected = False
        self._follow_waits: dict[bytes, list[tuple[slots.Address | None, Deferred]]] = {}
        self._slots: dict[bytes, int] = {}
        self._stopping: list[Deferred] = []

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self._add(self._seed_key, self.seed, client_endpoint(self.engine.reactor, self.seed, self.tls_ca))

    def stop(self) -> Deferred:
        self.stopped = True
        waits = [shard.stop() for shard in self.shards.values()] + self._stopping
        return DeferredList(waits)

    def _add(self, key: slots.Address, address: RedisAddress, endpoint: IStreamClientEndpoint) -> Shard:
        shard = self.shards[key] = Shard(self, key, address, endpoint)
        shard.connect()
        return shard

    def _shard_at(self, key: slots.Address) -> Shard:
        """The shard of a master the map (or a redirection) names, connecting to it if new."""
        shard = self.shards.get(key)
        if shard is None:
            address = replace(self.seed, scheme="rediss" if self.seed.tls else "redis",
                              host=key[0], port=key[1], path=None, db=None)
            shard = self._add(key, address, client_endpoint(self.engine.reactor, address, self.tls_ca))
        return shard

    # ------------------------------------------------------------------ state

    @property
    def connected(self) -> bool:
        """The map is known, every shard's two connections are up, and the essential
        channels' subscriptions confirmed."""
        if self.map is None or not self.shards or not all(s.connected for s in self.shards.values()):
            return False
        return all(any(name in s.following for s in self.shards.values()) for name in self.essential)

    @property
    def up(self) -> bool:
        """Some shard can take publishes (messages for a shard that is down are dropped there)."""
        return self.map is not None and any(s.publisher.protocol is not None for s in self.shards.values())

    @property
    def following(self) -> set[bytes]:
        return set().union(*(shard.following for shard in self.shards.values()))

    def owner(self, name: bytes) -> Shard | None:
        """The shard that serves channel ``name`` (None while unknown)."""
        if self.map is None:
            return None
        if not self.cluster:
            return self.shards.get(self._seed_key)
        slot = self._slots.get(name)
        if slot is None:
            if len(self._slots) >= SLOT_CACHE:
                self._slots.clear()
            slot = self._slots[name] = slots.hash_slot(name)
        key = self.map.owner(slot)
        return self.shards.get(key) if key is not None else None

    def assign(self, slot: int, key: slots.Address) -> None:
        if self.map is not None:
            self.map.assign(slot, key)
            self._shard_at(key)

    # ------------------------------------------------------------------ publishing

    def publish(self, name: bytes, data: bytes) -> bool:
        """Queue a SPUBLISH on the shard of ``name`` for :meth:`write`; False when that
        shard is unknown or down."""
        shard = self.owner(name)
        if shard is None or not shard.queue(name, data):
            return False
        if len(shard.batch) == 1:
            self._dirty.append(shard)
        return True

    def write(self) -> None:
        """One write per shard for everything queued since the last call."""
        dirty, self._dirty = self._dirty, []
        for shard in dirty:
            shard.write()

    def redirected(self, name: bytes, data: bytes, hops: int, moved: slots.Redirect, by: Shard) -> None:
        """A SPUBLISH was answered MOVED or ASK: send it to the master named (its bytes
        stay in the backlog), connecting to it if it is new; dropped after MAX_REDIRECTS."""
        stats = self.engine.stats
        stats.redirects += 1
        if moved.moved:
            self.assign(moved.slot, moved.address)
            self.refresh(via=by)
        if hops >= MAX_REDIRECTS or self.stopped:
            stats.dropped_unreachable += _messages_in(self.engine, name, data)
            self.engine.acknowledged(len(data), None)
            return
        self._shard_at(moved.address).resend(name, data, hops + 1, not moved.moved)

    # ------------------------------------------------------------------ subscribing

    def follow(self, name: bytes, active: bool) -> None:
        """Start (or stop) receiving channel ``name``, on the shard that owns it."""
        if active:
            self.wanted.add(name)
            shard = self.owner(name)
            if shard is not None and name not in shard.requested:
                shard.follow(name, True)
        else:
            self.wanted.discard(name)
            self.engine.sealer.unsubscribed(name)
            for shard in self.shards.values():
                if name in shard.requested or name in shard.following:
                    shard.follow(name, False)

    def reconcile(self) -> None:
        """Make each connected shard's subscriptions the wanted channels it owns."""
        if self.map is None:
            return
        owned: dict[slots.Address, list[bytes]] = {}
        for name in self.wanted:
            shard = self.owner(name)
            if shard is not None:
                owned.setdefault(shard.key, []).append(name)
        for key, shard in self.shards.items():
            if shard.subscriber.protocol is None:
                continue
            mine = owned.get(key, [])
            for name in mine:
                if name not in shard.requested:
                    shard.follow(name, True)
            for name in shard.requested - set(mine):
                shard.follow(name, False)

    def confirmed(self, name: bytes, shard: Shard) -> None:
        if name in self.essential:
            self._check()
        waits = self._follow_waits.pop(name, None)
        if not waits:
            return
        later: list[tuple[slots.Address | None, Deferred]] = []
        for key, d in waits:
            if key is None or key == shard.key:
                d.callback(name)
            else:
                later.append((key, d))
        if later:
            self._follow_waits[name] = later

    def when_following(self, name: bytes, at: slots.Address | None = None) -> Deferred:
        """Fires once a shard (the one at ``at``, when given) confirmed the node's
        subscription to channel ``name``."""
        for shard in self.shards.values():
            if name in shard.following and (at is None or shard.key == at):
                return succeed(name)
        d: Deferred = Deferred()
        self._follow_waits.setdefault(name, []).append((at, d))
        return d

    # ------------------------------------------------------------------ topology

    def publisher_ready(self, shard: Shard) -> None:
        shard.release_held()
        if self.map is None or self.cluster:
            self.refresh(via=shard)
        self._check()

    def subscriber_ready(self, shard: Shard) -> None:
        self.reconcile()
        self._check()

    def lost(self) -> None:
        self._was_connected = False

    def refresh(self, via: Shard | None = None) -> None:
        """Ask a server for the slot map (the first answer also says whether it is a
        cluster); one question at a time, asked again once if wanted meanwhile."""
        if self.stopped or self.cluster is False:
            return
        if self._refreshing:
            self._again = via or True
            return
        candidates = ([via] if via is not None else []) + list(self.shards.values())
        shard = next((s for s in candidates if s.key in self.shards and s.publisher.protocol is not None), None)
        if shard is None:
            return  # a shard that connects again asks
        protocol = shard.publisher.protocol
        assert protocol is not None  # the shard was chosen for it
        self._refreshing = True
        d = protocol.command(b"CLUSTER", b"SLOTS")
        d.addCallbacks(self._discovered, self._not_discovered, callbackArgs=(shard,), errbackArgs=(shard,))
        d.addBoth(self._refreshed)

    def _refreshed(self, _: object) -> None:
        self._refreshing = False
        again, self._again = self._again, False
        if again:
            self.refresh(via=again if isinstance(again, Shard) else None)

    def _discovered(self, reply: RespReply, shard: Shard) -> None:
        try:
            ranges = slots.parse_cluster_slots(reply, shard.key[0])
        except slots.TopologyError as exc:
            _log.error("Cluster: unreadable CLUSTER SLOTS from {server}: {error}", server=str(shard), error=str(exc))
            return
        if self.stopped:
            return
        first = self.cluster is None
        self.cluster = True
        self.map = slots.SlotMap(ranges)
        masters = self.map.masters()
        if first:
            _log.info("Cluster: {server} is a Redis Cluster node: {count} masters, {covered}",
                      server=str(shard), count=len(masters),
                      covered="every slot served" if self.map.covered() else "some slots without a master")
        for key in masters:
            self._shard_at(key)
        for key in [key for key in self.shards if key not in masters]:
            gone = self.shards.pop(key)
            self._stopping.append(gone.stop())
        self.engine.stats.shards = len(self.shards)
        self.reconcile()
        self._check()

    def _not_discovered(self, failure: Failure, shard: Shard) -> None:
        message = failure.getErrorMessage()
        if self.map is None and failure.check(load_txredisapi().ResponseError):
            if _NOT_A_CLUSTER not in message:
                _log.warn("Cluster: {server} did not answer CLUSTER SLOTS ({error}); taking it as a single "
                          "server, not a Redis Cluster", server=str(shard), error=message)
            self.cluster = False
            self.map = slots.SlotMap.single(shard.key)
            self.engine.stats.shards = 1
            self.reconcile()
            self._check()
            return
        if not self.stopped:
            _log.warn("Cluster: CLUSTER SLOTS at {server} failed: {error}", server=str(shard), error=message)

    def _check(self) -> None:
        """Tell the engine when every shard is up again (or for the first time)."""
        if self.connected and not self._was_connected:
            self._was_connected = True
            self.engine.shards_ready()
