"""Who may do what over MQTT, on a real ``twistd brokerd`` with ``--accounts`` and ``--ual``:
logins (a bad password, ``--no-mqtt-anonymous``), the access list deciding publish (v5 PUBACK
0x87; 3.1.1 PUBACK and dropped) and subscribe (v5 SUBACK 0x87; 3.1.1 0x80), wills to
forbidden topics, and client identifiers that belong to the principal that made the session.

Every refusal has its positive control in the same test, sent after it, so its arrival bounds
the wait for what must not arrive.  The accounts are tests/integration/smqp_fixtures.py's
(alice, bob and the guest).  3.1.1 return codes are read from the wire (paho reports them
translated into v5 reason codes).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.client import MQTTv5

from tests.integration.smqp_fixtures import ACCOUNTS, write_test_accounts
from tests.integration.test_mqtt_bad_input import V5, V311, RawMQTT
from tests.integration.test_mqtt_paho import (
    MQTT_LISTENER,
    VERSIONS,
    MQTTClient,
    assert_clean_log,
    unique,
)
from tests.support.broker import RunningBroker, start_broker

pytestmark = pytest.mark.slow

UAL = """\
/mq              *          -
/mq/open         *          ps
/mq/readonly     *          s
/mq/readonly     alice      ps
/mq/dropbox      *          p
/mq/dropbox      alice      ps
/mq/wills        *          s
/mq/wills/bob    bob        ps
"""


def broker_with_access(tmp_path: Path, *options: str) -> RunningBroker:
    accounts = tmp_path / "accounts"
    write_test_accounts(accounts)
    ual = tmp_path / "ual"
    ual.write_text(UAL)
    return start_broker(tmp_path, "--accounts", str(accounts), "--ual", str(ual), *options, listeners=MQTT_LISTENER)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = broker_with_access(tmp_path_factory.mktemp("mqtt-access"), "--no-mqtt-anonymous")
    yield running
    running.stop()
    assert_clean_log(running)


@pytest.fixture
def login(broker: RunningBroker) -> Iterator[Callable[..., MQTTClient]]:
    """``login(version, account, client_id="", **options)``: a connected MQTTClient of that
    account (its password from ACCOUNTS), closed after the test."""
    made: list[MQTTClient] = []

    def make(version: int, account: str, client_id: str = "", **options: Any) -> MQTTClient:
        client = MQTTClient(broker.ports["mqtt"], version, client_id, username=account,
                            password=ACCOUNTS[account], **options)
        made.append(client)
        return client

    yield make
    for client in made:
        client.disconnect()


def connack(broker: RunningBroker, version: int, **options: Any) -> int:
    """The CONNACK's reason (v5) or return code (3.1.1) for a raw CONNECT; the connection is
    closed after a refusal."""
    raw = RawMQTT(broker)
    try:
        _present, code = raw.connack(version, **options)
        if code:
            raw.closed()
        return code
    finally:
        raw.close()


# ---------------------------------------------------------------------- logins


def test_bad_password_and_unknown_user_are_refused_with_the_right_codes(broker: RunningBroker) -> None:
    for version, bad in ((V5, 0x86), (V311, 4)):
        assert connack(broker, version, client_id="a1", username="alice", password=b"wrong") == bad
        assert connack(broker, version, client_id="a1", username="mallory", password=b"alicepw") == bad
        assert connack(broker, version, client_id="a1", username="alice", password=b"") == bad
        assert connack(broker, version, client_id="a1", username="alice", password=b"alicepw") == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_bad_password_through_paho(broker: RunningBroker, login, version: int) -> None:
    refused = MQTTClient(broker.ports["mqtt"], version, username="bob", password="not bobs", connect=False)
    try:
        refused.start()
        assert refused.connack()[1] == 0x86  # paho's v5 code for the 3.1.1 return code 4
    finally:
        refused.stop()
    login(version, "bob")


def test_no_mqtt_anonymous_refuses_a_connect_without_credentials(broker: RunningBroker) -> None:
    assert connack(broker, V5, client_id="anon") == 0x87
    assert connack(broker, V311, client_id="anon") == 5
    assert connack(broker, V5, client_id="named", username="bob", password=b"bobpw") == 0


# ---------------------------------------------------------------------- the access list


@pytest.mark.parametrize("version", VERSIONS)
def test_a_publish_the_access_list_refuses_is_answered_and_dropped(login, version: int) -> None:
    name = unique("p", version)
    alice = login(MQTTv5, "alice")
    assert alice.subscribe_many([("mq/readonly/#", 1), ("mq/open/#", 1)]) == [1, 1]
    bob = login(version, "bob")

    refused = 0x87 if version == MQTTv5 else 0  # 3.1.1 has no way to say so: PUBACK, dropped
    assert bob.publish(f"mq/readonly/{name}", b"denied qos 1", 1) == refused
    assert bob.publish(f"mq/readonly/{name}", b"denied qos 0", 0) == 0
    assert bob.publish(f"mq/elsewhere/{name}", b"denied: no entry", 1) == refused  # /mq * -
    assert bob.publish(f"mq/open/{name}", b"allowed", 1) == 0
    got = alice.message()
    assert (got.topic, got.payload) == (f"mq/open/{name}", b"allowed")

    assert alice.publish(f"mq/readonly/{name}", b"alice may", 1) == 0
    assert alice.message().payload == b"alice may"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_subscription_the_access_list_refuses_gets_its_code_and_nothing(login, version: int) -> None:
    name = unique("s", version)
    bob = login(version, "bob")
    refused = 0x87 if version == MQTTv5 else 0x80
    codes = bob.subscribe_many([(f"mq/dropbox/{name}", 1), (f"mq/hidden/{name}", 1), (f"mq/open/{name}", 1),
                                (f"mq/readonly/{name}", 0)])
    assert codes == [refused, refused, 1, 0]
    alice = login(MQTTv5, "alice")
    alice.publish(f"mq/dropbox/{name}", b"into the box", 1)
    alice.publish(f"mq/open/{name}", b"in the open", 1)
    got = bob.message()
    assert (got.topic, got.payload) == (f"mq/open/{name}", b"in the open")
    alice.publish(f"mq/readonly/{name}", b"read only", 1)
    assert bob.message().payload == b"read only"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_wildcard_subscription_gets_only_what_it_may_read(login, version: int) -> None:
    """``#`` and ``+/dropbox/+`` are allowed filters (the access list says nothing about their
    text), yet they must not bring bob what /mq/dropbox keeps from him."""
    name = unique("w", version)
    bob = login(version, "bob")
    assert bob.subscribe_many([("#", 1), ("+/dropbox/+", 1)]) == [1, 1]
    alice = login(MQTTv5, "alice")
    alice.publish(f"mq/dropbox/{name}", b"not for bob", 1)
    alice.publish(f"mq/open/{name}", b"for everyone", 1)
    got = bob.messages_until(b"for everyone")
    assert [(m.topic, m.payload) for m in got if name in m.topic] == [(f"mq/open/{name}", b"for everyone")]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_stored_session_is_refused_and_served_as_a_live_one(login, version: int) -> None:
    """A persistent session's QoS 1 subscriptions are stored, not live: the access list refuses
    the same filters, and what is stored for its allowed wildcard while bob is away is only
    what bob may read (the owner is asked at every delivery)."""
    name = unique("stored", version)
    client_id = unique("stored-bob", version)
    bob = login(version, "bob", client_id, clean=False, expiry=300)
    refused = 0x87 if version == MQTTv5 else 0x80
    codes = bob.subscribe_many([(f"mq/dropbox/{name}", 1), (f"mq/open/{name}", 1), (f"+/+/{name}", 1)])
    assert codes == [refused, 1, 1]
    bob.disconnect()
    alice = login(MQTTv5, "alice")
    alice.publish(f"mq/dropbox/{name}", b"not for bob", 1)
    alice.publish(f"mq/open/{name}", b"for everyone", 1)
    alice.publish(f"mq/open/{name}", b"sentinel", 1)
    back = login(version, "bob", client_id, clean=False, expiry=300, connect=False)
    back.start()
    assert back.connack()[:2] == (True, 0)
    got = back.messages_until(b"sentinel")
    assert [(m.topic, m.payload) for m in got] == [(f"mq/open/{name}", b"for everyone"),
                                                    (f"mq/open/{name}", b"sentinel")]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_will_to_a_topic_its_principal_may_not_publish_to_is_not_published(login, version: int) -> None:
    """A takeover ends the old connection and publishes its will before the new connection's
    CONNACK, so what the new connection publishes afterwards comes after any will."""
    name = unique("will", version)
    alice = login(MQTTv5, "alice")
    alice.subscribe("mq/wills/#", 1)
    client_id = unique("willing", version)
    login(version, "bob", client_id, will=(f"mq/wills/{name}", b"forbidden will", 1, False))
    second = login(version, "bob", client_id, will=(f"mq/wills/bob/{name}", b"allowed will", 1, False))
    second.publish(f"mq/wills/bob/{name}", b"sentinel 1", 1)
    assert alice.message().payload == b"sentinel 1", "the forbidden will was published"

    login(version, "bob", client_id)  # takes over again: the allowed will is published
    assert alice.message().payload == b"allowed will"


# ---------------------------------------------------------------------- client identifiers


@pytest.mark.parametrize("version", VERSIONS)
def test_a_client_id_of_one_account_cannot_be_taken_by_another(broker: RunningBroker, login, version: int) -> None:
    client_id = unique("owned", version)
    topic = f"mq/open/{client_id}"
    alice = login(version, "alice", client_id, clean=False, expiry=300)
    alice.subscribe(topic, 1)

    thief = MQTTClient(broker.ports["mqtt"], version, client_id, username="bob", password="bobpw", connect=False)
    try:
        thief.start()
        assert thief.connack()[1] == 0x87
    finally:
        thief.stop()
    raw_code = connack(broker, V5 if version == MQTTv5 else V311, client_id=client_id, username="bob",
                       password=b"bobpw")
    assert raw_code == (0x87 if version == MQTTv5 else 5)

    other = login(MQTTv5, "bob")
    other.publish(topic, b"still alice's", 1)
    assert alice.message().payload == b"still alice's"
    assert alice.disconnects.empty(), "the owner's connection was ended"

    # While alice is away her session waits for her, and still cannot be taken.
    alice.disconnect()
    other.publish(topic, b"while away", 1)
    assert connack(broker, V5 if version == MQTTv5 else V311, client_id=client_id, username="bob",
                   password=b"bobpw") == (0x87 if version == MQTTv5 else 5)
    back = login(version, "alice", client_id, clean=False, expiry=300, connect=False)
    back.start()
    assert back.connack()[:2] == (True, 0)
    assert back.message().payload == b"while away"


# ---------------------------------------------------------------------- anonymous under the access list


def test_anonymous_clients_match_only_star_entries(tmp_path: Path) -> None:
    """Without ``--no-mqtt-anonymous`` a CONNECT without credentials is the anonymous
    principal: ``*`` entries apply to it and nothing else (it is no account), so where the
    access list says nothing it has the guest's default (subscribe only)."""
    broker = broker_with_access(tmp_path)
    clients: list[MQTTClient] = []
    try:
        port = broker.ports["mqtt"]
        anonymous = MQTTClient(port, MQTTv5)
        alice = MQTTClient(port, MQTTv5, username="alice", password=ACCOUNTS["alice"])
        clients += [anonymous, alice]
        assert anonymous.subscribe_many([("mq/open/a", 1), ("mq/dropbox/a", 1), ("free/a", 1)]) == [1, 0x87, 1]
        assert anonymous.publish("free/a", b"anonymous may not", 1) == 0x87
        assert anonymous.publish("mq/readonly/a", b"nor here", 1) == 0x87
        assert anonymous.publish("mq/open/a", b"anonymous may", 1) == 0
        assert anonymous.message().payload == b"anonymous may"
        assert alice.publish("free/a", b"accounts may", 1) == 0
        assert anonymous.message().payload == b"accounts may"
    finally:
        for client in clients:
            client.disconnect()
        broker.stop()
    assert_clean_log(broker)
