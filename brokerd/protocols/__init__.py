"""The wire-protocol front ends; each depends on brokerd.core and brokerd.auth, never on another."""
