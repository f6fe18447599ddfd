"""The fault-injection run of a brokerd cluster: ``python -m tests.faults`` (tests/faults/run.py)."""
