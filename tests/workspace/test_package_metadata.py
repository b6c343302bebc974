"""Every distribution is publishable as it stands: license, readme, classifiers and the typing marker.

A wheel without ``License-Expression`` or a README shows as an unlicensed, empty page on an index, and
without ``py.typed`` type checkers ignore the annotations users import.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def member_pyprojects() -> list[Path]:
    """The ``pyproject.toml`` of every workspace member."""
    members = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]
    return sorted(path for pattern in members for path in REPO_ROOT.glob(f"{pattern}/pyproject.toml"))


def test_the_repository_is_apache_licensed() -> None:
    text = (REPO_ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


@pytest.mark.parametrize("pyproject", member_pyprojects(), ids=lambda path: path.parent.name)
def test_member_metadata(pyproject: Path) -> None:
    folder = pyproject.parent
    config = tomllib.loads(pyproject.read_text())
    project = config["project"]
    assert project["license"] == "Apache-2.0"
    for license_file in project["license-files"]:
        assert (folder / license_file).read_text() == (REPO_ROOT / "LICENSE").read_text()
    readme = (folder / project["readme"]).read_text()
    assert readme.startswith(f"# {project['name']}\n")
    classifiers = project["classifiers"]
    assert "Typing :: Typed" in classifiers
    supported = {f"Programming Language :: Python :: 3.{minor}" for minor in (11, 12, 13)}
    assert supported <= set(classifiers), "requires-python allows 3.11 to 3.13"
    module = config["tool"]["uv"]["build-backend"]["module-name"]
    assert (folder / "src" / Path(*module.split(".")) / "py.typed").is_file()
