"""No import circles in corl's own code: the module graph of corl/, proto/, services/ and trainer/
(read statically, every ``import`` at any depth) has no cycle.

A circle works only while the import order happens to suit it, and it hides which layer depends on
which. Imports under ``if TYPE_CHECKING:`` never run, so they are not edges.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Folder -> the package name it installs as (pyproject.toml's [tool.setuptools.package-dir]).
PACKAGES = {"corl": "corl", "proto": "corl.proto", "services": "corl.services", "trainer": "corl.trainer"}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages (a package is its __init__.py)."""
    found: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The modules of ``known`` one import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            # Relative: level 1 is the module's own package (the module itself, for a package's __init__).
            base = module.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        # `from pkg import name` loads pkg.name where that is a module, else pkg itself.
        names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source for alias in node.names]
    targets = set()
    for name in names:
        # `import a.b.c` of something that is not a module (an attribute): its closest module.
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            targets.add(name)
    return targets


def module_edges(module: str, is_package: bool, source: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that the module's source imports (itself left out)."""
    edges: set[str] = set()
    for node in _imports(ast.parse(source)):
        edges |= _targets(module, is_package, node, known)
    return edges - {module}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: module_edges(m, p.name == "__init__.py", p.read_text(), known) for m, p in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete circle through a component, to name in the failure (a -> b -> ... -> a)."""
    members = set(component)
    path = [component[0]]
    seen = {component[0]}
    while True:
        following = sorted(graph[path[-1]] & members)
        back = [m for m in following if m in seen]
        if back:
            return path[path.index(back[0]) :] + [back[0]]
        path.append(following[0])
        seen.add(following[0])


def test_reader_reads_imports_as_python_runs_them() -> None:
    known = {"corl", "corl.a", "corl.b", "corl.hidden", "corl.pkg", "corl.pkg.sub", "corl.pkg.other"}
    source = """
from typing import TYPE_CHECKING
import corl.a.attribute
from . import sub
from .. import b
from corl.pkg import other, some_name
import json

def later():
    from corl import hidden as _

if TYPE_CHECKING:
    from corl.pkg import nothing
"""
    edges = module_edges("corl.pkg.mod", False, source, known)
    assert edges == {"corl.a", "corl.pkg.sub", "corl.b", "corl.pkg.other", "corl.pkg", "corl.hidden"}
    assert module_edges("corl.pkg", True, "from . import sub\nfrom .sub import x", known) == {"corl.pkg.sub"}
    assert module_edges("corl.pkg", True, "if TYPE_CHECKING:\n    import corl.a", known) == set()


def test_graph_covers_the_packages() -> None:
    graph = import_graph()
    assert {"corl.config", "corl.proto", "corl.services.aggregator.app", "corl.trainer"} <= set(graph)
    assert "corl.services.aggregator.endpoints.client" in graph["corl.services.aggregator.endpoints"]


def test_config_imports_no_service_or_reward_code() -> None:
    """Every process reads the config, so it stays below the services and the reward functions; the
    reward modes it names come from ``corl.proto``."""
    graph = import_graph()
    reached, todo = set(), [m for m in graph if m == "corl.config" or m.startswith("corl.config.")]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph[module])
    above = sorted(m for m in reached if m.startswith(("corl.services", "corl.rewards", "corl.trainer")))
    assert not above, f"corl.config reaches {above}"


def test_no_import_circles() -> None:
    graph = import_graph()
    circles = [" -> ".join(_cycle(graph, c)) for c in strongly_connected(graph) if len(c) > 1]
    assert not circles, "import circles:\n" + "\n".join(circles)
