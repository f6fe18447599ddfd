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

Hour = tuple[str, str]


def local_path(path: str) -> str | None:
    """``path`` on the local filesystem, or None for cluster storage (hdfs://, s3a://, ...)."""
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return parsed.path
    return path if parsed.scheme == "" or len(parsed.scheme) == 1 else None


class _Status:
    """What compaction reads of a glob result (Hadoop's FileStatus: only ``getPath``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def getPath(self) -> _Status:  # noqa: N802 - Hadoop's name, so compaction takes either
        return self

    def toString(self) -> str:  # noqa: N802
        return self.name


class LocalFS:
    """HadoopFS's methods on the local filesystem (``file:`` URIs or plain paths)."""

    @staticmethod
    def _p(name: str) -> str:
        found = local_path(name)
        if found is None:
            raise ValueError(f"{name}: not a local path")
        return found

    def exists(self, name: str) -> bool:
        return os.path.exists(self._p(name))

    def glob(self, pattern: str) -> list[_Status]:
        return [_Status(name) for name in sorted(glob.glob(self._p(pattern)))]

    def hours(self, base: str, marker: str | None = None) -> dict[Hour, str]:
        """``date=/hour=`` directories under ``base`` (with ``marker`` in them, if given)."""
        result: dict[Hour, str] = {}
        root = self._p(base)
        for path in glob.glob(os.path.join(glob.escape(root), "date=*", "hour=*")):
            if not os.path.isdir(path):
                continue
            hour = os.path.basename(path).partition("=")[2]
            date = os.path.basename(os.path.dirname(path)).partition("=")[2]
            location = f"{base}/date={date}/hour={hour}"
            if marker is None or os.path.exists(os.path.join(path, marker)):
                result[(date, hour)] = location
        return result

    def files(self, directory: str, suffix: str) -> list[tuple[str, int]]:
        root = self._p(directory)
        if not os.path.isdir(root):
            return []
        return sorted(
            (entry.name, entry.stat().st_size)
            for entry in os.scandir(root)
            if entry.name.endswith(suffix) and entry.is_file()
        )

    def read_text(self, name: str) -> str:
        with open(self._p(name), encoding="utf-8") as file:
            return file.read()

    def write_text(self, name: str, text: str) -> None:
        with open(self._p(name), "w", encoding="utf-8") as file:
            file.write(text)

    def mkdirs(self, name: str) -> None:
        os.makedirs(self._p(name), exist_ok=True)

    def rename(self, source: str, target: str) -> bool:
        try:
            os.rename(self._p(source), self._p(target))
        except OSError:
            return False
        return True

    def delete(self, name: str, recursive: bool = True) -> None:
        path = self._p(name)
        if os.path.isdir(path) and not os.path.islink(path):
            if recursive:
                shutil.rmtree(path)
            else:
                os.rmdir(path)
        elif os.path.lexists(path):
            os.remove(path)


def usable(master: str | None, data_dir: str, out: str) -> bool:
    """Whether the report may run in this process without Spark: a local master (``local``,
    ``local[*]``, ``local[N]``) or none, and local paths (whether the inputs parse is known
    only when they are read)."""
    local_master = master is None or re.fullmatch(r"local(\[(\*|[0-9]+)\])?", master) is not None
    return local_master and local_path(data_dir) is not None and local_path(out) is not None
