"""``python -m tests.fuzz TARGET [libFuzzer options] [CORPUS_DIR ...]``: fuzz one target with
atheris (docs/testing.md); ``python -m tests.fuzz --seeds`` writes every target's seed corpus
(valid input made by brokerd's own encoders) into ``tests/fuzz/corpus/TARGET/``."""
from __future__ import annotations

import importlib
import shlex
import sys
from pathlib import Path

from tests.fuzz.corpus import TARGETS, write_seeds


DICTIONARIES = Path(__file__).parent / "dictionaries"
"""libFuzzer dictionaries of the JSON targets: JSON's tokens and the names the decoders compare
(json is C code: coverage alone would not lead the mutations to a field name)."""
BROKEN = ("broken-raises", "broken-grows")
"""The deliberately broken targets of tests/fuzz/broken.py (the runner's own tests)."""


def fuzz(name: str, options: list[str]) -> None:
    import atheris  # the test extra's; only this runner needs it

    with atheris.instrument_imports(include=["brokerd"]):
        if name in BROKEN:
            check = importlib.import_module("tests.fuzz.broken").CHECKS[name]
        else:
            check = importlib.import_module(f"tests.fuzz.targets.{name}").check
    dictionary = DICTIONARIES / f"{name}.dict"
    if dictionary.exists() and not any(option.startswith("-dict=") for option in options):
        options = [f"-dict={dictionary}", *options]
    # libFuzzer runs argv[0] through the shell for -merge=1 and -fork: this runner, not __main__.py
    command = f"{shlex.quote(sys.executable)} -m tests.fuzz {name}"
    atheris.Setup([command, *options], check)
    atheris.Fuzz()


def main(argv: list[str]) -> None:
    if argv[:1] == ["--seeds"]:
        for name in TARGETS:
            print(name, write_seeds(name))
        return
    if not argv or argv[0] not in TARGETS + BROKEN:
        sys.exit(f"usage: python -m tests.fuzz TARGET [libFuzzer options] [CORPUS_DIR ...] | --seeds\n"
                 f"targets: {' '.join(TARGETS)}")
    fuzz(argv[0], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
