"""The targets and their corpus directories (``tests/fuzz/corpus/TARGET/``): seed files
(``seed-NAME``, made by brokerd's encoders); what fuzzing runs kept because it reached code
the seeds did not (libFuzzer's ``-set_cover_merge=1``, named by content hash); and
``finding-*`` files, the inputs of findings fixed in brokerd, so that the quick loop replays
them."""
from __future__ import annotations

import importlib
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"
TARGETS = (
    "ssmp", "mcchat", "smqp", "socketmq", "mqtt",
    "cluster_envelope", "cluster_frames", "cluster_control", "cluster_redis", "admin_bodies",
)


def directory(name: str) -> Path:
    return CORPUS / name


def files(name: str) -> list[Path]:
    return sorted(path for path in directory(name).iterdir() if path.is_file())


def write_seeds(name: str) -> int:
    """Write the target's seeds (replacing older seed files); the number written."""
    target = importlib.import_module(f"tests.fuzz.targets.{name}")
    folder = directory(name)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("seed-*"):
        old.unlink()
    seeds = target.seeds()
    for seed_name, data in seeds.items():
        (folder / f"seed-{seed_name}").write_bytes(data)
    return len(seeds)
