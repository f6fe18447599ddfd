"""One module per fuzz target: ``check(data)`` and ``seeds()``."""
