"""import-linter contract type ``no_cycles``: no import cycle among the root package's modules.

setup.cfg declares it (``contract_types``) and the contract ``no-cycles``; lint-imports, run
from the repository's root (which it puts on ``sys.path``), imports this module.

import-linter's own ``acyclic_siblings`` compares the children of each package with each other,
down to a depth: it misses a package whose ``__init__`` and one of its own submodules import
each other, and anything deeper than the depth.  This contract has no such gap: over the graph
import-linter built (every import statement, at module level, inside a function or under
``if TYPE_CHECKING:``), it fails on every strongly connected component of more than one
module, and lists the imports that close it.  docs/architecture.md says why type-checking
imports count.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain.contract import Contract, ContractCheck


class NoCyclesContract(Contract):
    """Kept when the root packages' import graph is acyclic."""

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        roots = tuple(self.session_options["root_packages"])
        own = {m for m in graph.modules if m in roots or m.startswith(tuple(r + "." for r in roots))}
        edges = {m: sorted(graph.find_modules_directly_imported_by(m) & own) for m in sorted(own)}
        cycles = sorted(sorted(c) for c in strongly_connected(edges) if len(c) > 1)
        return ContractCheck(kept=not cycles, metadata={
            "cycles": [closing_imports(graph, cycle, edges) for cycle in cycles]})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for imports in check.metadata["cycles"]:
            modules = {importer for importer, _, _ in imports}
            output.print_error(f"An import cycle of {len(modules)} modules:")
            for importer, imported, lines in imports:
                output.print_error(f"- {importer} -> {imported} (l.{', '.join(map(str, lines))})", bold=False)
            output.new_line()


def closing_imports(graph: ImportGraph, cycle: list[str],
                    edges: Mapping[str, list[str]]) -> list[tuple[str, str, list[int]]]:
    """The imports between the modules of ``cycle``: (importer, imported, line numbers)."""
    members = set(cycle)
    return [(importer, imported,
             sorted(detail["line_number"] for detail in graph.get_import_details(importer=importer, imported=imported)))
            for importer in cycle for imported in edges[importer] if imported in members]


def strongly_connected(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of the graph ``edges`` (node -> successors),
    without recursion: an import chain may be deeper than Python's recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in edges:
        if root in index:
            continue
        visit(root)
        work = [(root, iter(edges[root]))]
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    visit(successor)
                    work.append((successor, iter(edges[successor])))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(component)
    return components
