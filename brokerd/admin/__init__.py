"""Operating brokerd: the operator log, the admin listener (Prometheus metrics, a JSON API, the
dashboard) and the ``$SYS`` statistics topics.

It sits between brokerd.tap (which builds it from the settings) and the front ends: it reads
the Broker's counters, the event log's and the store's, and never adds work to the hot path.
"""
