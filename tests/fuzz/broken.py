"""Deliberately broken decoders, for the tests that show a fuzz run reports a finding: each
wraps the SSMP server parser as the ``ssmp`` target does and breaks the property one way."""
from __future__ import annotations

from brokerd.protocols.ssmp.codec import SSMPParser
from tests.fuzz.harness import Stream


def _raising_feed(parser: SSMPParser, data: bytes) -> tuple:
    requests, error = parser.feed(data)
    for request in requests:
        if request.verb == b"SUBSCRIBE":
            raise KeyError("a decoder bug: SUBSCRIBE")  # not the SSMPProtocolError SSMP specifies
    return requests, error


RAISES = Stream(SSMPParser, _raising_feed, lambda parser: parser.buffered, 2048)
GROWS = Stream(SSMPParser, lambda parser, data: parser.feed(data), lambda parser: parser.buffered, 8)
"""The real parser, held to a limit below its own: any incomplete line past 8 bytes breaks it."""


def raises(data: bytes) -> tuple:
    return RAISES.check(data)


def grows(data: bytes) -> tuple:
    return GROWS.check(data)


CHECKS = {"broken-raises": raises, "broken-grows": grows}
