"""MCCHAT v1 (binary opcodes and NUL-terminated UTF-8 strings): codec, server and client."""
