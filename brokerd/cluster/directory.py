"""What every node knows of the others: their sessions' addresses, their topics' members, and
when each was last heard of.

Each node announces its own changes on one control channel (a session logged in or out, a
member joined or left a topic), a heartbeat every ``heartbeat`` seconds, and its whole state
when a node says hello (a node that starts or comes back after a Redis outage).  Every node
applies the others' announcements to its own copy of this directory, so a unicast, a login
replacement or a presence listing is answered from memory, without a round trip to Redis.
A node not heard of for ``timeout`` seconds is taken as dead: its members leave every topic
(presence watchers are told) and its addresses are forgotten.

Control messages are small JSON objects; names (bytes) travel as latin-1 strings, which map
every byte to one character and back.  :func:`decode` is the one reader of the bytes that
arrive on the control channel, from any client of Redis: it refuses (ControlError) anything
over ``--cluster-max-control`` bytes (16 MB: a STATE of about 150,000 sessions and
memberships) before parsing, anything nested deeper than JSON's recursion allows,
and any message of a known kind whose fields are not of the types and sizes below, so what
:meth:`Directory.apply` and the engine read is well formed.  A member's protocol is read as
one of the known protocols or ``other``, as an envelope's: presence renderings and figures
show a fixed set of names, whatever arrives.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from zope.interface import implementer

from brokerd.cluster.envelope import OTHER, PROTOCOLS
from brokerd.cluster.localbroker import LocalBroker
from brokerd.config import Settings
from brokerd.core.filters import FilterIndex, filter_problem
from brokerd.core.principal import NOBODY, Principal
from brokerd.interfaces import ISubscriber
from brokerd.jsontypes import JSONValue

HELLO, STATE, BEAT, BYE = "hello", "state", "beat", "bye"
ATTACH, DETACH, JOIN, LEAVE = "attach", "detach", "join", "leave"
DURABLE = "durable"
KEEP_OUT = "keepout"
FILTER = "filter"
"""A topic filter got its first subscriber on the node (``on`` true) or lost its last: ``f``
the filter.  The other nodes send that node the runs of every topic one of its filters
matches (on the filter channel; brokerd.cluster.redis_engine)."""
SHARE = "share"
"""The members this node has of a shared group (MQTT's ``$share/{group}/{filter}``) changed:
``g`` the group, ``f`` its filter, ``c`` how many (0: none left).  A publishing node chooses
one node per group among those that announced members (brokerd.cluster.sharing)."""
MAX_FILTERS = 100_000
"""Filters one node's STATE may name."""
"""Durable state this node committed to the shared store: ``tr`` (the SMQP topic tree
changed), ``s`` (subscribers whose durable subscriptions changed), ``p`` (subscribers that
got pending deliveries).  The other nodes re-read that part of the store (see
:meth:`brokerd.core.durable.DurableService.announced`); the directory ignores it."""


class ControlError(ValueError):
    """A control message that does not parse."""


def _s(data: bytes) -> str:
    return data.decode("latin-1")


def _b(text: str) -> bytes:
    return text.encode("latin-1")


def encode(origin: str, node: str, kind: str, **fields: JSONValue) -> bytes:
    return json.dumps({"o": origin, "n": node, "k": kind, **fields}, separators=(",", ":")).encode()


MAX_NAME = 1024
"""Characters of a node id, node name, kind, namespace or protocol name in a control message."""
ORIGIN_SIZE = 16
"""A node id: 16 lowercase hex digits (8 random bytes)."""
_HEX = frozenset("0123456789abcdef")


def decode(data: bytes, limit: int = Settings.cluster_max_control) -> dict[str, Any]:
    """The control message in ``data``, its fields checked (see the module docstring);
    ControlError for anything else, and unread for more than ``limit`` bytes (parsed JSON
    takes about ten times its bytes in memory).  An unknown kind keeps only its node id,
    name and kind (a newer node's message: it still says the node is alive)."""
    if len(data) > limit:
        raise ControlError(f"a control message of {len(data)} bytes (at most {limit}: --cluster-max-control)")
    try:
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ControlError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise ControlError("not a control message")
    origin, kind = message.get("o"), message.get("k")
    if not isinstance(origin, str) or len(origin) != ORIGIN_SIZE or not _HEX.issuperset(origin):
        raise ControlError("a control message without a node id")
    if not _is_name(kind) or not _is_name(message.get("n", "")):
        raise ControlError("a control message without a kind or a node name")
    check = _CHECKS.get(kind)
    if check is None:
        return {"o": origin, "n": message.get("n", ""), "k": kind}
    check(message)
    return message


def _is_name(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= MAX_NAME


def _is_bytes(value: object) -> TypeGuard[str]:
    """A name that travels as latin-1 (every character maps back to one byte)."""
    return isinstance(value, str) and (value.isascii() or max(value) <= "\xff")


def _is_time(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise ControlError(f"a control message with {what}")


def _check_address(message: dict[str, Any]) -> None:
    _require(_is_name(message.get("ns")) and _is_bytes(message.get("a")), "a damaged address")
    _require(_is_time(message.get("at", 0.0)), "a damaged login time")
    name, realm = message.get("pn"), message.get("pr")
    _require((name is None and realm is None) or (_is_name(name) and _is_name(realm)), "a damaged principal")


def _check_detach(message: dict[str, Any]) -> None:
    _require(_is_name(message.get("ns")) and _is_bytes(message.get("a")), "a damaged address")


def _known_protocol(name: str) -> str:
    """A member's protocol as the figures and presence renderings may show it: one of the
    known protocols, or ``other`` (as an envelope's, brokerd.cluster.envelope)."""
    return name if name in PROTOCOLS else OTHER


def _check_member(message: dict[str, Any]) -> None:
    _require(_is_bytes(message.get("t")) and _is_name(message.get("p")) and _is_bytes(message.get("m")),
             "a damaged topic member")
    _require(isinstance(message.get("pr", False), bool), "a damaged presence flag")
    message["p"] = _known_protocol(message["p"])


def _check_state(message: dict[str, Any]) -> None:
    addresses, members = message.get("addresses", []), message.get("members", [])
    _require(isinstance(addresses, list) and isinstance(members, list), "a damaged state")
    for entry in addresses:
        _require(isinstance(entry, list) and len(entry) in (3, 5) and _is_name(entry[0]) and _is_bytes(entry[1])
                 and _is_time(entry[2]) and all(_is_name(part) for part in entry[3:]), "a damaged state address")
    for entry in members:
        _require(isinstance(entry, list) and len(entry) == 4 and _is_bytes(entry[0]) and _is_name(entry[1])
                 and _is_bytes(entry[2]) and isinstance(entry[3], bool), "a damaged state member")
        entry[1] = _known_protocol(entry[1])
    filters = message.get("filters", [])
    _require(isinstance(filters, list) and len(filters) <= MAX_FILTERS and all(_is_filter(f) for f in filters),
             "a damaged state filter")
    shares = message.get("shares", [])
    _require(isinstance(shares, list) and len(shares) <= MAX_FILTERS
             and all(isinstance(entry, list) and len(entry) == 3 and _is_share(*entry) for entry in shares),
             "a damaged state shared group")


def _is_share(group: object, topic_filter: object, members: object) -> bool:
    return (_is_bytes(group) and bool(group) and _is_filter(topic_filter) and type(members) is int
            and 0 <= members <= MAX_GROUP_MEMBERS)


def _check_share(message: dict[str, Any]) -> None:
    _require(_is_share(message.get("g"), message.get("f"), message.get("c")), "a damaged shared group")


def _is_filter(value: object) -> TypeGuard[str]:
    return _is_bytes(value) and filter_problem(_b(value)) is None


def _check_filter(message: dict[str, Any]) -> None:
    _require(_is_filter(message.get("f")) and isinstance(message.get("on"), bool), "a damaged filter change")


def _check_durable(message: dict[str, Any]) -> None:
    read_durable(message)


def _check_keep_out(message: dict[str, Any]) -> None:
    _require(_is_name(message.get("pn")) and _is_name(message.get("pr")) and _is_time(message.get("for")),
             "a damaged keep-out")
    read_keep_out(message)


def _check_nothing(message: dict[str, Any]) -> None:
    """HELLO, BEAT, BYE: nothing but the node id, name and kind is read (HELLO's ``re`` as a
    truth value)."""


def address_fields(namespace: str, address: bytes, at: float = 0.0, principal: Principal | None = None) -> dict[str, Any]:
    """An address's fields; with the ``principal`` of its session, so that the sending node
    of a unicast can apply the access policy to the recipient's login topic as one node does."""
    fields: dict[str, Any] = {"ns": namespace, "a": _s(address), "at": at}
    if principal is not None:
        fields["pn"], fields["pr"] = principal.name, principal.realm
    return fields


def _principal(name: object, realm: object) -> Principal | None:
    if isinstance(name, str) and isinstance(realm, str):
        return Principal(name, realm)
    return None


def keep_out_fields(principal: Principal, seconds: float) -> dict[str, Any]:
    return {"pn": principal.name, "pr": principal.realm, "for": float(seconds)}


def read_keep_out(message: dict[str, Any]) -> tuple[Principal, float]:
    """The fields of a KEEP_OUT message; ControlError when they are not a principal and a
    number of seconds."""
    principal = _principal(message.get("pn"), message.get("pr"))
    seconds = message.get("for")
    if principal is None or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ControlError("a keep-out without its principal or its seconds")
    return principal, float(seconds)


def durable_fields(tree: bool, subscribers: Iterable[str], pending: Iterable[str]) -> dict[str, Any]:
    return {"tr": bool(tree), "s": sorted(subscribers), "p": sorted(pending)}


def read_durable(message: dict[str, Any]) -> tuple[bool, list[str], list[str]]:
    """The fields of a DURABLE message; ControlError when they are not names."""
    subscribers, pending = message.get("s", []), message.get("p", [])
    if not isinstance(subscribers, list) or not isinstance(pending, list) or \
            not all(isinstance(name, str) for name in (*subscribers, *pending)):
        raise ControlError("a durable change without subscriber names")
    return bool(message.get("tr")), subscribers, pending


_CHECKS = {
    HELLO: _check_nothing, BEAT: _check_nothing, BYE: _check_nothing, STATE: _check_state,
    ATTACH: _check_address, DETACH: _check_detach, JOIN: _check_member, LEAVE: _check_member,
    DURABLE: _check_durable, KEEP_OUT: _check_keep_out, FILTER: _check_filter, SHARE: _check_share,
}

MAX_GROUP_MEMBERS = 1 << 31
"""Members one node may announce of one shared group (a count beyond is damaged)."""


def share_fields(key: tuple[bytes, bytes], members: int) -> dict[str, Any]:
    return {"g": _s(key[0]), "f": _s(key[1]), "c": members}


def filter_fields(topic_filter: bytes, active: bool) -> dict[str, Any]:
    return {"f": _s(topic_filter), "on": active}


def member_fields(topic: bytes, protocol: str, name: bytes, presence: bool) -> dict[str, Any]:
    return {"t": _s(topic), "p": protocol, "m": _s(name), "pr": presence}


@implementer(ISubscriber)
class RemoteMember:
    """A session of another node as the core's presence rendering sees it (an ISubscriber
    that nothing is ever sent to)."""

    __slots__ = ("protocol", "name", "node")
    address = None
    wire_format = None
    principal = NOBODY

    def __init__(self, protocol: str, name: bytes, node: str) -> None:
        self.protocol = protocol
        self.name = name
        self.node = node

    def send(self, data: bytes) -> None:
        """Another node's session is reached through its node, never directly."""

    def replaced(self) -> None:
        """Its own node closes it."""

    def __repr__(self) -> str:
        return f"<RemoteMember {self.protocol}:{self.name!r} on {self.node}>"


@dataclass
class RemoteNode:
    origin: str
    name: str
    last_seen: float
    addresses: set[tuple[str, bytes]] = field(default_factory=set)
    members: dict[bytes, dict[tuple[str, bytes], tuple[RemoteMember, bool]]] = field(default_factory=dict)
    filters: set[bytes] = field(default_factory=set)
    shares: dict[tuple[bytes, bytes], int] = field(default_factory=dict)
    """Its members of each shared group (group name, filter)."""


class Directory:
    """The other nodes' addresses and topic members, as announced on the control channel.

    ``on_presence(topic, member, joined, presence)`` is called for every remote member that
    joins or leaves a topic (so the Broker tells its presence watchers); ``on_address(ns,
    address, at, origin, principal)`` when another node's session of ``principal`` (None: not
    announced) took an address at time ``at`` (so the Broker decides which of that login and
    a local one with the address stays).
    """

    def __init__(self, on_presence: Callable[[bytes, RemoteMember, bool, bool], None],
                 on_address: Callable[[str, bytes, float, str, Principal | None], None],
                 on_topics: Callable[[], None] | None = None) -> None:
        self.on_topics = on_topics
        """Called (no arguments) when a topic appears on or disappears from another node."""
        self.nodes: dict[str, RemoteNode] = {}
        self.owner: dict[tuple[str, bytes], str] = {}
        """(namespace, address) -> the origin of the node whose session has it."""
        self.principals: dict[tuple[str, bytes], Principal] = {}
        """(namespace, address) -> the principal of the session that has it, when announced."""
        self.on_presence = on_presence
        self.on_address = on_address
        self.filters: FilterIndex[str] = FilterIndex()
        """The other nodes' topic filters; their members are the nodes' origins."""
        self.shares: dict[tuple[bytes, bytes], dict[str, int]] = {}
        """Each shared group with members on other nodes: origin -> its members' count."""
        self.share_index: FilterIndex[tuple[bytes, bytes]] = FilterIndex()
        """Those groups by filter (the members are the groups' keys)."""

    def node(self, origin: str, name: str, now: float) -> RemoteNode:
        found = self.nodes.get(origin)
        if found is None:
            found = self.nodes[origin] = RemoteNode(origin, name, now)
        found.last_seen = now
        return found

    def apply(self, message: dict[str, Any], now: float) -> None:
        """Apply one control message of another node."""
        kind = message["k"]
        origin = message["o"]
        if kind == BYE:
            self.forget(origin)
            return
        node = self.node(origin, str(message.get("n", "")), now)
        if kind == ATTACH:
            self._attach(node, message["ns"], _b(message["a"]), float(message.get("at", 0.0)),
                         _principal(message.get("pn"), message.get("pr")))
        elif kind == DETACH:
            key = (message["ns"], _b(message["a"]))
            node.addresses.discard(key)
            self._drop(key, origin)
        elif kind == JOIN:
            self._join(node, _b(message["t"]), message["p"], _b(message["m"]),
                       bool(message.get("pr", False)))
        elif kind == LEAVE:
            self._leave(node, _b(message["t"]), message["p"], _b(message["m"]))
        elif kind == FILTER:
            self._filter(node, _b(message["f"]), message["on"])
        elif kind == SHARE:
            self._share(node, (_b(message["g"]), _b(message["f"])), message["c"])
        elif kind == STATE:
            self._replace_state(node, message)

    def _drop(self, key: tuple[str, bytes], origin: str) -> None:
        """Forget who has ``key`` if it is still node ``origin``."""
        if self.owner.get(key) == origin:
            del self.owner[key]
            self.principals.pop(key, None)

    def _attach(self, node: RemoteNode, namespace: str, address: bytes, at: float,
                principal: Principal | None = None) -> None:
        key = (namespace, address)
        previous = self.owner.get(key)
        if previous is not None and previous != node.origin and previous in self.nodes:
            self.nodes[previous].addresses.discard(key)
        node.addresses.add(key)
        self.owner[key] = node.origin
        if principal is not None:
            self.principals[key] = principal
        else:
            self.principals.pop(key, None)
        self.on_address(namespace, address, at, node.origin, principal)

    def _join(self, node: RemoteNode, topic: bytes, protocol: str, name: bytes, presence: bool) -> None:
        members = node.members.get(topic)
        if members is None:
            members = node.members[topic] = {}
            self._topics_changed()
        if (protocol, name) in members:
            return
        member = RemoteMember(protocol, name, node.name)
        members[(protocol, name)] = (member, presence)
        self.on_presence(topic, member, True, presence)

    def _leave(self, node: RemoteNode, topic: bytes, protocol: str, name: bytes) -> None:
        members = node.members.get(topic)
        found = members.pop((protocol, name), None) if members else None
        if found is None:
            return
        if not members:
            del node.members[topic]
            self._topics_changed()
        self.on_presence(topic, found[0], False, False)

    def _filter(self, node: RemoteNode, topic_filter: bytes, active: bool) -> None:
        if active:
            node.filters.add(topic_filter)
            self.filters.add(topic_filter, node.origin)
        else:
            node.filters.discard(topic_filter)
            self.filters.discard(topic_filter, node.origin)

    def _share(self, node: RemoteNode, key: tuple[bytes, bytes], members: int) -> None:
        nodes = self.shares.get(key)
        if members:
            node.shares[key] = members
            if nodes is None:
                nodes = self.shares[key] = {}
                self.share_index.add(key[1], key)
            nodes[node.origin] = members
            return
        node.shares.pop(key, None)
        if nodes is not None and nodes.pop(node.origin, None) is not None and not nodes:
            del self.shares[key]
            self.share_index.discard(key[1], key)

    def shared_groups(self, topic: bytes) -> tuple[tuple[bytes, bytes], ...]:
        """The keys of the shared groups with members on other nodes whose filter matches ``topic``."""
        return self.share_index.match(topic)

    def filter_nodes(self, topic: bytes) -> tuple[str, ...]:
        """The origins of the other nodes with a filter matching ``topic``."""
        return self.filters.match(topic)

    def _topics_changed(self) -> None:
        if self.on_topics is not None:
            self.on_topics()

    def _replace_state(self, node: RemoteNode, message: dict[str, Any]) -> None:
        addresses = {(entry[0], _b(entry[1])): (float(entry[2]), _principal(*entry[3:5]) if len(entry) >= 5 else None)
                     for entry in message.get("addresses", ())}
        for address_key in node.addresses - addresses.keys():
            self._drop(address_key, node.origin)
        node.addresses = set()
        for (namespace, address), (at, principal) in addresses.items():
            self._attach(node, namespace, address, at, principal)
        wanted = {(_b(t), p, _b(m)): bool(pr) for t, p, m, pr in message.get("members", ())}
        for topic, members in list(node.members.items()):
            for protocol, name in list(members):
                if (topic, protocol, name) not in wanted:
                    self._leave(node, topic, protocol, name)
        for (topic, protocol, name), presence in wanted.items():
            self._join(node, topic, protocol, name, presence)
        filters = {_b(f) for f in message.get("filters", ())}
        for topic_filter in node.filters - filters:
            self._filter(node, topic_filter, False)
        for topic_filter in filters - node.filters:
            self._filter(node, topic_filter, True)
        shares = {(_b(group), _b(topic_filter)): members for group, topic_filter, members in message.get("shares", ())}
        for key in node.shares.keys() - shares.keys():
            self._share(node, key, 0)
        for key, members in shares.items():
            self._share(node, key, members)

    def forget(self, origin: str) -> RemoteNode | None:
        """A node left or died: its members leave, its addresses are free."""
        node = self.nodes.pop(origin, None)
        if node is None:
            return None
        for topic, members in node.members.items():
            for member, _presence in members.values():
                self.on_presence(topic, member, False, False)
        if node.members:
            node.members = {}
            self._topics_changed()
        for topic_filter in list(node.filters):
            self._filter(node, topic_filter, False)
        for key in list(node.shares):
            self._share(node, key, 0)
        for address_key in node.addresses:
            self._drop(address_key, origin)
        return node

    def expired(self, now: float, timeout: float) -> list[str]:
        """Origins of the nodes not heard of for ``timeout`` seconds."""
        return [origin for origin, node in self.nodes.items() if now - node.last_seen >= timeout]

    def members(self, topic: bytes) -> list[tuple[RemoteMember, bool]]:
        found: list[tuple[RemoteMember, bool]] = []
        for node in self.nodes.values():
            found.extend(node.members.get(topic, {}).values())
        return found

    def topics(self) -> set[bytes]:
        return {topic for node in self.nodes.values() for topic in node.members}


def state_fields(broker: LocalBroker, logins: dict[tuple[str, bytes], float]) -> dict[str, Any]:
    """This node's whole state (its answer to a hello); ``logins`` the local addresses and
    when each was taken."""
    addresses = []
    for (namespace, address), at in logins.items():
        session = broker.session_for(namespace, address)
        principal = getattr(session, "principal", None)
        entry = [namespace, _s(address), at]
        if principal is not None:
            entry += [principal.name, principal.realm]
        addresses.append(entry)
    members = []
    for name in broker.topics.active():
        topic = broker.topics.get(name)
        if topic is None:  # active() names topics that exist
            continue
        for member, presence in topic.members.items():
            members.append([_s(name), member.protocol, _s(member.name), presence])
    filters = [_s(topic_filter) for topic_filter in broker.filtered.counts]
    shares = [[_s(group), _s(topic_filter), count] for (group, topic_filter), count in broker.filtered.groups()]
    return {"addresses": addresses, "members": members, "filters": filters, "shares": shares}
