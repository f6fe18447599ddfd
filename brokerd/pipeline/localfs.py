"""The FileSystem calls of compaction and reading (sparkio.HadoopFS's), on local paths.

A local report (brokerd.pipeline.report without Spark) compacts and reads a local data dir without
starting a JVM, so it cannot use Hadoop's FileSystem through Spark; this class has the same
methods with the same results on local paths.  A rename of a directory is ``os.rename``, atomic
on one filesystem, which the crash safety of compaction relies on as it does on Hadoop's.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
from urllib.parse import urlparse

COMPACTED_DIR = "events-compacted"
"""Where compaction writes a data dir's Parquet hours, beside ``events/``: named here, below
every module that needs pyarrow, so that the CLI can tell an empty data dir without it."""


def local_path(path: str) -> str | None:
    """``path`` on the local filesystem, or None for cluster storage (hdfs://, s3a://, ...)."""
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return parsed.path
    return path if parsed.scheme == "" or len(parsed.scheme) == 1 else None


class LocalFS:
    """HadoopFS's methods on the local filesystem (plain paths: see :func:`local_path`)."""

    def exists(self, name: str) -> bool:
        return os.path.exists(name)

    def glob(self, base: str, pattern: str, directories: bool = False) -> list[str]:
        """Paths under ``base`` matching ``pattern`` (only directories, if asked)."""
        found = sorted(glob.glob(os.path.join(glob.escape(base), pattern)))
        return [path for path in found if not directories or os.path.isdir(path)]

    def files(self, directory: str, suffix: str) -> list[tuple[str, int]]:
        if not os.path.isdir(directory):
            return []
        return sorted(
            (entry.name, entry.stat().st_size)
            for entry in os.scandir(directory)
            if entry.name.endswith(suffix) and entry.is_file()
        )

    def read_text(self, name: str) -> str:
        with open(name, encoding="utf-8") as file:
            return file.read()

    def write_text(self, name: str, text: str) -> None:
        with open(name, "w", encoding="utf-8") as file:
            file.write(text)

    def mkdirs(self, name: str) -> None:
        os.makedirs(name, exist_ok=True)

    def rename(self, source: str, target: str) -> bool:
        try:
            os.rename(source, target)
        except OSError:
            return False
        return True

    def delete(self, name: str, recursive: bool = True) -> None:
        """A file, or (``recursive``) a directory and all in it."""
        if recursive and os.path.isdir(name) and not os.path.islink(name):
            shutil.rmtree(name)
        elif os.path.lexists(name):
            os.remove(name)


def usable(master: str | None, data_dir: str, out: str) -> bool:
    """Whether the report may run in this process without Spark: a local master (``local``,
    ``local[*]``, ``local[N]``) or none, and local paths (whether the inputs parse is known
    only when they are read)."""
    local_master = master is None or re.fullmatch(r"local(\[(\*|[0-9]+)\])?", master) is not None
    return local_master and local_path(data_dir) is not None and local_path(out) is not None
