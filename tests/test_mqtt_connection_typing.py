"""MQTT's packet mixins are typed against one connection Protocol (brokerd.protocols.mqtt.connection):
mypy checks them with every ``self`` seen as the whole connection, with no type: ignore, and
sees a member the Protocol does not declare (the check can fail)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MQTT = ROOT / "brokerd" / "protocols" / "mqtt"
MODULES = ["connection.py", "connect.py", "publishing.py", "subscribing.py", "server.py"]
MIXINS = ["connect.py", "publishing.py", "subscribing.py"]


def mypy(tmp_path: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    """mypy with the zope plugin (Twisted's interfaces are annotations here) over ``paths``."""
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nplugins = mypy_zope:plugin\nignore_missing_imports = True\n"
                      "follow_imports = silent\nwarn_unused_ignores = True\n")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--no-incremental", "--cache-dir=/dev/null",
         *map(str, paths)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def test_mypy_passes_on_the_mixins_and_sees_a_member_the_protocol_lacks(tmp_path: Path) -> None:
    """One mypy run (it is slow to start): the modules pass, and a probe mixin that uses a
    member MQTTConnection does not declare is the only error (the check can fail)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from brokerd.protocols.mqtt.connection import ConnectionBase\n\n\n"
                     "class Probe(ConnectionBase):\n"
                     "    def use(self) -> None:\n"
                     "        self.factory.no_such_thing()\n")
    result = mypy(tmp_path, *(MQTT / name for name in MODULES), probe)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "probe.py" in errors[0] and "no_such_thing" in errors[0], result.stdout + result.stderr


def test_the_mixins_need_no_type_ignore() -> None:
    ignores = {name: len(re.findall(r"# type: ignore", (MQTT / name).read_text())) for name in MIXINS}
    assert sum(ignores.values()) == 0, ignores
