"""The fuzz targets in the suite.

In-process (the quick loop): every file of every target's corpus, the seeds and what earlier
runs kept, decodes or is refused as its decoder's specification says (a regression suite of
hostile input), and every seed is accepted by one of its target's decoders (so a target does
reach its decoder's code, not only its first refusal).

Under atheris (slow: a process per run): a short coverage-guided run of each target over its
corpus and mutations of it finds nothing; and the runner reports a finding when a decoder
raises an exception its specification does not allow, or holds more than its limit, on an
input of the corpus (tests/fuzz/broken.py), so a short run can fail."""
from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz.campaign import FINDINGS, MAX_LEN
from tests.fuzz.corpus import TARGETS, directory, files
from tests.support.broker import REPO
from tests.support.processes import repo_env

RUNS = 20_000
SECONDS = 4
"""A run's bound: whichever comes first (about 4 s of a busy machine's time per target)."""


def accepted(outcome: tuple[tuple[Any, Any], ...]) -> bool:
    """Whether one of the target's decoders gave a result and no error."""
    return any(result not in (None, [], ()) and error is None for result, error in outcome)


@pytest.mark.parametrize("target", TARGETS)
def test_the_corpus_decodes_or_is_refused_as_specified(target: str) -> None:
    check = importlib.import_module(f"tests.fuzz.targets.{target}").check
    inputs = files(target)
    assert inputs
    for path in inputs:
        check(path.read_bytes())  # an unspecified exception or a broken property fails the test


@pytest.mark.parametrize("target", TARGETS)
def test_the_seeds_are_stored_and_accepted(target: str) -> None:
    module = importlib.import_module(f"tests.fuzz.targets.{target}")
    for name, data in module.seeds().items():
        assert (directory(target) / f"seed-{name}").read_bytes() == data, "python -m tests.fuzz --seeds"
        assert accepted(module.check(data)), name


def fuzz(target: str, work: Path, corpus: Path) -> subprocess.CompletedProcess:
    """A bounded run of ``target`` over ``corpus`` (not written to: new inputs go to ``work``);
    its output (libFuzzer's and the target's traceback) in ``stdout``."""
    (work / "new").mkdir()
    return subprocess.run(
        [sys.executable, "-m", "tests.fuzz", target, f"-runs={RUNS}", f"-max_total_time={SECONDS}",
         f"-max_len={MAX_LEN}", "-timeout=30", "-rss_limit_mb=1024", f"-artifact_prefix={work}/",
         str(work / "new"), str(corpus)],
        cwd=REPO, env=repo_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        timeout=120,
    )


def findings(work: Path) -> list[Path]:
    return [path for path in work.iterdir() if path.name.startswith(FINDINGS)]


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_a_short_fuzz_run_finds_nothing(target: str, tmp_path: Path) -> None:
    result = fuzz(target, tmp_path, directory(target))
    assert (result.returncode, findings(tmp_path)) == (0, []), result.stdout[-4000:]
    assert re.search(r"^Done \d+ runs in", result.stdout, re.M)  # ran to its bound: the corpus, then mutations


@pytest.mark.slow
@pytest.mark.parametrize("target, seed, says", [
    ("broken-raises", b"\x80SUBSCRIBE room\n", "KeyError: 'a decoder bug: SUBSCRIBE'"),
    ("broken-grows", b"\x80MCAST room hello\nMCAST room unfinished", "more than its limit 8"),
])
def test_a_broken_decoder_is_reported_as_a_finding(target: str, seed: bytes, says: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "seed").write_bytes(seed)
    work = tmp_path / "work"
    work.mkdir()
    result = fuzz(target, work, corpus)
    assert result.returncode != 0
    assert says in result.stdout
    [crash] = findings(work)
    assert crash.name.startswith("crash-")
    broken = importlib.import_module("tests.fuzz.broken").CHECKS[target]
    with pytest.raises((KeyError, AssertionError)):
        broken(crash.read_bytes())  # the input it kept reproduces the finding
    assert accepted(importlib.import_module("tests.fuzz.targets.ssmp").check(seed))  # the real parser takes it
