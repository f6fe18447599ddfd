"""SMQP's command mixins are typed against one session Protocol (brokerd.protocols.smqp.session):
mypy checks them with every ``self`` seen as the whole session, and they need almost no
``type: ignore`` (each one left names why).  The errors come from the session's one mypy run
over brokerd (tests/support/typecheck.py), which checks the probe below with it."""
from __future__ import annotations

import re
from pathlib import Path

from tests.support.typecheck import MypyReport, probe

ROOT = Path(__file__).resolve().parent.parent
SMQP = ROOT / "brokerd" / "protocols" / "smqp"
SESSION_MODULES = ["session.py", "login.py", "topic_commands.py", "messaging.py", "subscribing.py",
                   "queue_commands.py", "server.py", "events.py"]
MIXINS = ["login.py", "topic_commands.py", "messaging.py", "subscribing.py", "queue_commands.py"]

PROBE = probe("smqp_session_probe", "from brokerd.protocols.smqp.session import SessionBase\n\n\n"
                                    "class Probe(SessionBase):\n"
                                    "    def use(self) -> None:\n"
                                    "        self.factory.no_such_thing()\n")
"""A mixin using a member SMQPSession does not declare."""


def test_mypy_passes_on_the_session_and_its_mixins(mypy_report: MypyReport) -> None:
    errors = [line for name in SESSION_MODULES for line in mypy_report.errors_in(f"brokerd/protocols/smqp/{name}")]
    assert all((SMQP / name).is_file() for name in SESSION_MODULES)
    assert not errors, "\n".join(errors)


def test_the_mixins_need_fewer_than_ten_type_ignores() -> None:
    ignores = {name: len(re.findall(r"# type: ignore", (SMQP / name).read_text())) for name in MIXINS}
    assert sum(ignores.values()) < 10, ignores


def test_mypy_would_see_a_session_member_the_protocol_lacks(mypy_report: MypyReport) -> None:
    """The check above can fail: a mixin using a member SMQPSession does not declare is an error."""
    errors = mypy_report.errors_in(PROBE)
    assert len(errors) == 1 and "no_such_thing" in errors[0], mypy_report.output
