"""CONNECT: the login and the session a connection binds to (MQTT 5.0 3.1 and 3.2; 3.1.1 3.1, 3.2).

Credentials go to the portal every protocol shares (brokerd.auth): a username and password,
else a verified TLS client certificate, else (``--mqtt-anonymous``, the default) the anonymous
principal.  Then the front end's sessions (:class:`~.sessions.MQTTSessions`) give the session
of the client identifier, if the principal may have it, and the CONNACK says what the server
grants.  A mixin of :class:`~.server.MQTTServerProtocol`, which has the connection's state.
"""
from __future__ import annotations

from collections.abc import Callable
from twisted.cred.credentials import ICredentials, UsernamePassword
from twisted.cred.error import UnauthorizedLogin, UnhandledCredentials
from twisted.python.failure import Failure

from brokerd.auth.credentials import ClientCertificate
from brokerd.auth.identity import Identity
from brokerd.auth.realm import IIdentity
from brokerd.auth.tls import peer_names
from brokerd.core.message import property_problem
from brokerd.core.principal import NOBODY, Principal
from brokerd.events.log import transport_source
from brokerd.protocols.mqtt import reasons
from brokerd.protocols.mqtt.connection import ConnectionBase
from brokerd.protocols.mqtt.encoder import encode
from brokerd.protocols.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    NO_PROPERTIES,
    Connack,
    Connect,
    Properties,
)
from brokerd.protocols.mqtt.quotas import ANONYMOUS_SESSIONS
from brokerd.protocols.mqtt.topics import (
    topic_name_problem,
)
from brokerd.protocols.mqtt.wire import message_details

RESPONSE_PREFIX = "reply/"
"""What a v5 client that asks for Response Information (3.1.2.11.7) is told to build its
response topics from: ``reply/<client identifier>``, a topic of its own by convention (the
access list decides, as for any topic, who may subscribe and publish there)."""


def response_information(client_id: str) -> str | None:
    """The Response Information for ``client_id``; None when its identifier holds a wildcard
    or is empty, which a topic cannot (the server then sends none, as 3.2.2.3.15 allows)."""
    if not client_id or "+" in client_id or "#" in client_id:
        return None
    return RESPONSE_PREFIX + client_id


NEVER_EXPIRES = 0xFFFFFFFF
"""A v5 Session Expiry Interval that never ends (3.1.2.11.2)."""
# 3.1.1 CONNACK return codes (3.2.2.3) for the v5 reasons this server refuses with.
_V3_CONNACK = {
    reasons.UNSUPPORTED_PROTOCOL_VERSION: 1,
    reasons.CLIENT_IDENTIFIER_NOT_VALID: 2,
    reasons.SERVER_UNAVAILABLE: 3,
    reasons.SERVER_BUSY: 3,
    reasons.BAD_USER_NAME_OR_PASSWORD: 4,
    reasons.NOT_AUTHORIZED: 5,
    reasons.QUOTA_EXCEEDED: 3,
}


class Login(ConnectionBase):
    """The CONNECT half of an MQTT connection (see the module docstring)."""

    def do_CONNECT(self, packet: Connect) -> None:
        factory = self.factory
        settings = factory.settings
        decoder = self._decoder
        assert decoder is not None  # made with the connection, before it reads the CONNECT
        self.version = decoder.version or MQTT_311
        self._connect = packet
        properties = packet.properties
        if properties.authentication_method is not None:
            self._refuse_connect(reasons.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not offered")
            return
        client_id = packet.client_id
        if not client_id:
            if self.version == MQTT_311 and not packet.clean_start:
                self._refuse_connect(reasons.CLIENT_IDENTIFIER_NOT_VALID, "an empty client identifier needs a clean session")
                return
            client_id = factory.sessions.assign_client_id()
            self._assigned = client_id
        elif len(client_id.encode("utf-8")) > settings.mqtt_max_client_id:
            self._refuse_connect(reasons.CLIENT_IDENTIFIER_NOT_VALID, "client identifier too long")
            return
        self._client_id = client_id
        will = packet.will
        if will is not None and topic_name_problem(will.topic, settings.mqtt_max_topic_length,
                                                   settings.mqtt_max_topic_levels) is not None:
            self._refuse_connect(reasons.TOPIC_NAME_INVALID, "the will topic is not a valid topic name")
            return
        if will is not None and will.properties is not NO_PROPERTIES:
            problem = property_problem(message_details(will.qos, will.retain, will.properties, 0.0),
                                       settings.max_user_properties, settings.max_property_bytes)
            if problem is not None:
                self._refuse_connect(reasons.QUOTA_EXCEEDED, f"the will's {problem}")
                return
        credentials = self._credentials(packet)
        if credentials is None:
            if not settings.mqtt_anonymous:
                self._refuse_connect(reasons.NOT_AUTHORIZED, "this server needs a username or a client certificate",
                                     event="anonymous login refused")
                return
            self._logged_in(NOBODY)
            return
        self._logging_in = True
        self.transport.pauseProducing()
        d = factory.portal.login(credentials, self, IIdentity)
        d.addCallbacks(self._login_succeeded, self._login_failed)
        d.addErrback(self._login_broke)

    def _credentials(self, packet: Connect) -> ICredentials | None:
        names = peer_names(self.transport)
        if packet.username is not None and packet.password is not None:
            return UsernamePassword(packet.username.encode("utf-8"), packet.password)
        if names:
            identifier = packet.username if packet.username is not None else names[0]
            return ClientCertificate(identifier.encode("utf-8"), names)
        if packet.username is not None or packet.password is not None:
            return UsernamePassword((packet.username or "").encode("utf-8"), packet.password or b"")
        return None

    def _login_succeeded(self, result: tuple[object, Identity, Callable[[], None]]) -> None:
        _interface, identity, _logout = result
        self._end_login()
        if not self.closed:
            self._logged_in(identity.principal)
            self._continue()

    def _login_failed(self, failure: Failure) -> None:
        failure.trap(UnauthorizedLogin, UnhandledCredentials)
        self._end_login()
        self._refuse_connect(reasons.BAD_USER_NAME_OR_PASSWORD, "bad user name or password",
                             event=failure.getErrorMessage() or "refused")

    def _login_broke(self, failure: Failure) -> None:
        self._log.failure("MQTT login of {client!r} failed", failure, client=self._client_id)
        self._end_login()
        self._refuse_connect(reasons.SERVER_UNAVAILABLE, "the login could not be checked", event="checker error")

    def _end_login(self) -> None:
        self._logging_in = False
        if not self.closed:
            self.transport.resumeProducing()

    def _continue(self) -> None:
        pending, self._pending = self._pending, []
        self._handle(pending, None)

    def _refuse_connect(self, reason_code: int, reason: str, event: str | None = None, quiet: bool = False) -> None:
        """Answer the CONNECT with a refusal and close; a login refused is an auth failure
        event, unless ``quiet`` (a quota's refusal, counted and logged by the quotas)."""
        if not quiet and (event is not None or reason_code in (reasons.BAD_USER_NAME_OR_PASSWORD,
                                                                reasons.NOT_AUTHORIZED)):
            connect = self._connect
            self.factory.events.auth_failure("mqtt", connect.username if connect else None,
                                             source=transport_source(self.transport),
                                             reason=event or reason)
        properties = NO_PROPERTIES
        if self.version == MQTT_5 and self._problem_information:
            properties = Properties(reason_string=reason)
        self._write_connack(False, reason_code, properties, self.version)
        self._close()

    def _write_connack(self, present: bool, reason_code: int, properties: Properties, version: int) -> None:
        if version == MQTT_5:
            self.transport.write(encode(Connack(present, reason_code, properties), MQTT_5))
        else:
            code = reason_code if reason_code == 0 else _V3_CONNACK.get(reason_code, 5)
            self.transport.write(bytes((0x20, 2, 1 if present else 0, code)))

    def _logged_in(self, principal: Principal) -> None:
        factory = self.factory
        settings = factory.settings
        packet = self._connect
        assert packet is not None
        properties = packet.properties
        if self.version == MQTT_5:
            expiry = properties.session_expiry_interval or 0
        else:
            expiry = 0 if packet.clean_start else NEVER_EXPIRES
        expiry = min(expiry, settings.mqtt_max_session_expiry) if expiry != NEVER_EXPIRES else settings.mqtt_max_session_expiry
        window = min(properties.receive_maximum or 65_535, settings.mqtt_max_inflight)
        durable = factory.broker.durable
        if durable is not None and not durable.started:
            # The store is still being read (a node starting): a stored session is found
            # once it is, so the CONNECT waits for it, reading nothing more meanwhile.
            self._logging_in = True
            self.transport.pauseProducing()
            durable.when_started().addBoth(lambda _: self._store_ready(principal))
            return
        granted = self._within_quotas(principal, expiry)
        if granted is None:
            return
        expiry = granted
        session, present = factory.sessions.open(self._client_id, principal, self.version, packet.clean_start,
                                                 expiry, self)
        if session is None:
            self._refuse_connect(reasons.NOT_AUTHORIZED, "the client identifier is another login's",
                                 event="client identifier of another principal")
            return
        self.cancel_timer(self._connect_timer)
        self._connect_timer = None
        self.session = session
        session.expiry = expiry
        session.bind(self, window, properties.maximum_packet_size,
                     min(properties.topic_alias_maximum or 0, settings.mqtt_topic_alias_maximum))
        self._will = packet.will
        self.keep_alive = packet.keep_alive
        if settings.mqtt_max_keep_alive and (self.keep_alive == 0 or self.keep_alive > settings.mqtt_max_keep_alive):
            self.keep_alive = settings.mqtt_max_keep_alive
        factory.liveness.watch(self)
        self.logged_in()
        connack_properties = NO_PROPERTIES
        if self.version == MQTT_5:
            connack_properties = Properties(
                assigned_client_identifier=getattr(self, "_assigned", None),
                receive_maximum=settings.mqtt_max_inflight,
                maximum_packet_size=settings.mqtt_max_packet_size,
                topic_alias_maximum=settings.mqtt_topic_alias_maximum or None,
                server_keep_alive=self.keep_alive if self.keep_alive != packet.keep_alive else None,
                session_expiry_interval=expiry if expiry != (properties.session_expiry_interval or 0) else None,
                response_information=(response_information(self._client_id)
                                      if properties.request_response_information == 1 else None),
            )
        self._write_connack(present, 0, connack_properties, self.version)
        if present:
            for data in session.resend_inflight():
                self.transport.write(data)
            session.send_queued()
        factory.sessions.connected(session)

    def _within_quotas(self, principal: Principal, expiry: int) -> int | None:
        """The Session Expiry the quotas of persistent sessions (:mod:`.quotas`) grant this
        CONNECT, or None when it was refused.  A v5 anonymous client, when the anonymous
        principal may have none, gets a session that ends with its connection (the CONNACK
        says Session Expiry Interval 0, 3.2.2.3.2); a 3.1.1 one cannot be told, so its Clean
        Session 0 is refused (return code 5).  Past a quota: 0x97 (3.1.1 return code 3)."""
        if expiry <= 0:
            return expiry
        quotas = self.factory.sessions.quotas
        quota = quotas.refusal((principal, self._client_id))
        if quota is None:
            return expiry
        quotas.count(quota)
        if quota == ANONYMOUS_SESSIONS and not self.factory.settings.mqtt_anonymous_sessions:
            if self.version == MQTT_5:
                return 0
            self._refuse_connect(reasons.NOT_AUTHORIZED, "persistent sessions are not offered to anonymous clients",
                                 quiet=True)
            return None
        self._refuse_connect(reasons.QUOTA_EXCEEDED, "no more persistent sessions are allowed", quiet=True)
        return None

    def hold_reading(self) -> Callable[[], None]:
        """Handle none of the client's packets until the returned callable is called (the
        session reads what the store kept for it first), as while its login is checked."""
        self._logging_in = True
        self.transport.pauseProducing()

        def read_on() -> None:
            if self._logging_in:
                self._end_login()
                if not self.closed:
                    self._continue()

        return read_on

    def _store_ready(self, principal: Principal) -> None:
        self._end_login()
        if not self.closed:
            self._logged_in(principal)
            self._continue()

