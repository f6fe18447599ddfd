"""Tests of brokerd.auth: credentials, checkers, realm and the TLS layer."""
