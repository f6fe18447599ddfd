"""SMQP server links: this server logs in to another domain's server as an account and
subscribes there to what its own clients want from that domain (docs/smqp.md, Federation).

``--smqp-link DOMAIN=ENDPOINT`` names the other server (any Twisted client endpoint string;
``tls:`` with ``certificate=``/``privateKey=``/``trustRoots=`` for SMQPS); the link logs in
as ``--smqp-link-account`` with the password in ``--smqp-link-password-file``, or, with no
password file, with its TLS client certificate (method CERT).  Its channel is
``link_<this domain>`` (brokerd.protocols.smqp.federation), which is how the other server
knows it is a link and which domain it serves.

Local clients subscribe to ``/<domain>/<topic>`` (``/alpha_example/news`` for ``/news`` of
``alpha.example``); the link keeps one subscription on the other server per such topic
(wildcards included), adding and removing them as local subscriptions change.  The other
server's UAL decides whether the link account may subscribe; a refusal is logged and counted,
and the other topics go on.

Every NOTIFY MESSAGE the link gets is stored here first (:class:`~brokerd.protocols.smqp.
federation.Forwarded`) and acknowledged (``310 ACK``) only once committed: until then the
other server keeps it pending for the link and sends it again after its retry timeout or
when the link logs in again.  A lost connection is retried with a doubling delay
(:data:`FIRST_DELAY` to :data:`MAX_DELAY` seconds).  The state of each link is in the log
and in :meth:`Link.status` (the admin metrics).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypedDict

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from brokerd.core.subscriptions import MESSAGE
from brokerd.errors import ConfigurationError
from brokerd.interfaces import IBrokerReactor
from brokerd.protocols.endpoints import client_from_string
from brokerd.protocols.smqp.client import SMQPClientProtocol, SMQPError, connect
from brokerd.protocols.smqp.codec import encode_notify, encode_publish, format_datetime
from brokerd.protocols.smqp.delivery import login_key
from brokerd.protocols.smqp.events import Body, Notify, Reply
from brokerd.protocols.smqp.federation import (
    Forwarded,
    ForwardingHost,
    domain_leaf,
    is_outgoing,
    link_channel,
    out_subscriber,
    recipient_of,
)
from brokerd.protocols.smqp.mapping import stored_body
from brokerd.protocols.smqp.messages import read_publication
from brokerd.protocols.smqp.outbox import NoNotification, Outbox
from brokerd.store.records import MessageRecord

MAX_RECEIPTS = 65_536
"""Messages sent over a link whose receipt is still expected (the oldest are forgotten)."""
FIRST_DELAY = 0.5
"""Seconds before the first reconnection attempt of a link; doubled after every failure."""
MAX_DELAY = 30.0
"""The longest wait between reconnection attempts of a link."""


@dataclass(frozen=True)
class LinkSpec:
    domain: str
    endpoint: str


def parse_links(value: str | list[str] | None) -> tuple[LinkSpec, ...]:
    """``--smqp-link``: ``DOMAIN=ENDPOINT`` entries (repeated, or separated by blanks, or a
    TOML list).  Raises ConfigurationError naming the bad entry."""
    if not value:
        return ()
    items = value.split() if isinstance(value, str) else [str(v) for v in value]
    specs = []
    for item in items:
        domain, equals, endpoint = item.partition("=")
        if not equals or not domain or not endpoint or ":" not in endpoint:
            raise ConfigurationError(f"smqp-link: {item!r} is not DOMAIN=ENDPOINT")
        specs.append(LinkSpec(domain.lower(), endpoint))
    if len({spec.domain for spec in specs}) != len(specs):
        raise ConfigurationError("smqp-link: one link per domain")
    return tuple(specs)


class LinkHost(ForwardingHost, Protocol):
    """The SMQP factory as its links see it (brokerd.protocols.smqp.factory, which imports
    this module): as :class:`Forwarded` sees it, with the reactor the links connect and wait
    with, and the store of what they bring."""

    @property
    def clock(self) -> IBrokerReactor: ...

    @property
    def forwarded(self) -> Forwarded: ...


class LinkStatus(TypedDict):
    """A link as the admin API and the metrics show it."""

    domain: str
    state: str
    subscriptions: int
    connects: int
    received: int
    refused: int
    sent: int
    undeliverable: int


class Link:
    """One link to another domain's server."""

    _log = Logger()

    def __init__(self, factory: LinkHost, spec: LinkSpec, account: str, password: str | None) -> None:
        self.factory = factory
        self.spec = spec
        self.account = account
        self.password = password
        self.prefix = domain_leaf(spec.domain)
        """Local topics below ``/<prefix>`` are the other domain's."""
        self.state = "down"
        self.client: SMQPClientProtocol | None = None
        self.remote: set[str] = set()
        """Topics the link is subscribed to on the other server (``/news``)."""
        self.refused: dict[str, int] = {}
        """Topics the other server refused (code), not asked again until wanted anew."""
        self.counts = {"connects": 0, "received": 0, "refused": 0}
        self._delay = FIRST_DELAY
        self._timer: IDelayedCall | None = None
        self._running = False
        self._syncing = False
        self._again = False
        self._handling: Deferred = succeed(None)
        self.subscriber = out_subscriber(spec.domain)
        """The durable subscriber name of this link's outgoing point-to-point messages."""
        self.outbox: Outbox | None = None
        self._pushing: int | None = None
        self.receipts: OrderedDict[str, tuple[str, str, str]] = OrderedDict()
        """The other server's Smuid -> (publisher, our Smuid, our topic) of a message sent
        with a Receipt request (oldest first: the oldest goes past MAX_RECEIPTS, in
        constant time, which ``next(iter(dict))`` after many deletions is not)."""
        self.counts["sent"] = 0
        self.counts["undeliverable"] = 0

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self._running = True
        self._connect()

    def stop(self) -> None:
        self._running = False
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        client = self.client
        if client is not None and client.transport is not None:
            client.transport.loseConnection()

    def status(self) -> LinkStatus:
        counts = self.counts
        return {"domain": self.spec.domain, "state": self.state, "subscriptions": len(self.remote),
                "connects": counts["connects"], "received": counts["received"], "refused": counts["refused"],
                "sent": counts["sent"], "undeliverable": counts["undeliverable"]}

    def _set_state(self, state: str, reason: str = "") -> None:
        if state != self.state:
            self.state = state
            self._log.info("SMQP link to {domain} ({endpoint}) is {state}{reason}", domain=self.spec.domain,
                           endpoint=self.spec.endpoint, state=state, reason=f": {reason}" if reason else "")

    def _connect(self) -> None:
        self._timer = None
        if not self._running:
            return
        self._set_state("connecting")
        reactor = self.factory.clock
        try:
            endpoint = client_from_string(reactor, self.spec.endpoint)
        except (ValueError, TypeError) as exc:
            self._set_state("failed", f"bad endpoint: {exc}")
            return
        d = connect(endpoint, self._notified)
        d.addCallback(self._connected)
        d.addErrback(self._failed)

    def _connected(self, client: SMQPClientProtocol) -> Deferred:
        self.client = client
        client.when_closed().addBoth(self._lost, client)
        channel = link_channel(self.factory.domain)
        if self.password is not None:
            d = client.login(self.account, channel, self.password)
        else:
            d = client.login_cert(self.account, channel)

        def logged_in(_info: object) -> Deferred[Reply]:
            self.counts["connects"] += 1
            self._delay = FIRST_DELAY
            return client.command("LIST", "SUBSCRIPTIONS")

        def listed(reply: Reply) -> None:
            # The link's subscriptions there are durable: the ones it has are kept as they
            # are (subscribing again would add every retained message once more).
            self.remote = {line for line in reply.values if line.startswith("/")}
            self.refused.clear()
            self._set_state("up")
            self.changed()
            outbox = self.outbox = self.factory.service.attach(self)
            outbox.pump()

        return d.addCallback(logged_in).addCallback(listed)

    def _failed(self, failure: Failure) -> None:
        reason = failure.getErrorMessage()
        if failure.check(SMQPError):
            self._set_state("refused", f"login refused: {reason}")
        else:
            self._set_state("down", reason)
        client = self.client
        if client is not None and client.transport is not None:
            client.transport.loseConnection()
        elif client is None:
            self._retry()

    def _lost(self, _result: object, client: SMQPClientProtocol) -> None:
        if client is not self.client:
            return
        self.client = None
        self.remote.clear()
        self._pushing = None
        if self.outbox is not None:
            self.factory.service.detach(self.outbox)
            self.outbox = None
        if self.state == "up":
            self._set_state("down", "connection lost")
        self._retry()

    def _retry(self) -> None:
        if not self._running or self._timer is not None:
            return
        delay, self._delay = self._delay, min(self._delay * 2, MAX_DELAY)
        self._timer = self.factory.clock.callLater(delay, self._connect)

    # ------------------------------------------------------------------ subscriptions

    def wanted(self) -> set[str]:
        """The other server's topics local clients subscribe to (``/news``, ``/news/*``)."""
        head = self.prefix + "/"
        return {"/" + topic[len(head):] for topic in self.factory.service.index.topics(MESSAGE)
                if topic.startswith(head)}

    def changed(self) -> None:
        """Local subscriptions changed (or the link came up): subscribe and unsubscribe on
        the other server to match, one command at a time."""
        if self.state != "up":
            return
        if self._syncing:
            self._again = True
            return
        self._syncing = True
        self._sync()

    def _sync(self) -> None:
        client = self.client
        if client is None or self.state != "up":
            self._syncing = False
            return
        wanted = self.wanted()
        for topic in list(self.refused):
            if topic not in wanted:
                del self.refused[topic]
        missing = sorted(wanted - self.remote - set(self.refused))
        extra = sorted(self.remote - wanted)
        if missing:
            topic = missing[0]
            d = client.subscribe(topic)
            d.addCallbacks(self._subscribed, self._subscribe_refused, callbackArgs=(topic,), errbackArgs=(topic,))
        elif extra:
            topic = extra[0]
            d = client.unsubscribe(topic)
            d.addBoth(self._unsubscribed, topic)
        else:
            self._syncing = False
            if self._again:
                self._again = False
                self.changed()
            return
        d.addErrback(self._sync_failed)

    def _subscribed(self, _topics: object, topic: str) -> None:
        self.remote.add(topic)
        self._sync()

    def _subscribe_refused(self, failure: Failure, topic: str) -> None:
        failure.trap(SMQPError)
        error = failure.value
        assert isinstance(error, SMQPError)  # trap() passed only an SMQPError on
        code = error.code
        self.refused[topic] = code
        self.counts["refused"] += 1
        self._log.warn("SMQP link to {domain}: subscribing to {topic} refused: {reason}", domain=self.spec.domain,
                       topic=topic, reason=failure.getErrorMessage())
        self._sync()

    def _unsubscribed(self, _result: object, topic: str) -> None:
        self.remote.discard(topic)
        self._sync()

    def _sync_failed(self, failure: Failure) -> None:
        self._syncing = False
        self._log.info("SMQP link to {domain}: subscriptions not synchronised: {reason}",
                       domain=self.spec.domain, reason=failure.getErrorMessage())

    # ------------------------------------------------------------------ messages

    def _notified(self, notify: Notify) -> None:
        """A message from the other server: stored here, then acknowledged (in order)."""
        if notify.kind == "RECEIPT" and notify.body is not None:
            self._receipt(notify.body)
            return
        if notify.kind != "MESSAGE" or notify.body is None or len(notify.args) < 2:
            return
        topic, change = notify.args[0], notify.args[1]
        self._handling = self._handling.addCallback(lambda _: self._store(topic, change, notify))

    def _store(self, topic: str, change: str, notify: Notify) -> Deferred | None:
        client = self.client
        if client is None:
            return None
        body = notify.body
        assert body is not None
        try:
            publication = read_publication(body)
        except ValueError as exc:
            self._log.warn("SMQP link to {domain}: unreadable message ({error}); acknowledged and dropped",
                           domain=self.spec.domain, error=exc)
            return client.acknowledge().addErrback(lambda _: None)
        if change.upper() != "ADD":
            return client.acknowledge().addErrback(lambda _: None)
        d = self.factory.forwarded.store(self.spec.domain, topic, body, publication)

        def stored(_: object) -> Deferred | None:
            self.counts["received"] += 1
            if client.transport is None or not client.is_open:
                return None  # not acknowledged: the other server sends it again
            return client.acknowledge()

        def failed(failure: Failure) -> None:
            self._log.failure("SMQP link to {domain}: storing a message", failure, domain=self.spec.domain)
            if client.transport is not None:
                client.transport.loseConnection()  # unacknowledged: it comes again on the next login

        return d.addCallbacks(stored, failed).addErrback(lambda _: None)


    # ------------------------------------------------------------------ point to point out

    def can_notify(self) -> bool:
        """The outbox may hand over the next outgoing message (one at a time)."""
        return self.state == "up" and self.client is not None and self._pushing is None

    def write_notify(self, parts: list[bytes]) -> None:
        """The outbox's next outgoing message (or the same one again after the retry
        timeout, ignored while its PUBLISH is unanswered): PUBLISH it to the recipient on
        the other server; acknowledged here once that server answered."""
        outbox, client = self.outbox, self.client
        if outbox is None or client is None:
            return
        delivery = outbox.inflight
        if delivery is None or self._pushing == delivery.seq:
            return
        self._pushing = delivery.seq
        try:
            body = stored_body(delivery.data, self.factory.domain)
        except ValueError:
            body = Body()
        own = self.factory.domain.lower()
        publisher = ""
        local_smuid = ""
        attributes = []
        for name, value in body.attributes:
            key = name.lower()
            if key == "smuid":
                local_smuid = value
            elif key == "cmuid":
                publisher = value.partition("@")[0]
            elif key != "hops":
                attributes.append((name, value))
        hops = [h.strip() for n, v in body.attributes if n.lower() == "hops" for h in v.split(",") if h.strip()]
        attributes.append(("Hops", ",".join([*hops, own])))
        wants_receipt = any(n.lower() == "receipt" and v.strip().upper() in ("ONE", "ALL", "YES")
                            for n, v in body.attributes)
        if is_outgoing(delivery.topic):
            target = recipient_of(delivery.topic, self.spec.domain)
        else:  # published here to /<domain>/path (or a virtual topic pointing there)
            target = "/" + delivery.topic.partition("/")[2]
        d = client.send_raw(encode_publish(target, f"L{delivery.seq}", Body(tuple(attributes), body.sections)))

        def answered(reply: Reply) -> Deferred | None:
            if wants_receipt and len(reply.values) >= 2 and publisher:
                self.receipts[reply.values[1]] = (publisher, local_smuid, delivery.topic)
                if len(self.receipts) > MAX_RECEIPTS:
                    self.receipts.popitem(last=False)
            self.counts["sent"] += 1
            return self._settle(outbox, delivery.seq)

        def refused(failure: Failure) -> Deferred | None:
            error = failure.value
            if not isinstance(error, SMQPError) or error.code == 451:
                self._pushing = None  # not answered or not stored there: sent again later
                return None
            self.counts["undeliverable"] += 1
            self._log.warn("SMQP link to {domain}: {target} refused: {reason}; the message is dropped",
                           domain=self.spec.domain, target=target, reason=failure.getErrorMessage())
            return self._settle(outbox, delivery.seq)

        d.addCallbacks(answered, refused)
        d.addErrback(lambda failure: self._log.failure("SMQP link to {domain}: sending a message", failure,
                                                       domain=self.spec.domain))

    def _settle(self, outbox: Outbox, seq: int) -> Deferred | None:
        self._pushing = None
        if outbox is not self.outbox or outbox.inflight is None or outbox.inflight.seq != seq:
            return None
        try:
            d = outbox.acknowledge()
        except NoNotification:
            return None
        return d.addCallback(lambda _: outbox.pump())

    def _receipt(self, body: Body) -> None:
        """A receipt from the other server for a message sent over this link: to the
        publisher here, as a NOTIFY RECEIPT of its own message."""
        smuids = [v for n, v in body.attributes if n.lower() == "smuid"]
        found = next((self.receipts.pop(s) for s in reversed(smuids) if s in self.receipts), None)
        if found is None:
            return
        publisher, local_smuid, key = found
        attributes = []
        for name, value in body.attributes:
            if name.lower() == "smuid":
                continue
            if name.lower() == "topic":
                value = self.factory.service.display(key)
            attributes.append((name, value))
        if local_smuid:
            attributes.insert(1, ("Smuid", local_smuid))
        service = self.factory.service
        now = self.factory.clock.seconds()
        data = encode_notify("RECEIPT", service.display(key), body=Body(tuple(attributes), ()))
        seq = service.next_seq()
        record = MessageRecord(service.smuid(seq, format_datetime(now)), login_key(publisher),
                               "server", f"receipt/{seq}", now, None, 1, data, seq)
        d = service.publish(record, [(publisher, "RAW")], size=len(data))
        d.addErrback(lambda failure: self._log.failure("Storing a receipt from {domain}", failure, domain=self.spec.domain))


def read_password(path: str | Path | None) -> str | None:
    """The first line of ``--smqp-link-password-file`` (None when no file is given)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.readline().rstrip("\r\n")
    except OSError as exc:
        raise ConfigurationError(f"smqp-link-password-file {path}: {exc.strerror}") from None


class Links:
    """Every link of one SMQP factory."""

    def __init__(self, factory: LinkHost, specs: tuple[LinkSpec, ...], account: str | None,
                 password: str | None) -> None:
        if specs and not account:
            raise ConfigurationError("smqp-link needs --smqp-link-account")
        own = factory.domain.lower()
        if any(spec.domain == own for spec in specs):
            raise ConfigurationError(f"smqp-link: {own} is this server's own domain")
        for spec in specs:  # a bad endpoint (or certificate file) stops the start, not the link later
            try:
                client_from_string(factory.clock, spec.endpoint)
            except Exception as exc:
                raise ConfigurationError(f"smqp-link {spec.domain}={spec.endpoint}: {exc}") from None
        self.links = [Link(factory, spec, account or "", password) for spec in specs]

    def start(self) -> None:
        for link in self.links:
            link.start()

    def stop(self) -> None:
        for link in self.links:
            link.stop()

    def changed(self) -> None:
        for link in self.links:
            link.changed()

    def status(self) -> list[LinkStatus]:
        return [link.status() for link in self.links]

    def for_key(self, key: str) -> Link | None:
        """The link whose domain topic ``key`` is below (``alpha_example/news``), if any."""
        head = key.partition("/")[0]
        return next((link for link in self.links if link.prefix == head and "/" in key), None)

    def get(self, domain: str) -> Link | None:
        """The link to ``domain`` (case-insensitive), if any."""
        domain = domain.lower()
        return next((link for link in self.links if link.spec.domain == domain), None)
