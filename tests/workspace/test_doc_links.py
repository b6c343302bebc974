"""The docs hold together: every relative link and image resolves inside the repository, and the front page stays short.

Checked files: ``README.md``, ``docs/**/*.md``, ``packages/*/README.md`` and ``apps/*/README.md``. A relative
link (``[text](path)``, ``![alt](path)``, ``[text]: path`` or an HTML ``src``/``href``) must name a file or
folder inside the repository, and an anchor (``path#heading`` or ``#heading``) a heading of its Markdown file
by GitHub's slug. Links with a scheme (``https:``, ``mailto:``) are left alone; code spans and fenced code
blocks are not links. Each failure names the file, the line and the link.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

FRONT_PAGE_LINES = 210
"""The most lines README.md may have; the rest belongs in docs/."""

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
"""``[text](target "title")`` and ``![alt](target)``; the text may hold one level of brackets."""
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
"""``[label]: target``."""
HTML_ATTRIBUTE = re.compile(r"<(?:img|a|source)\b[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
"""``<img src="...">``, ``<a href="...">``."""
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def markdown_files() -> list[Path]:
    """Every Markdown file whose links are checked."""
    files = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    for pattern in ("packages/*/README.md", "apps/*/README.md"):
        files.extend(sorted(REPO_ROOT.glob(pattern)))
    return [path for path in files if path.is_file()]


@dataclass(frozen=True)
class Link:
    """A link as written: where it is and what it points at."""

    file: Path
    line: int
    target: str

    def __str__(self) -> str:
        return f"{self.file.relative_to(REPO_ROOT)}:{self.line}: {self.target}"


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with code spans blanked out."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        marker = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * 3
            elif marker.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            lines.append((number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)))
    return lines


def links_in(path: Path) -> list[Link]:
    """Every link target of a Markdown file."""
    found = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        targets = [m.group(1) for m in INLINE_LINK.finditer(line)]
        targets += [m.group(1) for m in HTML_ATTRIBUTE.finditer(line)]
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
        found.extend(Link(path, number, target) for target in targets)
    return found


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation removed, spaces as ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _raw_headings(path: Path) -> list[str]:
    """Headings with their code spans kept (``prose_lines`` blanks code spans, which hold heading words)."""
    headings, fence = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\s{0,3}(`{3,}|~{3,})", line):
            fence = not fence
            continue
        heading = None if fence else re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            headings.append(heading.group(1))
    return headings


def heading_anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings, GitHub's way."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in _raw_headings(path):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def problem(link: Link) -> str | None:
    """What is wrong with a link, or ``None``."""
    target = link.target
    if SCHEME.match(target) or target.startswith("//"):
        return None  # a URL: not checked here
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part.split("?", 1)[0])
    if path_part.startswith("/"):
        return "an absolute path: link relative to the file instead"
    resolved = (link.file.parent / path_part).resolve() if path_part else link.file
    try:
        resolved.relative_to(REPO_ROOT)
    except ValueError:
        return "leaves the repository (only files inside it can be linked)"
    if not resolved.exists():
        return f"no such file: {resolved.relative_to(REPO_ROOT)}"
    if anchor:
        if resolved.is_dir() or resolved.suffix.lower() != ".md":
            return f"an anchor into {resolved.relative_to(REPO_ROOT)}, which is not a Markdown file"
        anchors = heading_anchors(resolved)
        if unquote(anchor).lower() not in anchors:
            close = sorted(a for a in anchors if a.split("-")[0] == anchor.split("-")[0])[:3]
            hint = f" (headings there include: {', '.join(close)})" if close else ""
            return f"no heading #{anchor} in {resolved.relative_to(REPO_ROOT)}{hint}"
    return None


def test_the_checked_files_are_found() -> None:
    names = {path.relative_to(REPO_ROOT).as_posix() for path in markdown_files()}
    assert "README.md" in names
    assert any(name.startswith("docs/") for name in names), "docs/ has no Markdown pages"
    assert any(name.startswith("packages/") for name in names)


@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: path.relative_to(REPO_ROOT).as_posix())
def test_every_relative_link_resolves_inside_the_repository(path: Path) -> None:
    broken = [f"{link}: {why}" for link in links_in(path) if (why := problem(link))]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_is_a_front_page() -> None:
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= FRONT_PAGE_LINES, (
        f"README.md has {len(lines)} lines, more than {FRONT_PAGE_LINES}: move the detail into a page of docs/ "
        "and link to it"
    )


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = REPO_ROOT / "README.md"
    linked = {
        (readme.parent / link.target.partition("#")[0]).resolve()
        for link in links_in(readme)
        if not SCHEME.match(link.target)
    }
    pages = sorted((REPO_ROOT / "docs").rglob("*.md"))
    missing = [page.relative_to(REPO_ROOT).as_posix() for page in pages if page.resolve() not in linked]
    assert not missing, f"README.md links to no docs page of: {', '.join(missing)}"


def test_the_readme_keeps_the_test_commands() -> None:
    """CI (``.ci/run``) runs the README's test commands: they stay on the front page."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    for command in ("uv run titanpod-pretrain", "uv run pytest", "uv run pytest -m slow -n 2"):
        assert f"\n{command}" in readme, f"README.md no longer shows `{command}`"


def test_the_layers_picture_is_what_the_script_draws() -> None:
    spec = importlib.util.spec_from_file_location("make_layers_image", REPO_ROOT / "tools" / "make_layers_image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    drawn = module.render()
    assert module.IMAGE.read_text(encoding="utf-8") == drawn, (
        "docs/images/layers.svg is out of date (the layer order in pyproject.toml changed?): "
        "run uv run python tools/make_layers_image.py"
    )


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Compile for a TPU slice, on any host", "compile-for-a-tpu-slice-on-any-host"),
        ("Context parallelism (long sequences)", "context-parallelism-long-sequences"),
        ("`cpu_flash`: attention on the CPU", "cpu_flash-attention-on-the-cpu"),
        ("The tpu lane's environment (envs/tpu)", "the-tpu-lanes-environment-envstpu"),
        ("Starting from weights, and the final model", "starting-from-weights-and-the-final-model"),
    ],
)
def test_github_slugs(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_a_broken_link_is_named_with_file_and_line() -> None:
    page = REPO_ROOT / "docs" / "data.md"
    assert problem(Link(page, 7, "missing.md")) == "no such file: docs/missing.md"
    assert "leaves the repository" in (problem(Link(page, 7, "../../shared/DESIGN.md")) or "")
    assert "no heading #nowhere" in (problem(Link(page, 7, "recipes.md#nowhere")) or "")
    assert problem(Link(page, 7, "recipes.md#dry-run")) is None
    assert problem(Link(page, 7, "https://example.com/x")) is None
    assert str(Link(page, 7, "missing.md")) == "docs/data.md:7: missing.md"
