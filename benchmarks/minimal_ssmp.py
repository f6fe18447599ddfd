"""A minimal SSMP server on Twisted: the floor brokerd's SSMP figures are measured against.

Just what pbload's workloads need (LOGIN, SUBSCRIBE, MCAST, UCAST, PING), with the same
write discipline as brokerd: a read is split at once, its replies go out as one write, and each
recipient gets one write per read.  No presence, no limits, no validation, no flow control, no
event log: what CPython and Twisted cost per message, not a server to copy.

    python benchmarks/minimal_ssmp.py PORT
"""
from __future__ import annotations

import sys

from twisted.internet import reactor
from twisted.internet.protocol import Factory, Protocol


class MinimalSSMP(Protocol):
    def __init__(self, factory: MinimalFactory) -> None:
        self.factory = factory
        self.name = b""
        self.buffer = b""

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)

    def connectionLost(self, reason: object = None) -> None:
        factory = self.factory
        if factory.users.get(self.name) is self:
            del factory.users[self.name]
        for members in factory.topics.values():
            members.pop(self, None)

    def dataReceived(self, data: bytes) -> None:
        lines = (self.buffer + data).split(b"\n")
        self.buffer = lines.pop()
        factory = self.factory
        replies = []
        out: dict[MinimalSSMP, list[bytes]] = {}
        name = self.name
        for line in lines:
            verb, _, rest = line.partition(b" ")
            if verb == b"MCAST":
                topic, _, payload = rest.partition(b" ")
                event = b"000 " + name + b" MCAST " + topic + b" " + payload + b"\n"
                for member in factory.topics.get(topic, ()):
                    if member is not self:
                        out.setdefault(member, []).append(event)
                replies.append(b"200\n")
            elif verb == b"UCAST":
                to, _, payload = rest.partition(b" ")
                member = factory.users.get(to)
                if member is None:
                    replies.append(b"404\n")
                    continue
                out.setdefault(member, []).append(b"000 " + name + b" UCAST " + to + b" " + payload + b"\n")
                replies.append(b"200\n")
            elif verb == b"LOGIN":
                self.name = name = rest.partition(b" ")[0]
                factory.users[name] = self
                replies.append(b"200\n")
            elif verb == b"SUBSCRIBE":
                factory.topics.setdefault(rest.partition(b" ")[0], {})[self] = None
                replies.append(b"200\n")
            elif verb == b"PING":
                replies.append(b"000 . PONG\n")
            elif verb != b"PONG":
                replies.append(b"501\n")
        for member, events in out.items():
            if member is self:
                replies[:0] = events
            else:
                member.transport.write(b"".join(events))
        if replies:
            self.transport.write(b"".join(replies))


class MinimalFactory(Factory):
    def __init__(self) -> None:
        self.users: dict[bytes, MinimalSSMP] = {}
        self.topics: dict[bytes, dict[MinimalSSMP, None]] = {}

    def buildProtocol(self, addr: object) -> MinimalSSMP:
        return MinimalSSMP(self)


if __name__ == "__main__":
    reactor.listenTCP(int(sys.argv[1]), MinimalFactory(), interface="127.0.0.1", backlog=1024)
    reactor.run()
