"""docs/examples/paho-interop.toml, the configuration docs/mqtt.md gives for Eclipse paho's
interoperability suites, is what it says: brokerd starts with it and answers as the suites
expect (a Server Keep Alive of 60 s, test/nosubscribe refused, everything else allowed, a
persistent session for an anonymous client).  Only the listener's port and the data directory
are the test's own (the command line wins over the file)."""
from __future__ import annotations

from pathlib import Path

import pytest
from paho.mqtt.client import MQTTv5

from tests.integration.test_mqtt_paho import MQTTClient
from tests.support.broker import REPO, start_broker

pytestmark = pytest.mark.slow


def test_the_paho_interop_config_refuses_test_nosubscribe_and_tells_a_keep_alive_of_60(tmp_path: Path) -> None:
    config = (REPO / "docs/examples/paho-interop.toml").read_text()
    config = config.replace('"docs/examples/paho-interop.ual"', f'"{REPO / "docs/examples/paho-interop.ual"}"')
    (tmp_path / "paho-interop.toml").write_text(config)
    broker = start_broker(tmp_path, "--config", str(tmp_path / "paho-interop.toml"),
                          listeners={"mqtt": "tcp:{port}:interface=127.0.0.1"})
    try:
        client = MQTTClient(broker.ports["mqtt"], MQTTv5, "myclientid", clean=False, connect=False, keepalive=120,
                      connect_properties={"SessionExpiryInterval": 300})
        client.start()
        present, reason, props = client.connack()
        assert (present, reason, props.ServerKeepAlive) == (False, 0, 60)
        assert client.subscribe("test/nosubscribe", 2) == 0x87
        assert client.subscribe("TopicA/#", 2) == 2
        client.disconnect()
        again = MQTTClient(broker.ports["mqtt"], MQTTv5, "myclientid", clean=False, connect=False,
                     connect_properties={"SessionExpiryInterval": 300})
        again.start()
        assert again.connack()[:2] == (True, 0)  # the anonymous client's session was kept
        again.disconnect()
    finally:
        broker.stop()
