"""The small interfaces that keep the Broker core free of protocol knowledge.

A front end (one per wire protocol) gives the core two things:

* an :class:`IWireFormat`: how that protocol renders a broker event (a message, a presence
  change) as bytes.  The core renders each event once per wire format and hands the same
  bytes to every recipient of that format ("encode once, write many").
* one :class:`ISubscriber` per connection, the "mind" in twisted.cred's sense: the object the
  core pushes rendered bytes to, and closes when a newer login takes its address.
"""
from __future__ import annotations

from twisted.internet.interfaces import (
    IReactorCore,
    IReactorSSL,
    IReactorTCP,
    IReactorThreads,
    IReactorTime,
    IReactorUNIX,
)
from zope.interface import Attribute, Interface


class IWireFormat(Interface):
    """Renders broker events for one wire protocol.

    Besides the two renderings every format has, it declares the optional features the core
    and a cluster ask of it; :class:`WireFormat` gives each its default, so a format states
    only those it has."""

    protocol = Attribute("The protocol's short name, e.g. 'ssmp'.")

    portable = Attribute(
        "bool (default False): the bytes it renders depend on the message only (not on the node, "
        "the time or the session) and every session of the format can be sent them as plain "
        "bytes.  A cluster then ships the bytes rendered on the publishing node to the other "
        "nodes, which send them without decoding the run (Router.route(RemoteRun))."
    )

    writes_after_read = Attribute(
        "bool (default False): its sessions hold what a read sends them until the read is "
        "handled, so the delivery-latency sampler (brokerd.core.sampling) takes its time after "
        "that write."
    )

    queued_delivery = Attribute(
        "bool (default False): the core's hand-over to its sessions is a queue, not a write, so "
        "the delivery-latency sampler takes no sample for it (the front end logs its own writes)."
    )

    def render_message(message):
        """Return the bytes that deliver ``message`` (a brokerd.core.message.Message), or None
        when this protocol cannot carry it (the core counts it as dropped)."""

    def render_run(messages):
        """The bytes of a run of messages of one kind from one sender to one topic
        (Router.route(Multicast)) or one address (Router.route(Unicast)), equal to the joined
        :meth:`render_message` results; or None to have them rendered one by one (the default:
        a format with a cheaper way to render a run, one join instead of one per message,
        provides it)."""

    def render_presence(topic, member, joined, presence):
        """Return the bytes that tell a presence watcher that ``member`` (an ISubscriber)
        joined (``joined`` True) or left ``topic`` (bytes); ``presence`` says whether the member
        itself asked for presence.  None when this protocol has no way to say it."""


class WireFormat:
    """The defaults of :class:`IWireFormat`'s optional features.  A front end's wire format
    subclasses it, implements IWireFormat's renderings and overrides what it has, so the core
    reads each feature as a plain attribute."""

    portable = False
    writes_after_read = False
    queued_delivery = False

    def render_run(self, messages: list) -> bytes | None:
        """Nothing cheaper than one rendering per message: the core renders them one by one."""
        return None


class ISubscriber(Interface):
    """One connected session, as the Broker core sees it."""

    protocol = Attribute("The protocol's short name; also the namespace of its ``address``.")
    name = Attribute("bytes: how this session is named as a sender and in presence events.")
    address = Attribute(
        "bytes or None: the unicast address others reach it by, in its protocol's own namespace "
        "(None: unreachable).  Two protocols' sessions never share an address."
    )
    wire_format = Attribute("The IWireFormat the core renders this session's events with.")
    principal = Attribute(
        "brokerd.core.principal.Principal: who the session proved to be (NOBODY before login); "
        "the access policy decides on it."
    )

    def send(data):
        """Write already-rendered bytes to the peer.  Must not raise and must not re-enter the
        core synchronously; a congested session may drop and count instead of writing."""

    def replaced():
        """A newer session logged in with this session's address: close this one."""

    # Optional: ``subscription_revoked(topic)``: a new access policy no longer lets this
    # session read ``topic``; the core has already taken it off the topic (a front end that
    # counts its subscriptions updates the count).  Only sessions that join core topics are
    # told (SMQP's never do, and have none), so the core looks it up on them.


class IBrokerObserver(Interface):
    """Optional observer of what the core does (the event log implements it).  One that
    records no routed message may say so with an attribute ``records_messages = False``: the
    router then leaves the per-message calls out of its paths (brokerd.core.router)."""

    def message_routed(message, recipients, dropped):
        """``message`` was accepted and handed to ``recipients`` sessions; ``dropped`` could
        not be rendered for their protocol."""

    def messages_routed(messages, recipients_each, dropped_each):
        """A run of ``messages`` to one topic was accepted; each was handed to
        ``recipients_each`` sessions and could not be rendered for ``dropped_each``."""

    def subscribed(session, topic):
        """``session`` joined ``topic`` (bytes)."""

    def unsubscribed(session, topic):
        """``session`` left ``topic``, by request or because it ended."""

    def session_attached(session):
        """A session logged in."""

    def session_detached(session):
        """A session ended (closed, replaced or lost)."""


class IAccessPolicy(Interface):
    """Topic permissions: the core asks it (and caches the answer) for every subscribe,
    publish and unicast of every protocol, SMQP's commands and embedded publishes included,
    when the broker has an access list."""

    def permissions(principal, topic):
        """The brokerd.core.access.Perm flags ``principal`` holds on the core ``topic`` (bytes,
        e.g. ``b"news/sec"``; SMQP's ``/news/sec``)."""


class IEngine(Interface):
    """Where the Broker's routing reaches beyond this process.

    The in-memory engine (brokerd.core.engine, the default) reaches nothing: one node is the
    whole broker.  A shared engine (the Redis engine of brokerd.cluster) forwards what local
    publishers send to the other nodes and hands what they send to `Router.route` as a `RemoteMulticast`,
    so that many nodes look like one broker to every client.
    """

    shared = Attribute(
        "bool: whether other nodes exist.  False lets the Broker skip the engine entirely on "
        "its publish path (one attribute test), so a single node pays nothing for it."
    )

    def start(broker):
        """Begin serving ``broker`` (a brokerd.core.broker.Broker): hook its topic listeners,
        connect.  Never blocks; returns None."""

    def stop():
        """Disconnect; a Deferred that fires once done, or None."""

    def forward(messages, rendered):
        """A run of multicast ``messages`` (one topic, in order) was accepted here and routed
        to the local members: send it to the other nodes.  ``rendered`` (a dict, or None) holds
        the run's bytes as each portable wire format (by its ``protocol``) rendered them for the
        local members, for nodes that can deliver them as they are.  Must not raise and must not block;
        it may queue, batch and drop (counted) when the shared medium is unreachable."""

    def unicast(message, namespace):
        """No local session of ``namespace`` has the address ``message.target``: send the
        message to the node whose session has it.  True when one is known to."""

    def broadcast(message, topics):
        """A broadcast ``message`` was accepted here for the peers of ``topics`` (its sender's
        topics that it may publish to) and delivered to the local ones: send it once to each
        other node with members of any of them, which hands it to
        `Router.route` as a `RemoteBroadcast`.  Must not raise or block."""

    def principal_of(namespace, address):
        """The Principal of the other node's session at ``address`` in ``namespace`` (as its
        node announced it), or None: the Broker checks a unicast to it against the access
        policy before sending, as it does for a local recipient."""

    def claim(namespace, name):
        """A local front end serves ``name`` in ``namespace`` (not a session address: e.g. a
        socket.mq application): tell the other nodes, whose :meth:`owner` then names this
        node.  Must not raise or block."""

    def release(namespace, name):
        """The local front end no longer serves ``name`` in ``namespace``."""

    def owner(namespace, name):
        """The id (str) of the other node that claimed ``name`` in ``namespace``, or None."""

    def serve(service, handler):
        """Hand every node message for ``service`` (a str) to ``handler(origin, data)``:
        ``origin`` the sending node's id, ``data`` bytes."""

    def send(origin, service, data):
        """Send ``data`` (bytes) for ``service`` to the node ``origin``; False when no other
        node is reachable (nothing was sent).  Messages to one node arrive in order."""

    node_listeners = Attribute(
        "list of callables: each is called with the id (str) of another node that left the "
        "cluster (said goodbye, or stopped answering)."
    )

    def session_attached(session):
        """A local session logged in (its address now belongs to this node)."""

    def session_detached(session):
        """A local session ended."""

    def member_changed(topic, session, joined, presence):
        """A local session joined (``joined`` True, with its ``presence`` flag) or left ``topic``."""

    def filter_changed(topic_filter, active):
        """A topic filter got its first local plain subscriber (``active`` True) or lost its
        last: the other nodes send this node the messages of the topics it matches (a shared
        group's members are told with :meth:`shared_changed`).  Must not raise or block."""

    def shared_changed(key, members):
        """This node's members of the shared group ``key`` ((group name, filter) bytes) are
        now ``members`` (an int; 0: none): tell the other nodes, which then choose among the
        nodes with members.  Must not raise or block."""

    def place_shared(messages):
        """A run of multicast ``messages`` (one topic) was accepted here and is about to be
        routed: choose the node that serves each shared group its topic matches, send the run
        to the chosen other nodes (which hand it to `Router.route` as a `RemoteShare`), and return
        the frozenset of group keys this node serves; None: every group matching is this
        node's own (as on a single node).  Must not raise or block."""

    def members(topic):
        """The other nodes' members of ``topic``: (member, presence) pairs, the member an
        ISubscriber that only presence rendering looks at."""

    def durable_changed(tree, subscribers, pending):
        """This node committed durable state to the store the nodes share: the topic tree
        (``tree`` True), the durable subscriptions of ``subscribers``, pending deliveries
        for ``pending`` (names).  Tell the other nodes, which hand it to
        :meth:`Broker.durable_announced`.  Must not raise or block; may batch."""

    def topics():
        """Topics with members on other nodes (bytes)."""

    def keep_out(principal, seconds):
        """This node keeps ``principal`` (brokerd.core.principal.Principal) out for
        ``seconds``: tell the other nodes, which hand it to :meth:`Broker.keep_out_announced`.
        Must not raise or block."""

    def other_nodes():
        """The names of the cluster's other live nodes (heard from within the node timeout),
        a set of str; None when there is no cluster (one node)."""


class IBrokerReactor(IReactorCore, IReactorTime, IReactorThreads, IReactorTCP, IReactorSSL, IReactorUNIX):
    """The reactor as brokerd uses it: running, shutdown triggers, timers, a thread pool,
    calls from threads, and the connections its endpoints make (TCP, TLS, UNIX sockets).

    A type for annotations only (no reactor declares it): Twisted types each facet of its
    reactor apart, and brokerd's services and commands use several at once."""
