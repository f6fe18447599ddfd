"""The front ends brokerd serves, as :class:`~brokerd.frontend.IFrontEnd` plugins.

An explicit tuple of ordinary imports, so that import-linter sees every edge from the
composition root to a front end (a front end found by module path at run time would be
invisible to it).  twisted/plugins/brokerd_frontends.py offers the same objects to
``twisted.plugin.getPlugins(IFrontEnd)``.
"""
from __future__ import annotations

from brokerd.frontend import FrontEndPlugin
from brokerd.protocols.mcchat.plugin import front_end as mcchat
from brokerd.protocols.mqtt.plugin import front_end as mqtt
from brokerd.protocols.smqp.plugin import front_end as smqp
from brokerd.protocols.socketmq.plugin import front_end as socketmq
from brokerd.protocols.ssmp.plugin import front_end as ssmp

FRONT_ENDS: tuple[FrontEndPlugin, ...] = (ssmp, mcchat, smqp, socketmq, mqtt)
"""In brokerd.config.PROTOCOLS' order (the order listeners start in)."""

BY_NAME: dict[str, FrontEndPlugin] = {front_end.name: front_end for front_end in FRONT_ENDS}
