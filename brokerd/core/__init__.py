"""The Broker core: sessions, topics, routing and fan-out.  It never imports a protocol."""
