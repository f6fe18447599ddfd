"""The build context a ``.dockerignore`` leaves, by Docker's documented rules (the
moby/patternmatcher semantics the Docker CLI and BuildKit apply):

- one pattern a line; a line whose first character is ``#`` is a comment; blank lines are
  ignored; surrounding white space is trimmed; ``!`` makes an exception;
- a pattern is cleaned like Go's ``filepath.Clean`` and a leading ``/`` dropped (patterns are
  relative to the context root);
- ``*`` is any run of characters but ``/``, ``?`` one such character, ``[...]`` a class,
  ``\\`` escapes, ``**`` any number of directories (zero too);
- a path is matched by a pattern when the pattern matches it or the leading directories of
  it with as many components as the pattern has; the last pattern that matches decides
  (an exception re-includes).
"""
from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

_SPECIAL = set(".+()|{}$^")


def read_patterns(text: str) -> list[tuple[str, bool]]:
    """(pattern, is an exception) for each pattern line of a .dockerignore."""
    patterns = []
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        line = raw.strip()
        if not line:
            continue
        exception = line.startswith("!")
        if exception:
            line = line[1:].strip()
        if line:
            line = posixpath.normpath(line)
            if len(line) > 1 and line.startswith("/"):
                line = line[1:]
        patterns.append((line, exception))
    return patterns


def _regex(pattern: str) -> re.Pattern[str]:
    out = "^"
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            if pattern[i + 1:i + 2] == "*":
                i += 1
                if pattern[i + 1:i + 2] == "/":
                    i += 1
                out += ".*" if i + 1 >= len(pattern) else "(.*/)?"
            else:
                out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        elif ch in _SPECIAL:
            out += "\\" + ch
        else:
            out += ch  # letters, '/', and '[...]' classes as regular expressions read them
        i += 1
    return re.compile(out + "$")


def excluded(path: str, patterns: list[tuple[str, bool]]) -> bool:
    """Whether ``path`` (relative, ``/``-separated) is left out of the context."""
    parts = path.split("/")
    result = False
    for pattern, exception in patterns:
        regex = _regex(pattern)
        matched = bool(regex.match(path))
        depth = pattern.count("/") + 1
        if not matched and len(parts) > 1 and depth < len(parts):
            matched = bool(regex.match("/".join(parts[:depth])))
        if matched:
            result = not exception
    return result


def build_context(root: Path, dockerignore: str) -> set[str]:
    """The files of ``root`` the context holds (relative, ``/``-separated)."""
    patterns = read_patterns(dockerignore)
    found = set()
    for directory, _dirs, files in os.walk(root):
        for name in files:
            relative = Path(directory, name).relative_to(root).as_posix()
            if not excluded(relative, patterns):
                found.add(relative)
    return found
