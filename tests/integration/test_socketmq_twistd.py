"""The socket.mq front end in a real ``twistd brokerd`` (found by tap.py through
build_factory): SSMP -> socket.mq and socket.mq -> SSMP across the process boundary, and a
brokered application answering a POST."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from brokerd.protocols.socketmq.api import Client, IncomingRequest
from tests.support.live import Waiter
from tests.support.socketmq import TwistdBroker

pytestmark = pytest.mark.slow


@pytest.fixture
def twistd(tmp_path: Path) -> Any:
    broker = TwistdBroker(tmp_path)
    pytest_twisted.blockon(Deferred.fromCoroutine(broker.start()))
    yield broker
    broker.stop()


@pytest_twisted.ensureDeferred
async def test_cross_protocol_both_ways_and_brokered_request(twistd: TwistdBroker) -> None:
    web = Client(twistd.url)
    app = Client(twistd.url)
    sam = await twistd.ssmp(b"sam")
    try:
        await web.connect()
        events = Waiter()
        await web.subscribe("plant/boiler", events)
        sam.send(b"SUBSCRIBE plant/alarms")
        await sam.lines.count(2)

        sam.send(b"MCAST plant/boiler 87C")
        (event,) = await events.count(1)
        assert (event.data, event.sender, event.protocol) == (b"87C", "sam", "ssmp")

        await web.publish("plant/alarms", "pressure high")
        line = await sam.next_line(lambda line: b"MCAST" in line)
        assert line == b"000 socketmq:anonymous MCAST plant/alarms pressure high"

        def on_request(request: IncomingRequest) -> None:
            request.respond(200, request.body.upper())

        await app.connect()
        await app.login("open", "boiler-app")
        await app.serve("boiler", on_request)
        reply = await web.request("boiler", "shout", b"hello")
        assert (reply.status, reply.body) == (200, b"HELLO")
        key = await web.fetch_public_key()
        assert key.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
        assert (twistd.data_dir / "socketmq" / "server-key.asc").exists()
    finally:
        await web.close()
        await app.close()
        await sam.close()
