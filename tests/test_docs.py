"""The README and the docs send readers to each other and to the committed results: every
relative link in them names a file or folder that exists, and docs/README.md indexes every page."""

import re

import pytest

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def relative_links(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks are not links
    for target in LINK.findall(text):
        path = target.split("#")[0]
        if path and not re.match(r"[a-z][a-z0-9+.-]*:", path):  # http:, mailto: ...
            yield target, path


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file(page):
    broken = [target for target, path in relative_links(page) if not (page.parent / path).exists()]
    assert broken == [], f"{page.relative_to(ROOT)} links to missing files: {broken}"


def test_the_docs_index_lists_every_page():
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / path).resolve() for _, path in relative_links(index)}
    pages = {p.resolve() for p in PAGES if p.parent != ROOT and p != index}
    assert sorted(str(p.relative_to(ROOT)) for p in pages - linked) == []
