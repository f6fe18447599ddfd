"""A broker for the tests: makeService with SSMP on 127.0.0.1:PORT (open login) and an
EventLog that records payloads, flushing every 0.2 s.  Stops on SIGTERM."""
from __future__ import annotations

import argparse
from pathlib import Path

from twisted.internet import reactor

from brokerd.config import Settings
from brokerd.events.log import EventLog
from brokerd.tap import makeService


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args()
    settings = Settings(
        listeners={"ssmp": [f"tcp:{args.port}:interface=127.0.0.1"]}, open_login=True, data_dir=Path(args.data_dir)
    )
    service = makeService(settings, reactor)
    for child in list(service):
        if isinstance(child, EventLog):  # tap.py's own log, once it has one: ours replaces it
            service.removeService(child)
    log = EventLog(args.data_dir, reactor=reactor, include_payloads=True, flush_interval=0.2)
    service.runtime.broker.observer = log
    log.startService()
    service.startService()
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.addSystemEventTrigger("before", "shutdown", log.stopService)
    reactor.run()


if __name__ == "__main__":
    main()
