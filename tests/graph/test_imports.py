"""The graph layer's modules import in any order, none imports a module that imports it back,
and importing ``titanpod.graph`` (or the xla step's package) loads no JAX."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, run_python

GRAPH_SOURCE = REPO_ROOT / "packages" / "graph-trainer" / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(GRAPH_SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph_imports() -> dict[str, set[str]]:
    """Each module of titanpod.graph -> the modules of titanpod.graph it imports (at module level or in functions)."""
    modules = {module_name(path): path for path in sorted((GRAPH_SOURCE / "titanpod" / "graph").rglob("*.py"))}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                candidates = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            found.update(candidate for candidate in candidates if candidate in modules and candidate != name)
        edges[name] = found
    return edges


def test_no_graph_module_imports_one_that_imports_it_back():
    edges = graph_imports()
    assert "titanpod.graph.xla.step" in edges["titanpod.graph.steps"]  # build_step's lazy import is seen

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            module = todo.pop()
            if module == goal:
                return True
            if module not in seen:
                seen.add(module)
                todo.extend(edges[module])
        return False

    circles = [
        (module, imported)
        for module, imported_modules in edges.items()
        for imported in imported_modules
        if reaches(imported, module)
    ]
    assert circles == []


@pytest.mark.parametrize(
    "order",
    [
        ("titanpod.graph.xla.step", "titanpod.graph.steps"),
        ("titanpod.graph.steps", "titanpod.graph.xla.step"),
        ("titanpod.graph.step_base", "titanpod.graph.xla", "titanpod.graph"),
        ("titanpod.graph", "titanpod.graph.xla"),
    ],
)
def test_graph_modules_import_in_either_order_without_jax(order):
    imports = "\n".join(f"import {module}" for module in order)
    result = run_python(
        f"import sys\n{imports}\n"
        "print(','.join(m for m in ('jax', 'jaxlib', 'torchax') if m in sys.modules) or 'none')\n",
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "none"
