"""docs/installing.md's pip table: each layer's line names the layer and every titanpod layer it needs.

pip cannot find a sibling layer on PyPI, so a line that misses one fails for the user; a line with one too
many installs more than the layer needs.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALLING = REPO_ROOT / "docs" / "installing.md"
PIP_LINE = re.compile(r"^\| `(titanpod-[a-z-]+)` \| `pip install ([^`]+)` \|$", re.MULTILINE)


def workspace_layers() -> dict[str, tuple[str, set[str]]]:
    """Each workspace distribution: its folder (``./packages/models``) and the titanpod layers it requires."""
    layers = {}
    for pyproject in sorted([*REPO_ROOT.glob("packages/*/pyproject.toml"), *REPO_ROOT.glob("apps/*/pyproject.toml")]):
        project = tomllib.loads(pyproject.read_text())["project"]
        siblings = {re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0] for requirement in project["dependencies"]}
        folder = "./" + pyproject.parent.relative_to(REPO_ROOT).as_posix()
        layers[project["name"]] = (folder, {name for name in siblings if name.startswith("titanpod-")})
    return layers


def needed(name: str, layers: dict[str, tuple[str, set[str]]]) -> set[str]:
    """``name`` and every titanpod layer its requirements reach."""
    reached, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in reached:
            reached.add(current)
            todo.extend(layers[current][1])
    return reached


def documented_pip_lines() -> dict[str, list[str]]:
    """The table's lines: layer name -> the folders its pip command names, in order."""
    return {name: folders.split() for name, folders in PIP_LINE.findall(INSTALLING.read_text())}


def test_every_layer_has_one_pip_line():
    lines = PIP_LINE.findall(INSTALLING.read_text())
    names = [name for name, _ in lines]
    assert sorted(names) == sorted(workspace_layers()), "docs/installing.md: one pip line per workspace distribution"
    assert len(names) == len(set(names)), f"a layer has two pip lines: {names}"


def test_each_pip_line_names_exactly_the_layers_it_needs():
    layers = workspace_layers()
    for name, folders in documented_pip_lines().items():
        expected = {layers[layer][0] for layer in needed(name, layers)}
        assert set(folders) == expected, (
            f"docs/installing.md: the pip line of {name} names {sorted(folders)}; "
            f"it needs exactly {sorted(expected)} (its pyproject.toml's titanpod requirements, followed)"
        )
        assert folders[-1] == layers[name][0], f"the pip line of {name} ends with its own folder"
        assert len(folders) == len(set(folders)), f"the pip line of {name} names a folder twice"


def test_the_closure_follows_requirements_of_requirements():
    """A check of the helper itself: the pretrain app reaches the data layer only through recipes."""
    layers = workspace_layers()
    assert "titanpod-data" not in layers["titanpod-pretrain"][1]
    assert "titanpod-data" in needed("titanpod-pretrain", layers)
    assert needed("titanpod-models", layers) == {"titanpod-models"}
