"""brokerd's own modules, parsed once per test session: several tests read every module's
syntax tree (the settings contract, the front ends' imports, the count of ``Any``), and
parsing the 240 of them took each about a second of CPU."""
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


@cache
def brokerd_modules() -> tuple[tuple[str, ast.Module], ...]:
    """Each module of brokerd as (its path from the checkout's root, its syntax tree), in path
    order.  The trees are shared: read them, never change them."""
    return tuple((str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8"), str(path)))
                 for path in sorted((ROOT / "brokerd").rglob("*.py")))
