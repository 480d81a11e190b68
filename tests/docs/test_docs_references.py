"""The prose a newcomer reads first refers only to things the repository has.

Scans README.md, CONTRIBUTING.md and every page of docs/ for: relative links and repository paths
(`tests/...`, `docs/...`, `atmosphere_harness/...`, `benchmarks/...`, `samples/...`, a package
path such as `web/sse.py`, a bare `test_*.py`) naming a file that does not exist; references to
the team's design document, which is not shipped; and promises ("lands later", "coming soon",
TODO) instead of what the code does today. README must link every docs page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "atmosphere_harness"
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))]
REPO_DIRS = ("atmosphere_harness", "benchmarks", "docs", "samples", "tests", ".ci")

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_REPO_PATH = re.compile(
    r"(?<![\w./-])((?:" + "|".join(re.escape(d) for d in REPO_DIRS) + r")/[\w./-]*)"
)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_PACKAGE_PATH = re.compile(r"^([a-z_]+(?:/[\w-]+)*/[\w-]+\.(?:py|js|css|html))\b")
_TEST_FILE = re.compile(r"(?<![\w/])(test_\w+\.py)\b")
_DESIGN = re.compile(r"\bDESIGN\b|\bseed/|\breference/[\w-]+\.md|\.\./shared\b|\b[Ss]ection \d")
_PROMISES = re.compile(
    r"\blands? later\b|\bonce it lands\b|\bcoming soon\b|\bnot (?:yet )?written yet\b"
    r"|\bTODO\b|\bTBD\b|\bFIXME\b|\bXXX\b",
)


def _label(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _prose(text: str) -> str:
    """The page without fenced code blocks (links and promises live in prose)."""
    return _FENCE.sub("", text)


def _lines_of(text: str, pattern: re.Pattern[str]) -> list[tuple[int, re.Match[str]]]:
    return [
        (number, match)
        for number, line in enumerate(text.splitlines(), start=1)
        for match in pattern.finditer(line)
    ]


@pytest.mark.parametrize("page", PAGES, ids=_label)
def test_relative_links_name_files_that_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = []
    for number, match in _lines_of(_prose(text), _LINK):
        target = match.group(1)
        if target.startswith("#") or re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue
        path = target.split("#", 1)[0]
        resolved = (page.parent / path).resolve()
        if not resolved.exists() or not resolved.is_relative_to(ROOT):
            missing.append(f"{_label(page)}:{number}: link to {target}")
    assert not missing, "\n".join(missing)


GENERATED = ("benchmarks/results", "benchmarks/timings.json", "benchmarks/charts/")
"""What `make bench` writes and git ignores: docs may name these outputs, a clone lacks them."""


def _exists(path: str) -> bool:
    """The path, a generated output, or (a prefix cut at a glob such as
    `docs/images/bench-*.png`) at least one match."""
    if (ROOT / path).exists() or path.startswith(GENERATED):
        return True
    return not path.endswith("/") and any(ROOT.glob(path + "*"))


def test_generated_outputs_are_git_ignored() -> None:
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    for output in ("benchmarks/results.json", "benchmarks/results/", *GENERATED[1:]):
        assert output in ignored, f"{output} is named as generated but not git-ignored"


@pytest.mark.parametrize("page", PAGES, ids=_label)
def test_repository_paths_name_files_that_exist(page: Path) -> None:
    text = _URL.sub("", page.read_text(encoding="utf-8"))
    missing = []
    for number, match in _lines_of(text, _REPO_PATH):
        path = match.group(1).rstrip(".")
        if not _exists(path):
            missing.append(f"{_label(page)}:{number}: {path}")
    for number, match in _lines_of(text, _CODE_SPAN):
        inner = _PACKAGE_PATH.match(match.group(1))
        if inner and inner.group(1).split("/", 1)[0] not in REPO_DIRS:
            path = inner.group(1)
            if (PACKAGE / path.split("/", 1)[0]).is_dir() and not (PACKAGE / path).exists():
                missing.append(f"{_label(page)}:{number}: atmosphere_harness/{path}")
        for test_file in _TEST_FILE.findall(match.group(1)):
            if not any((ROOT / "tests").rglob(test_file)):
                missing.append(f"{_label(page)}:{number}: tests/**/{test_file}")
    assert not missing, "these paths are not in the repository:\n" + "\n".join(missing)


@pytest.mark.parametrize("page", PAGES, ids=_label)
def test_no_reference_to_documents_the_repository_does_not_ship(page: Path) -> None:
    found = [
        f"{_label(page)}:{number}: {match.group(0)!r}"
        for number, match in _lines_of(page.read_text(encoding="utf-8"), _DESIGN)
    ]
    assert not found, "the design documents are not in the repository:\n" + "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=_label)
def test_no_promises_of_pages_or_features_to_come(page: Path) -> None:
    found = [
        f"{_label(page)}:{number}: {match.group(0)!r}"
        for number, match in _lines_of(_prose(page.read_text(encoding="utf-8")), _PROMISES)
    ]
    assert not found, "say what the code does today:\n" + "\n".join(found)


def test_the_readme_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {
        (ROOT / match.group(1).split("#", 1)[0]).resolve()
        for match in _LINK.finditer(_prose(readme))
    }
    unlinked = [_label(page) for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked]
    assert not unlinked, f"README.md links no {unlinked}"


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    absent = [page.name for page in sorted(DOCS.glob("*.md")) if f": {page.name}" not in nav]
    assert not absent, f"mkdocs.yml's nav lists no {absent}"


# --- the checks themselves catch what they are for ------------------------------------------


def test_the_checks_catch_each_kind_of_bad_reference(tmp_path: Path) -> None:
    assert _REPO_PATH.search("see `tests/x.py` and") is not None
    assert _PACKAGE_PATH.match("web/sse.py") is not None
    assert _PACKAGE_PATH.match("notes/a.md") is None, "workspace paths are not repo paths"
    assert _TEST_FILE.search("`test_load.py`") is not None
    assert _DESIGN.search("as DESIGN section 5 says") is not None
    assert _DESIGN.search("the storage layout (section 5)") is not None
    assert _DESIGN.search("a design choice") is None
    assert _PROMISES.search("see the runtimes page once it lands") is not None
    assert _PROMISES.search("this page lands later") is not None
    assert _PROMISES.search("statuses include todo") is None, "the todo status alias is fine"
    fenced = "before\n```python\nx = [1](2)\n```\nafter [a](b.md)"
    assert [m.group(1) for m in _LINK.finditer(_prose(fenced))] == ["b.md"]


def test_the_readme_says_how_to_move_the_demo_and_the_makefile_does_it() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "`make demo PORT=8080`" in readme
    assert re.search(r"^PORT \?= 8000$", makefile, re.MULTILINE)
    assert "PORT=$(PORT)" in makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
