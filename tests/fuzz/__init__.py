"""Coverage-guided fuzz targets for every decoder that reads the network (atheris/libFuzzer).

Each module of :mod:`tests.fuzz.targets` is one target: ``check(data)`` decodes the bytes
and asserts the property every decoder owes hostile input (the decoder's own error and
nothing else; the same answer whatever the chunking; nothing held past its limits).
``python -m tests.fuzz TARGET [libFuzzer options] [CORPUS ...]`` fuzzes one (docs/testing.md).

Nothing in this package may import brokerd at module level outside the targets: the runner
imports the targets under atheris' instrumentation, and a brokerd module imported before it
would run uninstrumented (no coverage feedback).
"""
