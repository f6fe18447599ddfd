"""The event log: what the broker did, as JSON lines the data pipeline reads.

``schema`` is the pure, versioned record format (the only module the pipeline imports);
``log.EventLog`` is the observer/recorder service the broker runs; ``writer`` writes files on
a thread of its own.  Nothing here imports the pipeline or PySpark.
"""
