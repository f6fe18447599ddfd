"""The configuration of MQTT bridges: Mosquitto's topic lines, the TOML tables and the
command-line words read alike, and every mistake is one line naming the bridge and the key."""
from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.config import Settings, settings_from
from brokerd.core.message import MULTICAST, Message
from brokerd.errors import ConfigurationError
from brokerd.protocols.mqtt.bridge import Bridge
from brokerd.protocols.mqtt.bridgeservice import check_bridges
from brokerd.protocols.mqtt.bridges import TopicRule, endpoint_of, parse_bridges, parse_topic
from brokerd.protocols.mqtt.packets import MQTT_5, MQTT_311
from brokerd.tap import Options, StartupError


def test_a_topic_line_reads_as_mosquittos() -> None:
    assert parse_topic("sensors/#", "b") == TopicRule("sensors/#", "out", 0, "", "")
    assert parse_topic("sensors/# in 2", "b") == TopicRule("sensors/#", "in", 2)
    rule = parse_topic('cmd/# both 1 here/ ""', "b")
    assert rule == TopicRule("cmd/#", "both", 1, "here/", "")
    assert (rule.local_filter, rule.remote_filter) == ("here/cmd/#", "cmd/#")
    assert rule.to_remote("here/cmd/x") == "cmd/x"
    assert parse_topic("# in 1 local/ remote/", "b").to_local("remote/a/b") == "local/a/b"
    assert parse_topic("# in 1 local/ remote/", "b").to_local("elsewhere/a") is None


@pytest.mark.parametrize("line, why", [
    ("a/# sideways 1", "the direction is out, in or both, not 'sideways'"),
    ("a/# out 3", "the QoS is 0, 1 or 2, not '3'"),
    ("a/# out 1 only-one-prefix", "is not PATTERN [DIRECTION [QOS [LOCAL-PREFIX REMOTE-PREFIX]]]"),
    ("a/# out 1 x/+/ y/", "a prefix holds no wildcard"),
    ("a/#/b", "'#'"),
    ("$share/g/a out 1", "a bridge pattern is no shared subscription"),
])
def test_a_bad_topic_line_names_itself(line: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_topic(line, "cloud")
    assert str(raised.value).startswith(f"mqtt-bridge cloud: topic {line!r}: ")
    assert why in str(raised.value)


def test_the_toml_table_and_the_command_line_words_are_one_bridge(tmp_path: Path) -> None:
    config = tmp_path / "brokerd.toml"
    config.write_text('[[mqtt-bridge]]\nname = "cloud"\naddress = "mqtt.example:1883"\nprotocol = "mqttv311"\n'
                      'clean-session = true\nmax-queued = 5\ntopic = ["a/# out 1", "b/# in 0 l/ r/"]\n')
    from_file = parse_bridges(settings_from({}, str(config)).mqtt_bridge)
    options = Options()
    options.parseOptions(["--data-dir", str(tmp_path / "d"), "--mqtt-bridge",
                          "name=cloud address=mqtt.example:1883 protocol=mqttv311 clean-session=true max-queued=5 "
                          "'topic=a/# out 1' 'topic=b/# in 0 l/ r/'"])
    from_words = parse_bridges(options.settings.mqtt_bridge)
    assert from_file == from_words
    (spec,) = from_file
    assert (spec.address, spec.protocol, spec.clean_session, spec.max_queued) == (
        "tcp:mqtt.example:1883", MQTT_311, True, 5)
    assert (spec.try_private, spec.keepalive, spec.max_queued_bytes) == (True, 60, 64 << 20)


def test_the_defaults() -> None:
    (spec,) = parse_bridges([{"name": "b", "address": "tcp:127.0.0.1:1884", "topic": "x/#"}])
    assert (spec.protocol, spec.clean_session, spec.session_expiry, spec.restart_timeout) == (MQTT_5, False, 86400, 30.0)
    assert spec.topics == (TopicRule("x/#"),)


def test_an_address_is_host_port_or_an_endpoint() -> None:
    assert endpoint_of("127.0.0.1:1883") == "tcp:127.0.0.1:1883"
    assert endpoint_of("[::1]:1883") == "tcp:\\:\\:1:1883"
    assert endpoint_of("unix:/run/mosquitto.sock") == "unix:/run/mosquitto.sock"


@pytest.mark.parametrize("table, why", [
    ({"name": "a b", "address": "h:1", "topic": "x"}, "name 'a b' is not 1-64 letters"),
    ({"name": "b", "topic": "x"}, "mqtt-bridge b: address is required"),
    ({"name": "b", "address": "h:1"}, "mqtt-bridge b: no topic line"),
    ({"name": "b", "address": "h:1", "topic": "x", "colour": "red"}, "unknown key 'colour'"),
    ({"name": "b", "address": "h:1", "topic": "x", "keepalive": "soon"}, "keepalive: 'soon' is not a number"),
    ({"name": "b", "address": "h:1", "topic": "x", "max-queued": 0}, "max-queued: must be at least 1"),
    ({"name": "b", "address": "h:1", "topic": "x", "protocol": "mqttv4"}, "protocol is mqttv311 or mqttv5"),
    ({"name": "b", "address": "h:1", "topic": "x", "tls-ca": "/ca.pem"}, "need tls = true"),
    ({"name": "b", "address": "h:1", "topic": "x", "clean-session": "maybe"}, "is not a boolean"),
])
def test_a_bad_bridge_is_one_line(table: dict, why: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_bridges([table])
    assert why in str(raised.value)


def test_two_bridges_of_one_name_are_refused() -> None:
    table = {"name": "b", "address": "h:1", "topic": "x"}
    with pytest.raises(ConfigurationError, match="two bridges have one name"):
        parse_bridges([table, dict(table)])


def test_the_broker_does_not_start_with_a_bad_bridge(tmp_path: Path) -> None:
    options = Options()
    with pytest.raises(StartupError) as raised:
        options.parseOptions(["--data-dir", str(tmp_path / "d"), "--mqtt-bridge", "name=b address=h:1 'topic=x up'"])
    assert str(raised.value) == ("brokerd: mqtt-bridge b: topic 'x up': the direction is out, in or both, not 'up'")


def bridge_of(*topics: str) -> Bridge:
    (spec,) = parse_bridges([{"name": "b", "address": "h:1", "topic": list(topics)}])
    return Bridge(spec, broker=None, settings=Settings(), reactor=None)


def test_the_first_matching_out_pattern_maps_a_topic() -> None:
    bridge = bridge_of("a/# in 1", "b/# out 2 a/ x/", "# out 0")
    assert bridge.out_rule("a/b/c").to_remote("a/b/c") == "x/b/c"
    assert bridge.out_rule("z").qos == 0
    assert bridge_of("a/# in 1").out_rule("a/b") is None


def test_the_statistics_go_out_only_over_a_pattern_that_names_them() -> None:
    assert bridge_of("# out 0").out_rule("~sys/brokerd/uptime_seconds") is None
    assert bridge_of("# out 0").out_rule("a") is not None  # the same pattern takes the rest
    assert bridge_of("~sys/# out 0", "# out 1").out_rule("~sys/brokerd/uptime_seconds").pattern == "~sys/#"


def test_what_a_bridge_brought_in_is_not_for_the_other_broker() -> None:
    bridge = bridge_of("# both 1")
    other = bridge_of("# both 1")
    other.name = b"sys/bridge/other"
    brought = Message(MULTICAST, b"t", b"p", "mqtt", b"sys/bridge/b")
    assert not bridge.for_remote(brought)
    assert other.for_remote(brought)  # another bridge forwards it, as Mosquitto's do
    assert bridge.for_remote(Message(MULTICAST, b"t", b"p", "ssmp", b"sys/bridge/b"))


@pytest.mark.parametrize("table, why", [
    ({"address": "tcp:nohost"}, "mqtt-bridge b: not a client endpoint: 'tcp:nohost'"),
    ({"address": "h:1", "password-file": "/nonexistent/password"},
     "mqtt-bridge b: password-file /nonexistent/password: No such file or directory"),
    ({"address": "h:1", "tls": True, "tls-cert": "JUNK"}, "mqtt-bridge b: client certificate"),
])
def test_an_unusable_address_or_file_stops_the_start(tmp_path: Path, table: dict, why: str) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    table = {"name": "b", "topic": "x", **{k: str(junk) if v == "JUNK" else v for k, v in table.items()}}
    with pytest.raises(ConfigurationError) as raised:
        check_bridges(Settings(mqtt_bridge=[table]))
    assert str(raised.value).startswith(why)
