"""Secret files for test brokers: created readable by their owner only, since brokerd refuses
a secret file (token, password, key, accounts) that group or others can access."""
from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, content: str | bytes) -> Path:
    """Write ``content`` to ``path`` with mode 600 (whatever the umask or an older file's mode)."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)
    return Path(path)
