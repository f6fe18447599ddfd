"""Every front end's wire format provides IWireFormat whole, its optional features included:
the core reads them as plain attributes (brokerd.interfaces.WireFormat gives the defaults)."""
from __future__ import annotations

from zope.interface.verify import verifyObject

from brokerd.core.message import MULTICAST, Message
from brokerd.interfaces import IWireFormat
from brokerd.protocols.mcchat.wire import MCCHAT_WIRE
from brokerd.protocols.smqp.wire import SMQPWireFormat
from brokerd.protocols.socketmq.wire import SOCKETMQ_WIRE
from brokerd.protocols.ssmp.wire import SSMP_WIRE

SMQP_WIRE = SMQPWireFormat("suid", "example.org", lambda: 0.0)


def test_each_wire_format_provides_the_interface_with_its_features() -> None:
    for wire in (SSMP_WIRE, MCCHAT_WIRE, SOCKETMQ_WIRE, SMQP_WIRE):
        verifyObject(IWireFormat, wire)
    features = {wire.protocol: (wire.portable, wire.writes_after_read, wire.queued_delivery)
                for wire in (SSMP_WIRE, MCCHAT_WIRE, SOCKETMQ_WIRE, SMQP_WIRE)}
    assert features == {
        "ssmp": (True, True, False),
        "mcchat": (True, True, False),
        "socketmq": (SOCKETMQ_WIRE.compressing == 0, False, False),
        "smqp": (False, False, True),
    }


def test_a_format_without_a_run_rendering_of_its_own_declines_every_run() -> None:
    run = [Message(MULTICAST, b"room", b"hi %d" % i, "ssmp", b"sam") for i in range(2)]
    assert MCCHAT_WIRE.render_run(run) is None and SMQP_WIRE.render_run(run) is None
    assert SSMP_WIRE.render_run(run) == b"".join(SSMP_WIRE.render_message(m) for m in run)  # type: ignore[misc]
