"""How an SMQP command says no: :class:`Refused`, raised anywhere below the session's dispatch
and answered as one ``code text`` reply line.

Its own module, below everything that raises it: the command mixins, and CONNECTTO's
notification connection (:mod:`~brokerd.protocols.smqp.connectto`), which the front end's
shared state (:mod:`~brokerd.protocols.smqp.factory`) and the session's contract use too.
"""
from __future__ import annotations


class Refused(Exception):
    """A command refused with its SMQP reply code (``403``, ``451``...) and text."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
