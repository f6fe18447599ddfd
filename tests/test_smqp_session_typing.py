"""SMQP's command mixins are typed against one session Protocol (brokerd.protocols.smqp.session):
mypy checks them with every ``self`` seen as the whole session, and they need almost no
``type: ignore`` (each one left names why)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMQP = ROOT / "brokerd" / "protocols" / "smqp"
SESSION_MODULES = ["session.py", "login.py", "topic_commands.py", "messaging.py", "subscribing.py",
                   "queue_commands.py", "server.py", "events.py"]
MIXINS = ["login.py", "topic_commands.py", "messaging.py", "subscribing.py", "queue_commands.py"]


def test_mypy_passes_on_the_session_and_its_mixins() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--follow-imports=silent", "--warn-unused-ignores",
         "--no-incremental", "--cache-dir=/dev/null", *(str(SMQP / name) for name in SESSION_MODULES)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_mixins_need_fewer_than_ten_type_ignores() -> None:
    ignores = {name: len(re.findall(r"# type: ignore", (SMQP / name).read_text())) for name in MIXINS}
    assert sum(ignores.values()) < 10, ignores


def test_mypy_would_see_a_session_member_the_protocol_lacks(tmp_path: Path) -> None:
    """The check above can fail: a mixin using a member SMQPSession does not declare is an error."""
    probe = tmp_path / "probe.py"
    probe.write_text("from brokerd.protocols.smqp.session import SessionBase\n\n\n"
                     "class Probe(SessionBase):\n"
                     "    def use(self) -> None:\n"
                     "        self.factory.no_such_thing()\n")
    result = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--follow-imports=silent",
                             "--no-incremental", "--cache-dir=/dev/null", str(probe)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "no_such_thing" in result.stdout, result.stdout
