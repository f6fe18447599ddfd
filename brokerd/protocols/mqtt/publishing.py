"""PUBLISH from the client, and the client's acknowledgements of what it was sent (MQTT 5.0
3.3-3.7, 4.3, 4.6; 3.1.1 the same sections).

The PUBLISHes of one read that go to one topic, one after the other, are one run: the core
routes it at once (``Router.route(Multicast)``: each recipient gets the run in one write, rendered
once per wire format) and stores it for durable subscribers in one store operation (the
router's durable stage: the Multicast's ``kept``), as SSMP and MCCHAT do with theirs.  Anything else read (another topic, any
other packet, the end of the read, a reason to close) routes the run first, so the order of
messages and of acknowledgements (4.6) is the order the client sent.  A QoS 1 or 2 PUBLISH is
answered once the core stored it, if it had to.  A mixin of
:class:`~.server.MQTTServerProtocol`, which has the connection's state.
"""
from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from brokerd.core.message import Details, Message, property_problem
from brokerd.core.publication import Multicast
from brokerd.core.retained import RetainRefused
from brokerd.errors import Forbidden
from brokerd.protocols.mqtt import reasons
from brokerd.protocols.mqtt.connection import ConnectionBase, PendingAnswer
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    NO_PROPERTIES,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
)
from brokerd.protocols.mqtt.topics import server_topic, topic_name_problem
from brokerd.protocols.mqtt.wire import core_message
from brokerd.store.base import StoreFull, log_unless_outage
from brokerd.store.records import PacketFlow

NOT_KEPT = "Storing an MQTT message for durable subscribers"
_PUBACK = b"\x40\x02"
"""A PUBACK of success before its Packet Identifier (3.4; v5 leaves out the reason code 0)."""
_NOT_FOUND = "no message with this Packet Identifier is in flight"


class Publishing(ConnectionBase):
    """The PUBLISH half of an MQTT connection (see the module docstring)."""

    _valid_topic: str | None = None
    """The topic name of this connection's last valid PUBLISH, and its UTF-8 (``_valid_target``)."""
    _valid_target = b""

    def do_PUBLISH(self, packet: Publish) -> None:
        session = self.session
        assert session is not None  # the decoder reads no PUBLISH before the CONNECT, handled once accepted
        factory = self.factory
        settings = factory.settings
        topic = packet.topic
        alias = packet.properties.topic_alias
        if alias is not None:
            if not 1 <= alias <= settings.mqtt_topic_alias_maximum:
                self._disconnect(reasons.TOPIC_ALIAS_INVALID, "topic alias out of range")
                return
            aliases = self._topic_aliases
            if aliases is None:
                aliases = self._topic_aliases = {}
            if topic:
                aliases[alias] = topic
            else:
                known = aliases.get(alias)
                if known is None:
                    self._disconnect(reasons.PROTOCOL_ERROR, "an unknown topic alias")
                    return
                topic = known
        if topic != self._valid_topic:  # checked once for PUBLISH after PUBLISH to one topic
            problem = topic_name_problem(topic, settings.mqtt_max_topic_length, settings.mqtt_max_topic_levels)
            if problem is not None:
                self._disconnect(reasons.TOPIC_NAME_INVALID, problem)
                return
            self._valid_topic, self._valid_target = topic, topic.encode("utf-8")
        qos = packet.qos
        packet_id = packet.packet_id or 0  # None at QoS 0, which is answered with none
        if qos == 2 and packet_id in session.received_qos2:
            self._publish_run()
            self._acknowledge([Pubrec(packet_id)], None)  # a resent one: answered, not published again
            return
        if qos and self._run_acks and self._receiving() >= settings.mqtt_max_inflight:
            self._publish_run()  # answered now, unless they wait for the store
        if qos and self._receiving() >= settings.mqtt_max_inflight or (
                qos == 2 and len(session.received_qos2) >= settings.mqtt_max_inflight):
            # The second: awaiting PUBREL since an earlier connection of the session (kept
            # with a stored session), which the client resends before new PUBLISHes (4.4).
            self._disconnect(reasons.RECEIVE_MAXIMUM_EXCEEDED, "more unacknowledged QoS 1 and 2 messages than the Receive Maximum")
            return
        target = self._valid_target
        if server_topic(topic):  # 4.7.2: a client may not speak for the server
            self._publish_run()
            self._refuse_publishes([(qos, packet_id)], reasons.TOPIC_NAME_INVALID, "$ topics are the server's")
            return
        if not factory.broker.may_publish(session.principal, target):
            self._publish_run()
            self._refuse_publishes([(qos, packet_id)], why=f"not authorized to publish to {topic}")
            return
        message = core_message(target, packet.payload, qos, packet.retain, packet.properties,
                               session.name, session.principal, factory.clock.seconds())
        if packet.properties is not NO_PROPERTIES:
            refusal = self._properties_refusal(message.details, packet.payload)
            if refusal is not None:
                self.factory.refused_properties += 1
                self._publish_run()
                self._refuse_publishes([(qos, packet_id)], *refusal)
                return
        if packet.retain:
            self._publish_run()  # a retained message starts a run (the router's retain stage keeps it)
            if qos and self.version == MQTT_5 and not self._may_retain(message):
                # Over a retained bound: a v5 client can be told (0x97), and nothing is published,
                # as the reason code says; QoS 0 and 3.1.1 cannot be, and go out live, not retained.
                self._refuse_publishes([(qos, packet_id)], reasons.QUOTA_EXCEEDED, "over the retained message quota")
                return
        run = self._run
        if run and run[0][0].target != target:
            self._publish_run()
        if qos:
            self._run_acks += 1
            if qos == 2:
                session.received_qos2.add(packet_id)
                if session.durable_name is not None:  # committed with the message (:mod:`.stored`)
                    self._run_flows.append(PacketFlow(session.durable_name, True, packet_id))
        self._run.append((message, qos, packet_id))

    def _may_retain(self, message: Message) -> bool:
        """Whether the router's retain stage will keep ``message`` (the core's bounds and its
        publisher's quota; a refusal is counted and logged there)."""
        try:
            self.factory.broker.retained.check(message)
        except RetainRefused:
            return False
        return True

    def _properties_refusal(self, details: Details, payload: bytes) -> tuple[int, str] | None:
        """Why a v5 PUBLISH with properties is refused, as (reason code, Reason String): its
        properties over the limits (0x97 Quota exceeded: the server's quota; 0x95 Packet too
        large is no PUBACK code), or a Payload Format Indicator of UTF-8 on a payload that is
        not (0x99, 3.3.2.3.2: other protocols take such a payload for text); None to publish."""
        settings = self.factory.settings
        problem = property_problem(details, settings.max_user_properties, settings.max_property_bytes)
        if problem is not None:
            return reasons.QUOTA_EXCEEDED, problem
        if details.payload_format == 1:
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                return reasons.PAYLOAD_FORMAT_INVALID, "the payload is not UTF-8, as its Payload Format Indicator says"
        return None

    def _receiving(self) -> int:
        """QoS 1 and 2 PUBLISHes of this connection whose flow is not over (4.9): not yet
        answered (routed or not), or answered PUBREC and waiting for their PUBREL.  The
        Receive Maximum this server announces bounds it (3.3.4: DISCONNECT 0x93 past it); a
        3.1.1 client, which is told no limit, is closed past the same one."""
        return self._unacknowledged + self._run_acks + len(self._releasing)

    def _publish_run(self) -> None:
        """Route the run (one topic), store it for durable subscribers, and answer its QoS 1
        and 2 PUBLISHes once it is stored."""
        run, self._run = self._run, []
        if not run:
            return
        self._run_acks = 0
        flows = self._run_flows
        if flows:
            self._run_flows = []
        broker = self.factory.broker
        # a run of one (a PUBLISH per read) without the comprehension's frame
        messages = [run[0][0]] if len(run) == 1 else [message for message, _qos, _packet_id in run]
        publication = Multicast(messages, None, flows or None)
        try:
            broker.route(publication)
        except Forbidden:  # a policy reload since may_publish: refused as it would be now
            self._refuse_publishes([(qos, packet_id) for _message, qos, packet_id in run],
                                   why="not authorized to publish to this topic")
            return
        kept = publication.kept  # the durable stage's commit (with the QoS 2 flows), or None
        if kept is None and len(run) == 1 and run[0][1] == 1 and not self._acks:
            # One QoS 1 PUBLISH per read, no durable subscriber, no answer waiting before
            # it (the common case with each PUBACK awaited): its PUBACK, success in either
            # version, is written now, without the acknowledgement objects and queue.
            if not self.closed:
                self.write_now(_PUBACK + run[0][2].to_bytes(2, "big"))
            return
        acks: list[Puback | Pubrec] = [Puback(packet_id) if qos == 1 else Pubrec(packet_id)
                                       for _message, qos, packet_id in run if qos]
        if acks:
            self._acknowledge(acks, kept)
        elif kept is not None:  # stored for durable subscribers all the same, as other protocols' messages
            kept.addErrback(log_unless_outage, self._log, NOT_KEPT)

    def _refuse_publishes(self, publishes: list[tuple[int, int]], refusal: int = reasons.NOT_AUTHORIZED,
                          why: str | None = None) -> None:
        """PUBLISHes the access list refuses (or, ``refusal``, 0x90 a client's to a server
        topic, 0x97 a retain over quota or properties over the limits, 0x99 a payload that is
        not the format its properties say): a QoS 1 or 2 one answered ``refusal`` in v5, with
        ``why`` as its Reason String unless the client asked for none (3.1.1 has no way to
        refuse, 3.3.5: acknowledged and dropped, as Mosquitto does; a 3.1.1 client sends no
        properties).  The access list's refusals are counted here, the others where they are
        decided (the core's retained quotas, :attr:`refused_properties`)."""
        if refusal in (reasons.NOT_AUTHORIZED, reasons.TOPIC_NAME_INVALID):
            self.factory.forbidden += len(publishes)
        reason = refusal if self.version == MQTT_5 else 0
        properties = self._problem(why if reason else None)
        acks: list[Puback | Pubrec] = []
        for qos, packet_id in publishes:
            if qos == 1:
                acks.append(Puback(packet_id, reason, properties))
            elif qos == 2:
                if reason and self.session is not None:
                    self.session.received_qos2.discard(packet_id)  # the flow ends with the refusal
                acks.append(Pubrec(packet_id, reason, properties))
        if acks:
            self._acknowledge(acks, None)

    def _acknowledge(self, acks: list[Puback | Pubrec], kept: Deferred[object] | None) -> None:
        """Answer QoS 1 and 2 PUBLISHes in their turn: at once, or once ``kept`` (the core
        storing them for durable subscribers) fired; messages that could not be stored are
        answered 0x80 in v5 (0x97 below the disk floor), and close a 3.1.1 connection (which
        has no way to say so)."""
        if kept is None and not self._acks:  # nothing to wait for, none before them: written now
            for ack in acks:
                released_by = _released_by_pubrel(ack)
                if released_by is not None:
                    self._releasing.add(released_by)
            if not self.closed:
                self.write_now(b"".join([encode(ack, self.version) for ack in acks]))
            return
        entries = [PendingAnswer(kept is None, encode(ack, self.version), _released_by_pubrel(ack)) for ack in acks]
        self._acks.extend(entries)
        self._unacknowledged += len(entries)
        if kept is None:
            self._write_acks()
            return

        def stored(_: object) -> None:
            for entry in entries:
                entry.ready = True
            self._write_acks()

        def failed(failure: Failure) -> None:
            log_unless_outage(failure, self._log, NOT_KEPT)
            if self.version != MQTT_5:
                self._acks.clear()
                self._close()
                return
            # below the disk floor: Quota exceeded, as a v5 client may try again later
            reason = reasons.QUOTA_EXCEEDED if failure.check(StoreFull) else reasons.UNSPECIFIED_ERROR
            why = self._problem("the store is nearly full" if reason == reasons.QUOTA_EXCEEDED
                                else "the message could not be stored")
            for entry, ack in zip(entries, acks):
                ack.reason_code = reason
                ack.properties = why
                entry.data = encode(ack, MQTT_5)
                entry.released_by = None
                if isinstance(ack, Pubrec) and self.session is not None:
                    self.session.received_qos2.discard(ack.packet_id)
            stored(None)

        kept.addCallbacks(stored, failed)

    def _write_acks(self) -> None:
        acks = self._acks
        ready = []
        while acks and acks[0].ready:
            answer = acks.popleft()
            ready.append(answer.data)
            self._unacknowledged -= 1
            if answer.released_by is not None:
                self._releasing.add(answer.released_by)
        if ready and not self.closed:
            self.write_now(ready[0] if len(ready) == 1 else b"".join(ready))

    # ------------------------------------------------------------------ acknowledgements from the client

    def do_PUBACK(self, packet: Puback) -> None:
        session = self.session
        assert session is not None  # as for PUBLISH: no acknowledgement is handled before the CONNECT was accepted
        session.acknowledged(packet.packet_id)

    def do_PUBREC(self, packet: Pubrec) -> None:
        session = self.session
        assert session is not None  # as for PUBLISH
        if packet.reason_code >= 0x80:  # v5: the client refused the message; it is done
            session.acknowledged(packet.packet_id)
            return
        found = session.received(packet.packet_id)
        reason = 0 if found or self.version != MQTT_5 else reasons.PACKET_IDENTIFIER_NOT_FOUND
        self._answer(encode(Pubrel(packet.packet_id, reason, self._problem(_NOT_FOUND if reason else None)),
                            self.version), found)

    def do_PUBCOMP(self, packet: Pubcomp) -> None:
        session = self.session
        assert session is not None  # as for PUBLISH: no acknowledgement is handled before the CONNECT was accepted
        session.acknowledged(packet.packet_id)

    def do_PUBREL(self, packet: Pubrel) -> None:
        session = self.session
        assert session is not None  # as for PUBLISH
        packet_id = packet.packet_id
        found = packet_id in session.received_qos2
        session.received_qos2.discard(packet_id)
        self._releasing.discard(packet_id)
        reason = 0 if found or self.version != MQTT_5 else reasons.PACKET_IDENTIFIER_NOT_FOUND
        answer = encode(Pubcomp(packet_id, reason, self._problem(_NOT_FOUND if reason else None)), self.version)
        durable = self.factory.broker.durable
        if found and session.durable_name is not None and durable is not None:
            # Not before the store forgot the identifier: after a restart a new PUBLISH
            # with it would be taken for this one again (:mod:`.stored`).
            d = durable.remove_flow(session.durable_name, True, packet_id)
            d.addErrback(log_unless_outage, self._log, "Ending a QoS 2 exchange of MQTT session {name}",
                         name=session.durable_name)
            self._answer(answer, d)
        else:
            self.transport.write(answer)

    def _answer(self, data: bytes, after: bool | Deferred[object]) -> None:
        """Write ``data`` now, or once ``after`` (a Deferred: the store has what it says)
        fired, unless the connection ended by then."""
        if not isinstance(after, Deferred):
            self.transport.write(data)
            return
        def write(_: object) -> None:
            if not self.closed:
                self.transport.write(data)

        after.addCallback(write)


def _released_by_pubrel(ack: Puback | Pubrec) -> int | None:
    """The Packet Identifier whose flow goes on after ``ack`` is written until the client's
    PUBREL: a PUBREC that accepted the message; None for one that ends the flow."""
    if isinstance(ack, Pubrec) and ack.reason_code < 0x80:
        return ack.packet_id
    return None
