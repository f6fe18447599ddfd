"""Tests of SSMP: codec, server and client."""
