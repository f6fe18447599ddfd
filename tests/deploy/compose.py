"""deploy/docker-compose.yml read without a YAML library (PyYAML is not a dependency; when it
is installed, :func:`load` checks that both readings agree).

The reader takes the subset the file is written in and refuses anything else, so a construct
it does not know fails the test instead of being misread: block mappings by indentation,
``key: value`` with plain scalars (integers become ints), flow sequences and mappings
(``[...]``, ``{...}``) of double-quoted (JSON) strings, plain scalars and nested flows, empty
values (None), and comment lines.  No anchors, aliases, block sequences, multi-line or
single-quoted scalars, tags or documents.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

PLAIN = re.compile(r"[^\s\[\]{},\"'#&*!|>%@`][^\[\]{},\"#]*")
KEY = re.compile(r"^( *)([A-Za-z0-9_.-]+):(?: (.*))?$")


class Unsupported(ValueError):
    """A line the subset does not cover."""


def load(path: Path) -> Any:
    text = path.read_text()
    document = parse(text)
    try:
        import yaml
    except ModuleNotFoundError:
        return document
    assert yaml.safe_load(text) == document, "the minimal reader disagrees with PyYAML"
    return document


def parse(text: str) -> dict[str, Any]:
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1)
             if line.strip() and not line.lstrip().startswith("#")]
    document, rest = _mapping(lines, 0)
    if rest:
        number, line = rest[0]
        raise Unsupported(f"line {number}: unexpected indentation: {line!r}")
    return document


def _mapping(lines: list[tuple[int, str]], indent: int) -> tuple[dict[str, Any], list[tuple[int, str]]]:
    result: dict[str, Any] = {}
    while lines:
        number, line = lines[0]
        found = KEY.match(line)
        if found is None:
            raise Unsupported(f"line {number}: not a 'key: value' line: {line!r}")
        depth = len(found.group(1))
        if depth < indent:
            break
        if depth > indent:
            raise Unsupported(f"line {number}: unexpected indentation: {line!r}")
        key, value = found.group(2), found.group(3)
        if key in result:
            raise Unsupported(f"line {number}: key {key!r} given twice")
        lines = lines[1:]
        if value is not None and value.strip():
            result[key] = _flow_value(value.strip(), number)
        elif lines and _indent(lines[0][1]) > indent:
            result[key], lines = _mapping(lines, _indent(lines[0][1]))
        else:
            result[key] = None
    return result, lines


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _flow_value(text: str, number: int) -> Any:
    value, end = _flow(text, 0, number)
    if text[end:].strip():
        raise Unsupported(f"line {number}: text after the value: {text[end:]!r}")
    return value


def _flow(text: str, position: int, number: int) -> tuple[Any, int]:
    position = _blank(text, position)
    if position >= len(text):
        raise Unsupported(f"line {number}: a value is missing")
    opening = text[position]
    if opening in "[{":
        closing = "]" if opening == "[" else "}"
        items: list[Any] = []
        pairs: dict[str, Any] = {}
        position = _blank(text, position + 1)
        while text[position:position + 1] != closing:
            if opening == "{":
                key, position = _flow(text, position, number)
                if text[position:position + 1] != ":":
                    raise Unsupported(f"line {number}: ':' expected in {text!r}")
                pairs[key], position = _flow(text, position + 1, number)
            else:
                item, position = _flow(text, position, number)
                items.append(item)
            position = _blank(text, position)
            if text[position:position + 1] == ",":
                position = _blank(text, position + 1)
            elif text[position:position + 1] != closing:
                raise Unsupported(f"line {number}: ',' or {closing!r} expected in {text!r}")
        return (items if opening == "[" else pairs), position + 1
    if opening == '"':
        decoder = json.JSONDecoder()
        return decoder.raw_decode(text, position)
    found = PLAIN.match(text, position)
    if found is None:
        raise Unsupported(f"line {number}: not in the subset: {text[position:]!r}")
    word = found.group(0).rstrip()
    if ": " in word or word.endswith(":"):
        word = word.split(":")[0]  # a key inside a flow mapping
    return (int(word) if word.isdigit() else word), position + len(word)


def _blank(text: str, position: int) -> int:
    while position < len(text) and text[position] == " ":
        position += 1
    return position
