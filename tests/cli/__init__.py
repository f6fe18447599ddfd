"""Tests of brokerd's command-line tools."""
