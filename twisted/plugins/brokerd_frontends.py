"""brokerd's front ends as Twisted plugins: ``getPlugins(IFrontEnd)`` finds these five, the
objects brokerd.tap builds its listeners with (brokerd.frontends)."""
from brokerd.frontends import mcchat, mqtt, smqp, socketmq, ssmp

__all__ = ["ssmp", "mcchat", "smqp", "socketmq", "mqtt"]
