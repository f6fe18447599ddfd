"""mypy passes on brokerd with the repository's configuration (setup.cfg's ``[mypy]``: the
zope plugin, unused ignores are errors), except on the modules NOT_YET_TYPED lists; and
``type: ignore`` in brokerd stays rare, each naming its error code and saying why.

One mypy run over the whole package checks both ways: a module outside the list with an error
fails, and so does a listed module mypy now passes (take it off the list: a module once typed
stays typed).  A new module is checked from its first line.  It is the session's one run
(tests/support/typecheck.py), which also checks the probes below and those of the SMQP and
MQTT mixin tests.
"""
from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.support.sources import brokerd_modules
from tests.support.typecheck import MypyReport, probe

ROOT = Path(__file__).resolve().parent.parent
BROKERD = ROOT / "brokerd"

NOT_YET_TYPED: frozenset[str] = frozenset()
"""The modules mypy still reports errors in (the rest of brokerd passes)."""

PIPELINE_EXTRA = all(importlib.util.find_spec(name) is not None for name in ("pyspark", "pyarrow"))
"""brokerd.pipeline is checked where its extra is installed: without PySpark mypy cannot see
the types it is written against (the quick loop runs with the ``test`` extra only)."""

IGNORES_WITHOUT_A_REASON_YET: frozenset[str] = frozenset()
"""The modules whose ``type: ignore`` comments do not all say why yet (every other module's do)."""

IGNORE_CEILING = 29
"""``type: ignore`` comments in brokerd at most: lower it as modules are typed (the goal was 30)."""

ANY_CEILING = 199
"""Annotations that are ``Any`` in brokerd (a parameter's, ``*args``/``**kwargs``' included, a
return's, a variable's) at most: lower it as modules are typed.  ``Any`` stays only where a
third-party API leaves no choice (PySpark and pyarrow objects, txredisapi's replies, Autobahn's
internals) or a value passes through untouched (``**fields`` handed on to a logger)."""

_IGNORE = re.compile(r"#\s*type:\s*ignore\b")
_IGNORE_WITH_REASON = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(?:,\s*[a-z-]+)*\]\s*#\s*\S")


def _unchecked(path: str) -> bool:
    return path in NOT_YET_TYPED or (not PIPELINE_EXTRA and path.startswith("brokerd/pipeline/"))


SEAMS = probe("seams", """\
from brokerd.cluster.localbroker import LocalBroker
from brokerd.cluster.redis_engine import RedisEngine
from brokerd.cluster.sharing import PlacingEngine
from brokerd.cluster.shards import ShardsEngine
from brokerd.core.broker import Broker
from brokerd.protocols.socketmq.hub import Hub
from brokerd.protocols.socketmq.remote import RequestHub


def seams(broker: Broker, engine: RedisEngine, hub: Hub) -> tuple[LocalBroker, PlacingEngine, ShardsEngine, RequestHub]:
    return broker, engine, engine, hub
""")
"""The Protocols that stand for a collaborator, and the class that is it: checked with the rest."""


def test_the_broker_and_the_engine_meet_the_protocols_that_stand_for_them(mypy_report: MypyReport) -> None:
    assert not mypy_report.errors_in(SEAMS), "\n".join(mypy_report.errors_in(SEAMS))


def test_mypy_passes_on_every_module_not_listed(mypy_report: MypyReport) -> None:
    refused = [line for path, lines in sorted(mypy_report.errors.items())
               if path.startswith("brokerd/") and not _unchecked(path) for line in lines]
    assert not refused, "\n".join(refused)


def test_every_listed_module_exists_and_still_has_errors(mypy_report: MypyReport) -> None:
    """A module mypy passes leaves NOT_YET_TYPED, so that it is checked from then on."""
    missing = sorted(path for path in NOT_YET_TYPED if not (ROOT / path).is_file())
    typed = sorted(path for path in NOT_YET_TYPED if (ROOT / path).is_file() and not mypy_report.errors_in(path))
    assert not missing and not typed, f"gone: {missing}; now typed, take off NOT_YET_TYPED: {typed}"


CONFIGURATION_PROBE = probe("configuration_probe", (
    "from zope.interface import Interface, implementer\n\n\n"
    "class ISized(Interface):\n"
    "    def size() -> int:\n"
    "        \"\"\"How big.\"\"\"\n\n\n"
    "@implementer(ISized)\n"
    "class Box:\n"
    "    def size(self) -> int:\n"
    "        return 1\n\n\n"
    "@implementer(ISized)\n"
    "class Hollow:\n"
    "    pass\n\n\n"
    "def measure(thing: ISized) -> int:\n"
    "    return thing.size()\n\n\n"
    "measure(Box())\n"
    "unused: int = 1  # type: ignore[assignment]\n"
    "bare: int = ''  # type: ignore\n"
))


def test_the_configuration_finds_what_it_is_meant_to(mypy_report: MypyReport) -> None:
    """The checks above can fail: with setup.cfg's configuration mypy reports a class that
    lacks a method of the interface it declares (the zope plugin), an unused ignore and one
    without its code; and it accepts the @implementer class where the interface is expected."""
    lines = [line.split(": error: ", 1)[1] for line in mypy_report.errors_in(CONFIGURATION_PROBE)]
    assert len(lines) == 3, mypy_report.output
    assert "'Hollow' is missing following 'ISized' interface members: size." in lines[0]
    assert "[unused-ignore]" in lines[1] and "[ignore-without-code]" in lines[2]


def _ignores(source: str) -> list[tuple[int, str]]:
    """The ``type: ignore`` comments of a module's source (comments only, not strings)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(token.start[0], token.string) for token in tokens
            if token.type == tokenize.COMMENT and _IGNORE.search(token.string)]


@pytest.fixture(scope="module")
def brokerd_ignores() -> list[tuple[str, int, str]]:
    """Every ``type: ignore`` of brokerd as (path, line, comment): read once for the tests below."""
    return [(str(path.relative_to(ROOT)), line, comment)
            for path in sorted(BROKERD.rglob("*.py")) for line, comment in _ignores(path.read_text(encoding="utf-8"))]


def test_type_ignores_in_brokerd_stay_under_the_ceiling(brokerd_ignores: list[tuple[str, int, str]]) -> None:
    count = len(brokerd_ignores)
    assert count <= IGNORE_CEILING, f"{count} type: ignore in brokerd, more than {IGNORE_CEILING}"


def test_every_type_ignore_names_its_code_and_says_why(brokerd_ignores: list[tuple[str, int, str]]) -> None:
    unexplained = [(path, f"{path}:{line}: {comment}") for path, line, comment in brokerd_ignores
                   if not _IGNORE_WITH_REASON.search(comment)]
    new = [where for path, where in unexplained if path not in IGNORES_WITHOUT_A_REASON_YET]
    assert not new, "a type: ignore needs [its-code] and a reason after it:\n" + "\n".join(new)
    explained = sorted(IGNORES_WITHOUT_A_REASON_YET - {path for path, _where in unexplained})
    assert not explained, f"every ignore of these says why now: take them off IGNORES_WITHOUT_A_REASON_YET: {explained}"


def test_the_ignore_checks_see_comments_and_reasons_only() -> None:
    source = (
        "def f() -> None:\n"
        "    \"\"\"Mentions # type: ignore in a docstring, which is no ignore.\"\"\"\n"
        "    a = 1  # type: ignore[assignment]  # Twisted's hint is too narrow\n"
        "    b = 2  # type: ignore[assignment]\n"
        "    c = 3  # type: ignore[attr-defined, union-attr]  # see the interface\n"
        "    d = 4  # type: ignore\n"
    )
    found = _ignores(source)
    assert [line for line, _comment in found] == [3, 4, 5, 6]
    assert [bool(_IGNORE_WITH_REASON.search(comment)) for _line, comment in found] == [True, False, True, False]


def _is_any(annotation: ast.expr | None) -> bool:
    return (isinstance(annotation, ast.Name) and annotation.id == "Any"
            or isinstance(annotation, ast.Attribute) and annotation.attr == "Any"
            or isinstance(annotation, ast.Constant) and annotation.value == "Any")


def _any_annotations(tree: ast.Module) -> int:
    """How many annotations of a module are ``Any`` (``dict[str, Any]`` is not one)."""
    found = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            parameters = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                          arguments.vararg, arguments.kwarg]
            found += sum(_is_any(p.annotation) for p in parameters if p is not None)
            found += _is_any(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found += _is_any(node.annotation)
    return found


def test_any_annotations_in_brokerd_stay_under_the_ceiling() -> None:
    counts = {path: _any_annotations(tree) for path, tree in brokerd_modules()}
    total = sum(counts.values())
    most = sorted(counts.items(), key=lambda item: -item[1])[:10]
    assert total <= ANY_CEILING, f"{total} Any annotations in brokerd, more than {ANY_CEILING}; the most: {most}"


def test_the_any_count_sees_annotations_only() -> None:
    source = (
        "from typing import Any\n"
        "import typing\n\n\n"
        "def f(a: Any, *args: Any, b: dict[str, Any], **kwargs: Any) -> Any:\n"
        "    \"\"\"a: Any in a docstring is no annotation.\"\"\"\n"
        "    c: Any = 1\n"
        "    d: typing.Any = 2\n"
        "    e: list[Any] = []\n"
        "    return c  # -> Any in a comment neither\n\n\n"
        "async def g(x: 'Any') -> None:\n"
        "    pass\n"
    )
    assert _any_annotations(ast.parse(source)) == 7
