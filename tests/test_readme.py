"""The README's contents list: every section and subsection, in order, each link landing on its heading
(GitHub's anchors: lower case, punctuation dropped but hyphens, spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def github_anchor(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def test_the_contents_list_every_section_in_order_and_each_link_lands_on_its_heading():
    text = README.read_text(encoding="utf-8")
    outside_code = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # a "## " inside a code block is no heading
    headings = [(len(hashes), title) for hashes, title in re.findall(r"^(##+) (.+)$", outside_code, re.M)]
    sections = [(level, title) for level, title in headings if level <= 3 and title != "Contents"]
    listed = re.search(r"^## Contents\n\n((?:\s*- \[.+\]\(#.+\)\n)+)", text, re.M)
    assert listed, "the README has a contents list after its introduction"
    entries = re.findall(r"^( *)- \[(.+)\]\(#(.+)\)$", listed.group(1), re.M)
    assert [(2 + len(indent) // 2, title) for indent, title, _ in entries] == [
        (level, title.replace("`", "")) for level, title in sections]
    anchors = {github_anchor(title) for _, title in headings}
    assert [anchor for _, _, anchor in entries if anchor not in anchors] == []
