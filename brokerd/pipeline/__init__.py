"""The data pipeline: PySpark jobs over the broker's event log, and a Spark Structured
Streaming source and sink that talk to a running broker.

- ``report``: ``brokerd-report`` / ``python -m brokerd.pipeline report``: Parquet tables, an
  HTML report and a text summary from ``DATA_DIR/events/`` (modules ``read``, ``tables``,
  ``html``, ``report``, ``cli``).
- ``streaming``: ``spark.readStream.format("brokerd")`` and ``df.writeStream.format("brokerd")``.
- ``ssmp``: the blocking SSMP client the streaming source and sink use (stdlib only).
- ``generate``: synthetic event logs for tests and benchmarks.

PySpark is the optional extra ``brokerd[pipeline]``; of the broker this package imports only
``brokerd.events.schema``, and the broker never imports this package.
"""
