"""The core stays readable: no class over 500 lines and no function over 60 in brokerd/core
(STYLE.md: modules with one job, functions short).  The checker is shown catching each kind of
violation on a made-up module, so the test on the real core can fail."""
from __future__ import annotations

import ast

from tests.support.broker import REPO

MAX_CLASS_LINES = 500
MAX_FUNCTION_LINES = 60

STILL_TOO_LONG: set[tuple[str, str]] = set()
"""What is over a limit today and must shrink: listed by name so that nothing else may grow
past a limit, and checked to be still too long, so that an entry goes once it is fixed."""


def too_long(source: str, path: str) -> dict[tuple[str, str], int]:
    """The classes and functions of ``source`` over their limit: (path, qualified name) -> lines."""
    found: dict[tuple[str, str], int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                lines = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                limit = MAX_CLASS_LINES if isinstance(child, ast.ClassDef) else MAX_FUNCTION_LINES
                if lines > limit:
                    found[(path, name)] = lines
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_the_checker_finds_a_long_function_and_a_long_class():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    source = "def short():\n    pass\n\n\ndef long():\n" + body
    method = body.replace("    ", "        ")
    source += "class Big:\n" + "".join(f"    def m{i}(self):\n" + method for i in range(9))
    found = too_long(source, "toy.py")
    assert found[("toy.py", "long")] == MAX_FUNCTION_LINES + 1
    assert found[("toy.py", "Big")] > MAX_CLASS_LINES
    assert ("toy.py", "Big.m0") in found and ("toy.py", "short") not in found


def test_no_class_or_function_in_the_core_is_over_its_limit():
    found: dict[tuple[str, str], int] = {}
    for path in sorted((REPO / "brokerd" / "core").rglob("*.py")):
        found.update(too_long(path.read_text(encoding="utf-8"), str(path.relative_to(REPO))))
    assert {key: lines for key, lines in found.items() if key not in STILL_TOO_LONG} == {}
    assert STILL_TOO_LONG <= set(found), "fixed: remove it from STILL_TOO_LONG"

