"""The tree's import structure: no cycles among the project's modules, and the light processes
stay light (the controller and the config import no torch).

Every ``import`` that runs counts, at module level or inside a function (a deferred import is
still a cycle a reader must untangle); imports under ``if TYPE_CHECKING:`` do not (they never
run: annotations only). ``from pkg import name`` is an edge to ``pkg`` (its ``__init__``),
``from pkg.mod import name`` an edge to ``pkg.mod``; a package is not taken to import its parent.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from paths import ROOT

PACKAGES = ("areal", "sandbox")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    edges = set()
    tree = ast.parse(path.read_text(), str(path))
    type_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and _is_type_checking(block.test)
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
    return edges


def _project_graph() -> dict[str, set[str]]:
    """Each module of the project's packages, with the project modules it imports at run time."""
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_project_has_no_import_cycles():
    assert _cycles(_project_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_controller_and_the_config_import_no_torch():
    code = (
        "import sys, areal.controller.loop, areal.config, areal.trainer.config; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# Layers, from the bottom: components (one per process boundary) < the controller and the
# cluster layer that compose them < the AReaL-compatible surface, which re-exports the one
# implementation under AReaL's import paths. Imports run downwards only.
COMPONENTS = ("areal.agent", "areal.gateway", "areal.engine", "areal.ring", "areal.trainer", "areal.weights", "sandbox")
CONTROLLER = ("areal.controller", "areal.train", "areal.sweep", "areal.cluster")
# The package itself counts: ``from areal import PPOTrainer`` is AReaL's path; so does
# ``areal.trainer``'s ``__init__``, whose lazy ``PPOTrainer`` is AReaL's ``from areal.trainer import``.
AREAL_PATHS = ("areal", "areal.trainer")
AREAL_SURFACE = (
    "areal.api",
    "areal.experimental",
    "areal.launcher",
    "areal.workflow",
    "areal.workflow_context",
    "areal.utils",
    "areal.reward",
)


def _in(module: str, tops: tuple[str, ...]) -> bool:
    return any(module == t or module.startswith(t + ".") for t in tops)


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if _in(module, COMPONENTS) and _in(target, CONTROLLER):
                out.append(f"{module} -> {target}: a component imports the controller or cluster layer")
            if _in(module, ("areal.engine",)) and _in(target, ("areal.trainer",)):
                out.append(f"{module} -> {target}: the engine imports the trainer")
            if _in(target, AREAL_SURFACE) and not (_in(module, AREAL_SURFACE) or module in AREAL_PATHS):
                out.append(f"{module} -> {target}: only the AReaL surface imports the AReaL surface")
    return out


def test_layers_run_one_way():
    assert _layer_violations(_project_graph()) == []


def test_the_layer_check_names_each_kind_of_climb():
    graph = {
        "areal.engine.batch": {"areal.trainer.step", "areal.controller.loop"},
        "areal.controller.loop": {"areal.api.cli_args", "areal.engine.batch"},
        "areal.api.cli_args": {"areal.config"},
    }
    assert [line.split(":")[0] for line in _layer_violations(graph)] == [
        "areal.controller.loop -> areal.api.cli_args",
        "areal.engine.batch -> areal.controller.loop",
        "areal.engine.batch -> areal.trainer.step",
    ]
