"""Onion services: brokerd's ``onion:PORT`` listeners, through txtorcon and a Tor process.

Not a front end: any protocol's listener may be an onion service.  :mod:`.control` reaches
Tor (a running one's control port, or a Tor brokerd launches), :mod:`.keys` keeps the
services' keys in DATA_DIR and the client-authorization keys, and :mod:`.listener` is the
server endpoint that listens on loopback and asks Tor to publish the service (docs/tor.md).
"""
