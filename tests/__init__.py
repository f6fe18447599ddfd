"""brokerd's test suite: it mirrors brokerd/."""
