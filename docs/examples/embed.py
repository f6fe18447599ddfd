"""Run brokerd inside an existing Twisted program (docs/embedding.md)."""
import sys

from twisted.application.service import MultiService
from twisted.internet import reactor

from brokerd.config import Settings
from brokerd.tap import makeService

settings = Settings(listeners={"ssmp": ["tcp:8787:interface=127.0.0.1"]}, open_login=True)
app = MultiService()                      # your program's own services live here too
broker_service = makeService(settings, reactor)
broker_service.setServiceParent(app)
broker = broker_service.runtime.broker    # the shared Broker: publish from your own code
app.startService()
reactor.addSystemEventTrigger("before", "shutdown", app.stopService)
print("brokerd embedded; SSMP on 127.0.0.1:8787", file=sys.stderr, flush=True)
reactor.run()
