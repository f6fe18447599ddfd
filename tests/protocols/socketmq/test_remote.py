"""The cluster side of the socket.mq Hub, against an engine that records what it sends: a
request for an application another node serves is sent there and answered by its answer; a
node that leaves fails its requests with 502; answers from the wrong node, damaged messages
and a second registration of a name served elsewhere are refused."""
from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock

from brokerd.protocols.socketmq import remote
from brokerd.protocols.socketmq.hub import Hub
from brokerd.protocols.socketmq.incoming import IncomingRequest

NODE3 = "33" * 8
NODE2 = "22" * 8


class Engine:
    shared = True

    def __init__(self) -> None:
        self.node_listeners: list[Any] = []
        self.services: dict[str, Any] = {}
        self.owners: dict[tuple[str, bytes], str] = {}
        self.sent: list[tuple[str, str, bytes]] = []
        self.claims: list[tuple[str, str, bytes]] = []

    def serve(self, service: str, handler: Any) -> None:
        self.services[service] = handler

    def send(self, origin: str, service: str, data: bytes) -> bool:
        self.sent.append((origin, service, data))
        return True

    def owner(self, namespace: str, name: bytes) -> str | None:
        return self.owners.get((namespace, name))

    def claim(self, namespace: str, name: bytes) -> None:
        self.claims.append(("claim", namespace, name))

    def release(self, namespace: str, name: bytes) -> None:
        self.claims.append(("release", namespace, name))


class Broker:
    def __init__(self) -> None:
        self.engine = Engine()


def hub_and_engine() -> tuple[Hub, Engine]:
    broker = Broker()
    return Hub(broker, Clock()), broker.engine


def answers(request: IncomingRequest) -> list:
    got: list = []
    request.answered.addCallback(got.append)
    return got


def sent_header(engine: Engine) -> dict:
    return json.loads(engine.sent[-1][2].partition(b"\n")[0])


def test_a_request_goes_to_the_serving_node_and_its_answer_comes_back() -> None:
    hub, engine = hub_and_engine()
    engine.owners[(remote.NAMESPACE, b"echo")] = NODE3
    request = IncomingRequest("echo", "r-1", b"body", "alice", "2", "text/plain", names=("alice", "fpr:ab"))
    got = answers(request)
    hub.dispatch(request)
    origin, service, data = engine.sent[-1]
    header, body = remote.decode(data)
    assert (origin, service, body) == (NODE3, remote.SERVICE, b"body")
    assert header["names"] == ["alice", "fpr:ab"] and header["application"] == "echo"
    answer = remote.encode({"k": "answer", "token": header["token"], "status": 201, "content_type": "x/y"}, b"ok")
    engine.services[remote.SERVICE](NODE2, answer)  # from the wrong node: ignored
    assert got == []
    engine.services[remote.SERVICE](NODE3, answer)
    assert got == [(201, b"ok", "x/y")]
    assert hub.remote.waiting == {}


def test_a_node_that_leaves_fails_its_requests_with_502_and_the_timeout_still_applies() -> None:
    hub, engine = hub_and_engine()
    engine.owners[(remote.NAMESPACE, b"echo")] = NODE3
    engine.owners[(remote.NAMESPACE, b"slow")] = NODE2
    lost, slow = IncomingRequest("echo", "a", b""), IncomingRequest("slow", "b", b"")
    got_lost, got_slow = answers(lost), answers(slow)
    hub.dispatch(lost)
    hub.dispatch(slow)
    for listener in engine.node_listeners:
        listener(NODE3)
    assert got_lost[0][0] == 502 and got_slow == []
    hub.reactor.advance(hub.request_timeout)
    assert got_slow[0][0] == 504


def test_a_request_from_another_node_is_served_here_and_answered_there() -> None:
    hub, engine = hub_and_engine()
    seen: list = []

    class App:
        def handle(self, request: IncomingRequest) -> None:
            seen.append((request.request_id, request.client_id, request.names))
            request.respond(200, b"pong")

    assert hub.register("echo", App())
    assert engine.claims == [("claim", remote.NAMESPACE, b"echo")]
    handler = engine.services[remote.SERVICE]
    handler(NODE2, remote.encode({"k": "request", "token": "7", "application": "echo", "request_id": "r",
                                  "client": "bob", "names": ["bob"], "version": None, "content_type": None}, b"x"))
    assert seen == [("r", "bob", ("bob",))]
    assert engine.sent[-1][0] == NODE2 and sent_header(engine) == {
        "k": "answer", "token": "7", "status": 200, "content_type": None}
    handler(NODE2, remote.encode({"k": "request", "token": "8", "application": "gone", "request_id": "r",
                                  "client": None, "names": None}, b""))
    assert sent_header(engine)["status"] == 404  # served here only: never sent on again


def test_damaged_messages_are_dropped_and_counted() -> None:
    hub, engine = hub_and_engine()
    handler = engine.services[remote.SERVICE]
    for data in (b"", b"no header", b"[1]\n", b'{"k":"request"}\n', b'{"k":"answer","token":"1","status":"x"}\n',
                 b'{"k":"request","token":"1","application":7,"request_id":"r"}\n',
                 b'{"k":"request","token":"1","application":"a","request_id":"r","names":[1]}\n'):
        handler(NODE2, data)
    assert hub.remote.stats["bad"] == 7 and engine.sent == []


def test_a_name_served_on_another_node_cannot_be_registered_here() -> None:
    hub, engine = hub_and_engine()
    engine.owners[(remote.NAMESPACE, b"echo")] = NODE3
    assert not hub.register("echo", object())  # type: ignore[arg-type]
    assert hub.register("other", object())  # type: ignore[arg-type]
    assert engine.claims == [("claim", remote.NAMESPACE, b"other")]
