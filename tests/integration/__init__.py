"""End-to-end tests on real sockets."""
