"""The router: every message any front end (or another node of a cluster) delivers enters here,
through one method, :meth:`Router.route`, as a typed publication (brokerd.core.publication).

Why one entry point: the access decision, the statistics and the event log used to be redone,
in part, by each of a dozen routing methods, and a path that ran beside the main one could skip
them.  Here each kind of publication has one path, and each path is a pipeline of stages that
:meth:`Router.install` puts together from what the node is configured with:

* the access decision: the access list when there is one, else only the check that nobody but
  the broker publishes to a system topic;
* the statistics (always: plain counters);
* the delivery-latency sampler, only when one is configured;
* cluster forwarding, only when the engine is shared;
* the fan-out, rendered once per wire format;
* the observer's per-message report, only when the observer records messages (the operator log
  in front of a disabled event log does not);
* the retain stage, only when the broker keeps retained messages: each message of a run its
  publisher asked to retain becomes its topic's retained message (brokerd.core.retained, with
  its bounds and per-publisher quotas), after the access decision let the run through.

The retained messages a new subscription matches come back through here as a
:class:`RetainedReplay`: the reader's access decision, the statistics and the observer, as for
a live message, then the session's paged sender.

A stage that is not configured is not in the path: a single node with no access list, no
sampler and no event log runs the access check of system topics, the counters and the fan-out,
and tests nothing else.  The durable hand-off (:meth:`brokerd.core.broker.Broker.keep`) stays a
call of its own because the publisher's acknowledgement waits on the Deferred it returns.
Everything here runs on the reactor thread and never blocks.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

from brokerd.core.access import SYSTEM_TOPICS, AccessControl, Perm, inbox
from brokerd.core.clustered import ClusterPaths
from brokerd.core.engine import IN_MEMORY
from brokerd.core.message import Message
from brokerd.core.principal import NOBODY
from brokerd.core.publication import (
    KEEP,
    KEEP_FOR_FILTERS,
    Broadcast,
    Multicast,
    Publication,
    RemoteBroadcast,
    RemoteMulticast,
    RemoteRun,
    RemoteShare,
    RemoteUnicast,
    RetainedReplay,
    StoredPage,
    Unicast,
    Unstored,
)
from brokerd.core.retained import RetainedMessages, RetainRefused
from brokerd.core.topics import FanOut, by_format
from brokerd.errors import Forbidden
from brokerd.interfaces import IBrokerObserver, IEngine, ISubscriber, IWireFormat

if TYPE_CHECKING:
    from brokerd.core.durable import DurableService
    from brokerd.core.filtered import FilterSubscriptions
    from brokerd.core.sampling import DeliverySampler
    from brokerd.core.stats import BrokerStats
    from brokerd.core.topics import Topic, TopicRegistry

_SYSTEM = SYSTEM_TOPICS[:1]
"""A topic starting with this may be a system topic: checked even without a policy."""

Stamps = list[tuple[IWireFormat, int, int]]


class Router(ClusterPaths):
    """Routes publications to the sessions of this node and, in a cluster, to the other nodes.

    It shares its tables with the broker that owns it: ``addresses`` ((namespace, address) to
    session), ``joined`` (session to the topics it joined), ``topics`` and ``filtered``;
    ``filtering`` is whether some filter has a member (the one attribute routing tests for
    filters).  Change ``access``, ``observer``, ``engine`` or ``sampler`` with :meth:`install`."""

    def __init__(self, stats: BrokerStats, topics: TopicRegistry, filtered: FilterSubscriptions,
                 addresses: dict[tuple[str, bytes], ISubscriber], joined: dict[ISubscriber, dict[bytes, Topic]]) -> None:
        self.stats = stats
        self.topics = topics
        self.filtered = filtered
        self.addresses = addresses
        self.joined = joined
        self.filtering = False
        self.access = AccessControl(None)
        self.engine: IEngine = IN_MEMORY
        self.observer: IBrokerObserver | None = None
        """The observer told of each routed message; None when there is none or it records
        none (``records_messages`` false), so the path has no observer stage."""
        self.sampler: DeliverySampler | None = None
        self.sampling = False
        """Whether the next multicast is timed (set by the sampler at most once per its
        interval; tested only on the path a sampler is installed in)."""
        self._forward: Callable[[list[Message], dict[str, bytes] | None], None] | None = None
        self.forwards = False
        """Whether the engine is shared (a node of a cluster): what the subscription paths
        test before they tell the engine."""
        self.retained: RetainedMessages | None = None
        """Where the retain stage keeps what publishers ask to retain; None: no retain stage."""
        self._deliver_multicast: Callable[[Multicast], int] = self._multicast
        """The multicast path behind the retain stage, when there is one."""
        self.durable: DurableService | None = None
        """Where the durable stage keeps runs for durable subscribers; None: no durable stage."""
        self._keep_after: Callable[[Multicast], int] = self._multicast
        """The multicast path behind the durable stage, when there is one."""
        self._paths: dict[type, Callable[[Any], int]] = {}
        self.install()

    def install(self, *, access: AccessControl | None = None, observer: Any = False, engine: IEngine | None = None,
                sampler: Any = False, retained: Any = False,
                durable: DurableService | None | Literal[False] = False) -> None:
        """Change what the router is configured with (what is not given stays; ``retained``
        or ``durable`` None removes its stage) and put each path's stages together again."""
        if access is not None:
            self.access = access
        if observer is not False:
            self.observer = observer if observer is not None and getattr(observer, "records_messages", True) else None
        if engine is not None:
            self.engine = engine
            self._forward = engine.forward if engine.shared else None
            self.forwards = engine.shared
        if sampler is not False:
            self.sampler = sampler
        if retained is not False:
            self.retained = retained
        if durable is not False:
            self.durable = durable
        if self._forward is not None:
            multicast = self._multicast_clustered
        elif self.sampler is not None:
            multicast = self._multicast_sampled
        else:
            multicast = self._multicast
        if self.retained is not None and multicast != self._multicast:  # _multicast retains itself
            self._deliver_multicast = multicast
            multicast = self._multicast_retaining
        if self.durable is not None:
            self._keep_after = multicast
            multicast = self._multicast_keeping
        self._paths = {
            Multicast: multicast,
            Unicast: self._unicast,
            Broadcast: self._broadcast,
            RemoteMulticast: self._remote_multicast,
            RemoteRun: self._remote_run,
            RemoteShare: self._remote_share,
            RemoteUnicast: self._remote_unicast,
            RemoteBroadcast: self._remote_broadcast,
            RetainedReplay: self._retained_replay,
            StoredPage: self._stored_page,
            Unstored: self._unstored,
        }

    def route(self, publication: Publication) -> int:
        """Deliver ``publication``; what it returns depends on its kind: the (message,
        session) deliveries of a multicast or broadcast; the messages accepted of a unicast (0:
        no session has the address, here or on another node); 1 when a member of a shared
        group took a :class:`RemoteShare`, else 0; for a :class:`RemoteUnicast` 1 when it was
        handed to the session, 0 when the session left or the access list forbids it; for a
        :class:`RetainedReplay` how many of its messages were dealt with (sent or refused),
        fewer than all when its sink filled up.

        Raises Forbidden when the sender's principal may not publish there (a multicast to
        its topic, a unicast to the recipient's login topic, brokerd.core.access.inbox)."""
        return self._paths[publication.__class__](publication)

    # ------------------------------------------------------------------ access decision

    def check_publish(self, message: Message, topic: bytes) -> None:
        """Raise Forbidden unless the message's principal may publish to ``topic``.  Called
        when there is a policy, or for a topic that may be a system topic (only the broker
        publishes there).  A message that names no principal (a program embedding the broker
        that did not say who publishes) is checked as NOBODY, the anonymous login: code that
        should bypass the list says so with a SERVICE principal (brokerd.core.principal.BROKER),
        which AccessControl allows without asking."""
        principal = message.principal
        if principal is None:
            principal = NOBODY
        if not self.access.allows(principal, topic, Perm.PUBLISH):
            raise Forbidden(topic)

    def _accept(self, messages: list[Message]) -> None:
        """The access decision and the statistics of a multicast run from this node."""
        first = messages[0]
        topic = first.target
        assert topic is not None  # a multicast names its topic (Message.target)
        if self.access.policy is not None or topic[:1] == _SYSTEM:
            self.check_publish(first, topic)
        stats = self.stats
        stats.published += len(messages)
        stats.accepted_by[first.protocol] += len(messages)

    # ------------------------------------------------------------------ multicast

    def _multicast(self, publication: Multicast) -> int:
        """A single node without a sampler: accept, fan out, and with a retained store keep what
        asks for it (the retain stage inlined here: a flag's test instead of a call per run)."""
        messages = publication.messages
        first = messages[0]  # _accept, inlined: the path every single node's multicast takes
        topic = first.target
        assert topic is not None  # a multicast names its topic (Message.target)
        if self.access.policy is not None or topic[:1] == _SYSTEM:
            self.check_publish(first, topic)
        stats = self.stats
        stats.published += len(messages)
        stats.accepted_by[first.protocol] += len(messages)
        delivered = self.fan_out(messages, publication.exclude)
        if first.details.retained and self.retained is not None:
            self._retain(messages)
        return delivered

    def _multicast_sampled(self, publication: Multicast) -> int:
        """A single node with a delivery-latency sampler: a run it asked for is timed."""
        messages = publication.messages
        self._accept(messages)
        sampler = self.sampler
        if self.sampling and sampler is not None:  # installed only with a sampler
            return sampler.route(messages, publication.exclude)
        return self.fan_out(messages, publication.exclude)

    def _multicast_retaining(self, publication: Multicast) -> int:
        """The retain stage, after the multicast path (which raises Forbidden before anything
        is delivered when the publisher may not publish there, so nothing forbidden is
        retained): a run whose first message is to be retained has each such message kept.
        A retain the store refuses (a bound, the publisher's quota: counted and logged there)
        leaves the message live only."""
        delivered = self._deliver_multicast(publication)
        messages = publication.messages
        if messages[0].details.retained and self.retained is not None:
            self._retain(messages)
        return delivered

    def _multicast_keeping(self, publication: Multicast) -> int:
        """The durable stage, after the live delivery (which raises Forbidden before anything
        is delivered or kept when the publisher may not publish there): a run whose topic some
        durable subscription covers is kept for its subscribers, and ``publication.kept`` is
        the Deferred its publisher's acknowledgement waits for.  A topic none covers costs a
        cached lookup and leaves ``kept`` None (or the ``flows``' own commit)."""
        delivered = self._keep_after(publication)
        durable = self.durable
        assert durable is not None  # this stage is installed only with a durable service
        messages = publication.messages
        topic = messages[0].target
        assert topic is not None  # a multicast names its topic (Message.target)
        flows = publication.flows
        keeping = publication.keeping
        if keeping == KEEP:
            if durable.covers(topic):
                publication.kept = durable.keep(messages, flows=flows)
            elif flows:
                publication.kept = durable.put_flows(flows)
        elif keeping == KEEP_FOR_FILTERS and durable.index.has_filter_subscribers(topic):
            publication.kept = durable.keep(messages, filters_only=True)
        return delivered

    def _retain(self, messages: list[Message]) -> None:
        """Keep each message of the run marked retained (a refused one goes out live only)."""
        assert self.retained is not None  # called only with a retained store
        retain = self.retained.retain
        for message in messages:
            if message.details.retained:
                try:
                    retain(message)
                except RetainRefused:
                    pass

    def timed(self, messages: list[Message], exclude: ISubscriber | None, stamps: Stamps) -> int:
        """Fan out an accepted run as :meth:`fan_out` does, appending to ``stamps`` (wire format,
        recipients, time in ns) once each format's recipients were handed it: the
        delivery-latency sampler's route."""
        return self.fan_out(messages, exclude, stamps)

    # ------------------------------------------------------------------ retained replay

    def _retained_replay(self, replay: RetainedReplay) -> int:
        """Hand the retained messages of a new subscription to the reader's paged sender, each
        only if the access list lets the reader read its topic (what a live message to a
        filter subscription asks); counted and reported as a delivery to one session."""
        reader = replay.reader
        principal = reader.principal
        fmt = reader.wire_format
        access = self.access
        checked = access.policy is not None
        sink = replay.sink
        stats = self.stats
        observer = self.observer
        taken = 0
        for message in replay.messages:
            taken += 1
            if not checked or access.allows(principal, message.target or b"", Perm.SUBSCRIBE):
                sent = sink.send_retained(message)
                if sent:
                    stats.delivered += 1
                    stats.routed_by[message.protocol][fmt] += 1
                else:
                    stats.unrenderable += 1
                if observer is not None:
                    observer.message_routed(message, int(sent), int(not sent))
            if sink.full():
                break
        return taken

    # ------------------------------------------------------------------ stored

    def _stored_page(self, page: StoredPage) -> int:
        """Hand pending deliveries of the store to a durable subscriber's outbox, each only if
        the access list lets the subscriber's owner read its topic now: the decision made at
        the commit (DurableService.recipients) may have been taken back by a reload since.  A
        refused one goes to the outbox's ``forbid``.  The deliveries taken.  Counting and the
        event log's outcomes are the durable service's (``delivered``, ``acked``...), as the
        outbox sends and settles them."""
        sink = page.sink
        owner = page.owner
        access = self.access
        if owner is None or access.policy is None:
            for delivery in page.deliveries:
                sink.take(delivery)
            return len(page.deliveries)
        taken = 0
        for delivery in page.deliveries:
            if access.allows(owner, delivery.topic.encode("utf-8"), Perm.SUBSCRIBE):
                sink.take(delivery)
                taken += 1
            else:
                sink.forbid(delivery)
        return taken

    def _unstored(self, publication: Unstored) -> int:
        """To the durable subscribers of its topic connected here (and the explicit ones),
        rendered once per wire format, by the durable service, which asks the access list for
        each subscriber's owner as it does for a message it keeps: the sessions reached (0 on a
        node without a store)."""
        if self.durable is None:
            return 0
        return self.durable.offer_unstored(publication.message, publication.explicit)

    # ------------------------------------------------------------------ fan-out

    def fan_out(self, messages: list[Message], exclude: ISubscriber | None, stamps: Stamps | None = None,
                rendered: dict[str, bytes] | None = None, fanout: FanOut | None = None,
                groups: frozenset[tuple[bytes, bytes]] | None = None) -> int:
        """Render ``messages`` (one, or a run of one sender's to one topic) once per wire format,
        hand each session of the format but ``exclude`` the bytes with one ``send``, count and
        report it; return the (message, session) deliveries.  The sessions: those the topic
        reaches (members, filters, the shared ``groups`` this node serves, None: all), or
        ``fanout`` (a broadcast's peers).  ``stamps`` (a timed route) gets (wire format,
        recipients, time in ns) once each format's sessions were sent; ``rendered`` the bytes of
        each portable format that carried every message (for the other nodes of a cluster)."""
        first = messages[0]
        if fanout is None:
            name = first.target
            assert name is not None  # a multicast names its topic (Message.target)
            topic = self.topics.get(name)
            if self.filtering or topic is None:
                fanout, exclude = self._matching(name, topic, exclude, groups)
            else:
                fanout = topic.grouped or topic.fanout()
                if exclude is not None and exclude not in topic.members:
                    exclude = None
        stats = self.stats
        routed = stats.routed_by[first.protocol]
        count = len(messages)
        delivered = unrenderable = reached = 0
        dropped: list[int] | None = None
        for fmt, members in fanout:
            recipients = len(members) - (exclude is not None and exclude.wire_format is fmt)
            carried = count
            if count == 1:
                data = fmt.render_message(first)
                if data is None:
                    unrenderable += recipients
                    continue
            else:
                reached += recipients
                data = fmt.render_run(messages)
                if data is None:
                    data, carried, dropped = _render_partly(fmt, messages, recipients, dropped)
                    unrenderable += (count - carried) * recipients
                    if data is None:
                        continue
            if rendered is not None and carried == count and fmt.portable:
                rendered[fmt.protocol] = data
            if exclude is None:
                for member in members:
                    member.send(data)
            else:
                for member in members:
                    if member is not exclude:
                        member.send(data)
            delivered += recipients * carried
            routed[fmt] += recipients * carried
            if stamps is not None and self.sampler is not None:  # stamps come from the sampler
                stamps.append((fmt, recipients, self.sampler.clock_ns()))
        stats.delivered += delivered
        stats.unrenderable += unrenderable
        if self.observer is not None:
            self._report(messages, delivered, unrenderable, reached, dropped)
        return delivered

    def _matching(self, name: bytes, topic: Topic | None, exclude: ISubscriber | None,
                  groups: frozenset[tuple[bytes, bytes]] | None) -> tuple[FanOut, ISubscriber | None]:
        """The sessions by wire format that a message to ``name`` reaches when some filter has a
        member (the topic's members and those of its matching filters and shared groups) or the
        topic has none (its filters' only): and ``exclude`` if it is one of them, else None."""
        if not self.filtering:
            return (), None
        fanout, reached_by = self.filtered.fanout(name, topic, self.access, groups)
        return fanout, exclude if exclude is not None and exclude in reached_by else None

    def _report(self, messages: list[Message], delivered: int, unrenderable: int, reached: int,
                dropped: list[int] | None) -> None:
        """Tell the observer of a fan-out: one message as one, a run as a run; when some
        recipients could not be sent some messages of a run (``dropped``), each stretch of
        messages that reached the same number of sessions as a run of its own, so the event log
        counts every message's fan-out right."""
        observer = self.observer
        if observer is None:
            return
        if len(messages) == 1:
            observer.message_routed(messages[0], delivered, unrenderable)
            return
        if dropped is None:
            observer.messages_routed(messages, reached, 0)
            return
        start = 0
        for end in range(1, len(messages) + 1):
            if end == len(messages) or dropped[end] != dropped[start]:
                observer.messages_routed(messages[start:end], reached - dropped[start], dropped[start])
                start = end

    # ------------------------------------------------------------------ unicast

    def _unicast(self, publication: Unicast) -> int:
        """A run from one sender to one address, rendered and sent once (its wire format's
        ``render_run``, else message by message); the event log gets the run as one entry, so
        one UCAST costs about what one MCAST of a run costs (docs/performance-history.md).  A
        recipient on another node of a cluster is checked by the principal its node announced
        (that node checks again on delivery)."""
        messages = publication.messages
        recipient = self.addresses.get((publication.namespace, publication.target))
        if recipient is None:
            return 0 if self._forward is None else self._unicast_remote(publication)
        if self.access.policy is not None:
            self.check_publish(messages[0], inbox(recipient.principal))
        count = len(messages)
        stats = self.stats
        stats.published += count
        stats.accepted_by[messages[0].protocol] += count
        self._send_to(recipient, messages)
        return count

    def _send_to(self, recipient: ISubscriber, messages: list[Message]) -> None:
        """Render ``messages`` for one session and send them with one ``send``; count and
        report each (a run that its format renders whole as one entry)."""
        fmt = recipient.wire_format
        stats = self.stats
        observer = self.observer
        if len(messages) == 1:
            data = fmt.render_message(messages[0])
            parts = [data]
        else:
            data = fmt.render_run(messages)
            if data is not None:
                recipient.send(data)
                stats.delivered += len(messages)
                stats.routed_by[messages[0].protocol][fmt] += len(messages)
                if observer is not None:
                    observer.messages_routed(messages, 1, 0)
                return
            data, parts = _render_each(fmt, messages)
        if data is not None:
            recipient.send(data)
        sent = len(messages) - parts.count(None)
        stats.delivered += sent
        stats.unrenderable += len(messages) - sent
        if sent:
            stats.routed_by[messages[0].protocol][fmt] += sent
        if observer is not None:
            for message, part in zip(messages, parts):
                observer.message_routed(message, int(part is not None), int(part is None))

    # ------------------------------------------------------------------ broadcast

    def _broadcast(self, publication: Broadcast) -> int:
        """Once to each peer sharing a topic with the sender that the sender may publish to; in
        a cluster the other nodes get the message once each with the names of those topics."""
        message = publication.message
        sender = publication.sender
        self.stats.published += 1
        self.stats.accepted_by[message.protocol] += 1
        names = self.publishable(sender)
        peers = self.members_of(names)
        peers.pop(sender, None)
        delivered = self.fan_out([message], None, None, None, by_format(peers))
        if self._forward is not None and names:
            self.engine.broadcast(message, names)
        return delivered

    def publishable(self, session: ISubscriber) -> list[bytes]:
        """The topics ``session`` joined and the access policy lets it publish to."""
        access = self.access
        joined = self.joined.get(session, {})
        if access.policy is None:
            return list(joined)
        return [name for name in joined if access.allows(session.principal, name, Perm.PUBLISH)]

    def members_of(self, names: Iterable[bytes]) -> dict[ISubscriber, None]:
        """The local members of the topics ``names``, each once, in join order."""
        peers: dict[ISubscriber, None] = {}
        for name in names:
            topic = self.topics.get(name)
            if topic is not None:
                peers.update(dict.fromkeys(topic.members))
        return peers


def _render_partly(fmt: IWireFormat, messages: list[Message], recipients: int,
                   dropped: list[int] | None) -> tuple[bytes | None, int, list[int] | None]:
    """A run ``fmt``'s ``render_run`` declined, rendered message by message for ``recipients``
    sessions: the bytes of the messages it carries (None: none), how many those are, and
    ``dropped`` (per message, the sessions that could not be sent it; made at the first such
    message) counting these sessions where a message could not be carried."""
    data, parts = _render_each(fmt, messages)
    if None not in parts:
        return data, len(messages), dropped
    if dropped is None:
        dropped = [0] * len(messages)
    for index, part in enumerate(parts):
        if part is None:
            dropped[index] += recipients
    return data, len(messages) - parts.count(None), dropped


def _render_each(fmt: IWireFormat, messages: list[Message]) -> tuple[bytes | None, list[bytes | None]]:
    """``messages`` rendered one by one for ``fmt`` (its ``render_run`` declined the run): the
    bytes of those it carries, joined (None when it carries none), and each message's bytes
    (None where it cannot carry it)."""
    render = fmt.render_message
    parts = [render(message) for message in messages]
    carried = [part for part in parts if part is not None] if None in parts else parts
    return (b"".join(carried) if carried else None), parts
