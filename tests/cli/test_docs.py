"""The README is a front page (at most 12 KB) and every relative link in it and in docs/*.md
reaches an existing file, and, where the link names an anchor in a Markdown file, a heading there."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.resolve().parents[1]
README_MAX_BYTES = 12 * 1024   # issue 32 item 8: "README at most 12 KB"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(md: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = _FENCE.sub("", md.read_text())
    out = set()
    for title in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def _links(md: Path) -> list[str]:
    return [t for t in _LINK.findall(_FENCE.sub("", md.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]   # http:, https:, mailto: are not files


def test_readme_is_a_front_page_of_at_most_12_kb():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes > {README_MAX_BYTES}"


def test_the_docs_have_pages_and_the_readme_links_the_index():
    assert len(PAGES) > 2
    assert "docs/index.md" in _links(ROOT / "README.md")


@pytest.mark.parametrize("md", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(md):
    bad = []
    for target in _links(md):
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not bad, f"{md.name}: " + "; ".join(bad)


def test_the_anchor_rule_matches_github():
    # the slug rule above, on headings of this repository's docs
    page = ROOT / "docs" / "launch.md"
    assert "engine-contracts" in _anchors(page)
    assert "checkpoints-the-launch-runs-what-was-modelled" in _anchors(page)


def test_the_readme_says_how_editors_and_shells_use_kvtune_and_it_holds():
    """Issue 34: the schemas' paths as the README names them exist, the completion line it gives
    prints a completion script (the KVTUNE_<COMMAND>_<OPTION> variables: test_conventions.py)."""
    import os
    import subprocess
    import sys
    text = (ROOT / "README.md").read_text()
    for name in ("result", "workload"):
        path = f"profiles/schemas/{name}.schema.json"
        assert path in text and (ROOT / path).exists() and (ROOT / "kvtune" / path).exists()
    assert "yaml-language-server: $schema=" in text and "KVTUNE_SOLVE_TRIALS" in text
    assert '_KVTUNE_COMPLETE=bash_source kvtune' in text
    env = dict(os.environ, _KVTUNE_COMPLETE="bash_source")
    p = subprocess.run([sys.executable, "-c", "from kvtune.optimizer.cli import main; main(prog_name='kvtune')"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "_kvtune_completion()" in p.stdout, p.stderr[-500:]
