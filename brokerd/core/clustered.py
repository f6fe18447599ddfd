"""The router's paths for a node of a cluster: a multicast whose shared groups the engine
places and whose run it forwards, a unicast to an address another node holds, and what the
other nodes accepted (a run, its opened envelope, a shared group's share, a unicast, a
broadcast), delivered here.

A mixin of :class:`~brokerd.core.router.Router`, apart so that the router's module reads as
the single node's paths and this one as what a cluster adds: :meth:`Router.install` puts
:meth:`ClusterPaths._multicast_clustered` in the multicast path only when the engine is shared.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from brokerd.core.access import AccessControl, Perm, inbox
from brokerd.core.message import Message
from brokerd.core.principal import NOBODY
from brokerd.core.publication import (
    Multicast,
    RemoteBroadcast,
    RemoteMulticast,
    RemoteRun,
    RemoteShare,
    RemoteUnicast,
    Unicast,
)
from brokerd.core.topics import FanOut, by_format
from brokerd.interfaces import IBrokerObserver, IEngine, ISubscriber, IWireFormat

if TYPE_CHECKING:
    from collections.abc import Iterable

    from brokerd.core.filtered import FilterSubscriptions
    from brokerd.core.sampling import DeliverySampler
    from brokerd.core.stats import BrokerStats
    from brokerd.core.topics import TopicRegistry

NO_GROUPS: frozenset[tuple[bytes, bytes]] = frozenset()
"""What a node of a cluster serves of the shared groups for a run another node accepted: none
(the publishing node sends each group's share to the node it chose, :class:`RemoteShare`)."""


class ClusterPaths:
    """The paths of :class:`~brokerd.core.router.Router` that only a node of a cluster takes."""

    stats: BrokerStats
    topics: TopicRegistry
    filtered: FilterSubscriptions
    addresses: dict[tuple[str, bytes], ISubscriber]
    filtering: bool
    access: AccessControl
    engine: IEngine
    observer: IBrokerObserver | None
    sampler: DeliverySampler | None
    sampling: bool
    _forward: Callable[[list[Message], dict[str, bytes] | None], None] | None

    if TYPE_CHECKING:
        def _accept(self, messages: list[Message]) -> None: ...
        def check_publish(self, message: Message, topic: bytes) -> None: ...
        def fan_out(self, messages: list[Message], exclude: ISubscriber | None,
                    stamps: list[tuple[IWireFormat, int, int]] | None = None,
                    rendered: dict[str, bytes] | None = None, fanout: FanOut | None = None,
                    groups: frozenset[tuple[bytes, bytes]] | None = None) -> int: ...
        def _send_to(self, recipient: ISubscriber, messages: list[Message]) -> None: ...
        def members_of(self, names: Iterable[bytes]) -> dict[ISubscriber, None]: ...

    def _multicast_clustered(self, publication: Multicast) -> int:
        """A node of a cluster: the engine first chooses which node serves each shared group
        the run matches (it sends the run to the chosen other nodes itself); this node routes
        to its members, one member of each group it serves, and forwards the run to the other
        nodes' plain members, with the bytes rendered here for the portable wire formats, so a
        node whose members all take those never decodes it (docs/cluster.md)."""
        messages = publication.messages
        self._accept(messages)
        groups = self.engine.place_shared(messages)
        forward, sampler = self._forward, self.sampler
        assert forward is not None  # this stage is installed only with a shared engine
        if self.sampling and sampler is not None and groups is None:
            forward(messages, None)
            return sampler.route(messages, publication.exclude)
        rendered: dict[str, bytes] = {}
        delivered = self.fan_out(messages, publication.exclude, None, rendered, None, groups)
        forward(messages, rendered)
        return delivered

    def _remote_multicast(self, publication: RemoteMulticast) -> int:
        """Another node checked and counted the run: here it only counts as delivered."""
        return self.fan_out(publication.messages, None, None, None, None, NO_GROUPS)

    def _remote_run(self, publication: RemoteRun) -> int:
        """When every local wire format of the topic is portable and the run carries its
        bytes, each member gets them with one ``send`` and the messages are never decoded (the
        observer gets the run's summary: protocol, sender, topic, kind, count, payload bytes);
        otherwise the run is decoded (EnvelopeError when it does not parse; nothing was sent)."""
        run = publication.run
        first = run.first
        topic = self.topics.get(first.target)
        sections = run.sections
        observer = self.observer
        if topic is None or not sections or self.filtering or (
                observer is not None and not getattr(observer, "summarizes_runs", False)):
            return self._remote_multicast(RemoteMulticast(run.messages()))
        fanout = topic.fanout()
        for fmt, _members in fanout:
            if not (fmt.portable and fmt.protocol in sections):
                return self._remote_multicast(RemoteMulticast(run.messages()))
        count = run.count
        routed = self.stats.routed_by[first.protocol]
        reached = 0
        for fmt, members in fanout:
            data = sections[fmt.protocol]
            for member in members:
                member.send(data)
            reached += len(members)
            routed[fmt] += len(members) * count
        self.stats.delivered += reached * count
        if observer is not None:
            observer.run_summary_routed(first.protocol, first.sender_name, first.target, first.kind, count,  # type: ignore[attr-defined]  # only an observer that summarizes_runs gets here: an optional capability IBrokerObserver does not declare
                                        run.total, reached, 0)
        return reached * count

    def _remote_share(self, publication: RemoteShare) -> int:
        """Another node chose this one to serve the shared group: one member here takes the
        run; 0 when none may (none left, or the access list lets none read the topic), and the
        engine tells the publishing node, which chooses again.  A member that is also a plain
        subscriber of the topic got the run from the topic's channel and is not sent it twice
        (as on one node)."""
        messages = publication.messages
        group = self.filtered.group(publication.key)
        name = messages[0].target
        assert name is not None  # a shared group's run names its topic
        member = None if group is None else group.pick(name, self.access)
        if member is None:
            return 0
        _plain, reached = self.filtered.fanout(name, self.topics.get(name), self.access, NO_GROUPS)
        if member not in reached:
            self.fan_out(messages, None, None, None, ((member.wire_format, (member,)),))
        return 1

    def _unicast_remote(self, publication: Unicast) -> int:
        """Hand the run to the engine, for the node that holds the address; the messages it
        accepted (0: no node does)."""
        first = publication.messages[0]
        if self.access.policy is not None:
            remote = self.engine.principal_of(publication.namespace, publication.target)
            if remote is not None:
                self.check_publish(first, inbox(remote))
        unicast = self.engine.unicast
        accepted = sum(1 for message in publication.messages if unicast(message, publication.namespace))
        self.stats.published += accepted
        self.stats.accepted_by[first.protocol] += accepted
        return accepted

    def _remote_unicast(self, publication: RemoteUnicast) -> int:
        """The access list is asked here, where the recipient's principal is known; a message
        it forbids is dropped (0, as when the session left)."""
        recipient = self.addresses.get((publication.namespace, publication.target))
        if recipient is None:
            return 0
        message = publication.message
        if self.access.policy is not None:
            principal = message.principal
            if principal is not None and not self.access.allows(principal, inbox(recipient.principal), Perm.PUBLISH):
                return 0
        self._send_to(recipient, [message])
        return 1

    def _remote_broadcast(self, publication: RemoteBroadcast) -> int:
        """The access list is applied again here to each topic, by the message's principal, so
        a node with the same policy reaches exactly the topics the sender's node did."""
        message = publication.message
        names = publication.topics
        access = self.access
        if access.policy is not None:
            principal = message.principal if message.principal is not None else NOBODY
            names = [name for name in names if access.allows(principal, name, Perm.PUBLISH)]
        return self.fan_out([message], None, None, None, by_format(self.members_of(names)))
