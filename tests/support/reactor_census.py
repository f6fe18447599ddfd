"""Count the test functions that run on Twisted's global reactor, per directory:

    python -m tests.support.reactor_census [--list DIR]

A test runs on the global reactor when pytest-twisted drives it (``@pytest_twisted...``
decorators, ``pytest_twisted.blockon``) or its body (or a module-level helper it calls by name)
uses ``reactor``/``reactor()``/``_reactor()``.  In-memory tests (StringTransport, Clock,
MemoryReactorClock, iosim) do not.  docs/testing.md records the counts.
"""
from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REACTOR_NAMES = {"reactor", "_reactor", "global_reactor"}


def _uses_reactor(node: ast.AST) -> bool:
    """True if ``node`` names the global reactor: a reactor name it does not bind itself (a
    ``reactor = MemoryReactor()`` in the function is an in-memory one), or ``blockon``."""
    local = {
        target.id
        for child in ast.walk(node) if isinstance(child, ast.Assign)
        for target in child.targets if isinstance(target, ast.Name)
    }
    local |= {arg.arg for child in ast.walk(node) if isinstance(child, ast.arguments) for arg in child.args}
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and child.id in REACTOR_NAMES - local:
            return True
        if isinstance(child, ast.Attribute) and child.attr == "blockon":
            return True
    return False


def _driven_by_pytest_twisted(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("pytest_twisted" in ast.unparse(decorator) for decorator in function.decorator_list)


def census(root: Path = TESTS) -> tuple[Counter[str], Counter[str], list[str]]:
    """(all tests per directory, global-reactor tests per directory, their names)."""
    total: Counter[str] = Counter()
    on_reactor: Counter[str] = Counter()
    names: list[str] = []
    for path in sorted(root.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        helpers = {
            node.name
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("test")
            and _uses_reactor(node)
        }
        functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and node.name.startswith("test_")]
        directory = str(path.parent.relative_to(root))
        for function in functions:
            total[directory] += 1
            calls = {child.id for child in ast.walk(function) if isinstance(child, ast.Name)}
            if _driven_by_pytest_twisted(function) or _uses_reactor(function) or calls & helpers:
                on_reactor[directory] += 1
                names.append(f"{path.relative_to(root)}::{function.name}")
    return total, on_reactor, names


def main() -> None:
    total, on_reactor, names = census()
    if sys.argv[1:2] == ["--list"]:
        prefix = sys.argv[2] if len(sys.argv) > 2 else ""
        print("\n".join(name for name in names if name.startswith(prefix)))
        return
    for directory in sorted(total):
        print(f"{directory:32} {on_reactor[directory]:4} of {total[directory]:4} on the global reactor")
    print(f"{'all':32} {sum(on_reactor.values()):4} of {sum(total.values()):4} on the global reactor")


if __name__ == "__main__":
    main()
