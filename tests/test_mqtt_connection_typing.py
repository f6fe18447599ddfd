"""MQTT's packet mixins are typed against one connection Protocol (brokerd.protocols.mqtt.connection):
mypy checks them with every ``self`` seen as the whole connection, with no type: ignore, and
sees a member the Protocol does not declare (the check can fail).  The errors come from the
session's one mypy run over brokerd (tests/support/typecheck.py), which checks the probe below
with it."""
from __future__ import annotations

import re
from pathlib import Path

from tests.support.typecheck import MypyReport, probe

ROOT = Path(__file__).resolve().parent.parent
MQTT = ROOT / "brokerd" / "protocols" / "mqtt"
MODULES = ["connection.py", "connect.py", "publishing.py", "subscribing.py", "server.py"]
MIXINS = ["connect.py", "publishing.py", "subscribing.py"]

PROBE = probe("mqtt_connection_probe", "from brokerd.protocols.mqtt.connection import ConnectionBase\n\n\n"
                                       "class Probe(ConnectionBase):\n"
                                       "    def use(self) -> None:\n"
                                       "        self.factory.no_such_thing()\n")
"""A mixin using a member MQTTConnection does not declare."""


def test_mypy_passes_on_the_mixins_and_sees_a_member_the_protocol_lacks(mypy_report: MypyReport) -> None:
    """The modules pass, and a probe mixin that uses a member MQTTConnection does not declare
    is an error (the check can fail)."""
    assert all((MQTT / name).is_file() for name in MODULES)
    errors = [line for name in MODULES for line in mypy_report.errors_in(f"brokerd/protocols/mqtt/{name}")]
    assert not errors, "\n".join(errors)
    probed = mypy_report.errors_in(PROBE)
    assert len(probed) == 1 and "no_such_thing" in probed[0], mypy_report.output


def test_the_mixins_need_no_type_ignore() -> None:
    ignores = {name: len(re.findall(r"# type: ignore", (MQTT / name).read_text())) for name in MIXINS}
    assert sum(ignores.values()) == 0, ignores
