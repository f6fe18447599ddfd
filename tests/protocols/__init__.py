"""Tests of the wire protocols."""
