"""Helpers shared by brokerd's tests: a throwaway PKI and its pytest fixture."""
