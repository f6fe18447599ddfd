"""brokerd tests."""
