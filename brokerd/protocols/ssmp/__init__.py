"""SSMP 1.1 (Stupid-Simple Messaging Protocol): codec, server and client."""
