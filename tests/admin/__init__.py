"""The admin listener, the operator log and the statistics topics."""
