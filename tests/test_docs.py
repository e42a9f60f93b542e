"""The README and the docs pages: every relative link points to a file that exists, every #anchor to a
heading of its target (GitHub's rule: lower case, punctuation dropped except '-' and '_', each space
a '-', repeats numbered -1, -2, ...), the README stays short, and its test commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "weights" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HTML_REF = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$", re.M)
HTML_ID = re.compile(r"<[a-z]+\b[^>]*?\b(?:id|name)=\"([^\"]+)\"", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def without_code(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked (their links are not links)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub(lambda m: " " * len(m.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: the rendered text (links, code and emphasis markers
    gone) in lower case, every character but letters, digits, '_', '-' and spaces dropped, each
    space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page has: its headings' slugs (repeats numbered as GitHub does) and HTML ids."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set(HTML_ID.findall(text))
    for m in HEADING.finditer(text):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    """The link targets written in a page: Markdown links and images, reference definitions, HTML
    href / src; not in code."""
    text = without_code(page.read_text(encoding="utf-8"))
    return LINK.findall(text) + REF_DEF.findall(text) + HTML_REF.findall(text)


def broken(page: Path) -> list[str]:
    """Each relative link of a page whose file does not exist, or whose #anchor its target lacks."""
    bad = []
    for target in links(page):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file ({dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_readme_links_are_read() -> None:
    """The parser finds the README's links to the docs pages (an empty list would pass the check)."""
    targets = links(README)
    assert "docs/architecture.md" in targets and "docs/screenshots/phone-390x844.png" in targets, targets


def test_slug_follows_github() -> None:
    """Headings of these pages and the anchors GitHub's rule gives them."""
    assert slug("Whole folder: is the model right for the wrong reason?") == \
        "whole-folder-is-the-model-right-for-the-wrong-reason"
    assert slug("Photos: the training size (at 48 px)") == "photos-the-training-size-at-48-px"
    assert slug("The named API (gradio_client)") == "the-named-api-gradio_client"
    assert slug("Agents (MCP)") == "agents-mcp"
    assert slug("For a lecture, in four steps") == "for-a-lecture-in-four-steps"
    assert slug("`--layer` & co.") == "--layer--co"


def test_broken_links_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker fails a missing file, a missing anchor (here and in another page) and ignores
    links in code and absolute URLs."""
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# Other page\n\n## A part (one)\n\n## A part (one)\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](other.md#a-part-one) [ok too](other.md#a-part-one-1) [here](#title)\n"
                    "[gone](missing.md) [no anchor](other.md#a-part) [not here](#nothing)\n"
                    "![img](pic.png) [web](https://example.com/x.md) `[code](nowhere.md)`\n\n"
                    "```\n[fenced](nowhere.md)\n```\n", encoding="utf-8")
    assert broken(page) == ["missing.md: no such file (missing.md)",
                            "other.md#a-part: no heading #a-part in other.md",
                            "#nothing: no heading #nothing in page.md",
                            "pic.png: no such file (pic.png)"]


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the how-tos belong in docs/"


FAST, REST = 'python -m pytest -m "not slow"', "python -m pytest -m slow"


def test_readme_test_commands_are_what_ci_runs() -> None:
    """.ci/run ends with the README's test commands: the fast tier, then the rest, so that every test
    runs once and the fast ones first. The README's Run the tests section shows the fast command
    first, then the whole suite's."""
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert ci[-2:] == [FAST, REST]
    section = README.read_text(encoding="utf-8").split("## Run the tests", 1)[1].split("\n## ", 1)[0]
    shown = [ln.split("#")[0].strip() for ln in section.splitlines() if ln.startswith("    ")]
    assert FAST in shown and "python -m pytest" in shown, section
    assert shown.index(FAST) < shown.index("python -m pytest"), section


def test_architecture_page_lists_the_import_layers_as_pyproject_does() -> None:
    """docs/architecture.md is the current truth: its layers block says, contract by contract, what
    pyproject.toml's import-linter contracts enforce (a contract changed without the page fails here)."""
    import re
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    page = (ROOT / "docs" / "architecture.md").read_text()
    block = page[page.index("```", page.index("The layers, top to bottom, exactly as")):]
    block = re.sub(r"\s+", " ", block[3 : block.index("```", 3)])
    for c in cfg["tool"]["importlinter"]["contracts"]:
        if c["type"] == "layers":
            want = re.sub(r"\s+", " ", f"{c['containers'][0]} " + "  >  ".join(c["layers"]))
            assert want in block, f"docs/architecture.md: the layers of {c['id']} are not {want!r}"
