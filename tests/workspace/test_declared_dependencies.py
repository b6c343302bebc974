"""Each distribution declares exactly the packages its code imports: required ones at module level,
optional ones (imported only inside a function) as required or as an extra.

A package imported but not declared breaks a user who installs that layer alone; one declared but
never imported makes every install heavier than it needs to be.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

IMPORT_TO_DISTRIBUTION = {
    "PIL": "pillow",
    "huggingface_hub": "huggingface-hub",
    "orbax": "orbax-checkpoint",
    "torch_tpu": "torch-tpu",
    "torch_xla": "torch-xla",
    "yaml": "pyyaml",
}
"""Import names whose distribution is named otherwise (the rest are the same, with ``_`` as ``-``)."""

OPTIONAL_STACKS = {"jax", "torchax", "torch-tpu", "orbax-checkpoint", "ray", "vllm"}
"""Heavy or machine-specific stacks: a layer that imports them only inside functions offers them as an extra."""

OWN_ENVIRONMENT = {
    "torch-xla": "envs/torch_xla: torch_xla pins its own torch release, so no extra of the main lock can hold it"
}
"""Imported by the lane code but installed only by an environment of its own, never declared here."""

FOR_ANOTHER_DEPENDENCY = {
    ("tpu", "jax"): "torch_tpu's Pallas bridge (torch.tpu.pallas) imports jax without declaring it",
}
"""(extra, package) pairs an extra declares for a package it brings, not for the distribution's own imports."""

IMPLIED_BY_SUBMODULE = {"torch.utils.tensorboard": "tensorboard"}
"""Submodules of a declared package that need another distribution installed to import."""


@dataclass
class Distribution:
    """One pyproject.toml of the workspace and what its code imports."""

    name: str
    root: Path
    required: set[str]
    extras: dict[str, set[str]]
    top_level: set[str] = field(default_factory=set)
    lazy: set[str] = field(default_factory=set)


def requirement_name(requirement: str) -> str:
    """``'titanpod-rl[ray]'`` -> ``'titanpod-rl'``; ``'torch>=2.13,<2.14'`` -> ``'torch'``."""
    return re.split(r"[\[<>=!~; ]", requirement.strip(), maxsplit=1)[0].lower()


def first_party_modules() -> dict[str, str]:
    """``titanpod.graph`` -> ``titanpod-graph``, read from each build-backend module-name."""
    modules = {}
    members = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]
    for pyproject in sorted(path for pattern in members for path in REPO_ROOT.glob(f"{pattern}/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())
        modules[project["tool"]["uv"]["build-backend"]["module-name"]] = project["project"]["name"]
    return modules


def distribution_of(module: str, first_party: dict[str, str]) -> str | None:
    """The distribution providing ``module``, or ``None`` for the standard library."""
    top = module.split(".")[0]
    if top == "titanpod":
        package = ".".join(module.split(".")[:2])
        return first_party.get(package, f"<unknown first-party {package}>")
    if top in sys.stdlib_module_names or top == "__future__":
        return None
    return IMPORT_TO_DISTRIBUTION.get(top, top.replace("_", "-").lower())


def imported_modules(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Modules imported at module level and those imported only inside functions (or ``TYPE_CHECKING``)."""
    top_level: set[str] = set()
    lazy: set[str] = set()

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                nested = True
            if isinstance(child, ast.Import):
                (lazy if inside else top_level).update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = {f"{child.module}.{alias.name}" for alias in child.names} | {child.module}
                (lazy if inside else top_level).update(names)
            visit(child, nested)

    visit(tree, False)
    return top_level, lazy


def workspace_distributions() -> list[Distribution]:
    """Every package and app of the workspace with its declared and imported packages."""
    first_party = first_party_modules()
    found = []
    members = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]
    for pyproject in sorted(path for pattern in members for path in REPO_ROOT.glob(f"{pattern}/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        extras = {
            extra: {requirement_name(r) for r in requirements}
            for extra, requirements in project.get("optional-dependencies", {}).items()
        }
        dist = Distribution(
            project["name"], pyproject.parent, {requirement_name(r) for r in project["dependencies"]}, extras
        )
        for source in sorted((pyproject.parent / "src").rglob("*.py")):
            top_level, lazy = imported_modules(ast.parse(source.read_text(encoding="utf-8")))
            for modules, into in ((top_level, dist.top_level), (lazy, dist.lazy)):
                for module in modules:
                    implied = [need for prefix, need in IMPLIED_BY_SUBMODULE.items() if module.startswith(prefix)]
                    for name in [distribution_of(module, first_party), *implied]:
                        if name is not None and name != dist.name:
                            into.add(name)
        found.append(dist)
    return found


DISTRIBUTIONS = workspace_distributions()


def test_every_workspace_member_is_checked():
    names = {dist.name for dist in DISTRIBUTIONS}
    for layer in ("device", "models", "parallel", "kernels", "graph", "checkpoint", "data", "recipes", "runs", "rl"):
        assert f"titanpod-{layer}" in names


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=lambda dist: dist.name)
def test_distribution_declares_exactly_what_it_imports(dist: Distribution):
    in_extras = set().union(*dist.extras.values()) if dist.extras else set()
    missing_required = sorted(dist.top_level - dist.required)
    assert not missing_required, (
        f"{dist.name} ({dist.root}) imports {missing_required} at module level but does not list them in "
        "[project] dependencies"
    )
    undeclared = sorted(dist.lazy - dist.required - in_extras - set(OWN_ENVIRONMENT))
    assert not undeclared, f"{dist.name} imports {undeclared} inside functions but declares them nowhere"
    for_others = {package for extra, package in FOR_ANOTHER_DEPENDENCY if extra in dist.extras}
    unused = sorted((dist.required | in_extras) - dist.top_level - dist.lazy - for_others)
    assert not unused, f"{dist.name} declares {unused} but no source file of it imports them"
    required_but_lazy = sorted((dist.required - dist.top_level) & dist.lazy & OPTIONAL_STACKS)
    assert not required_but_lazy, (
        f"{dist.name} requires {required_but_lazy} although it imports them only inside functions: "
        "make them an extra (e.g. [pallas], [ray], [vllm])"
    )


def test_the_architecture_docs_layer_table_says_what_each_package_declares():
    """docs/architecture.md's "declares" column: each layer's titanpod dependencies as its pyproject.toml lists
    them (by layer name: ``titanpod-graph`` is ``graph``)."""
    table = (REPO_ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `titanpod\.(\w+)` \| .*? \| .*? \| (.*?) \|$", table, re.MULTILINE)
    documented = {layer: {name.strip() for name in declares.split(",")} - {"—"} for layer, declares in rows}
    declared = {
        dist.name.removeprefix("titanpod-"): {name.removeprefix("titanpod-") for name in dist.required
                                              if name.startswith("titanpod-")}
        for dist in DISTRIBUTIONS if dist.root.parent.name == "packages"
    }  # fmt: skip
    assert documented == declared
