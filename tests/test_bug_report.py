"""The markdown bug report and the links of every picture: versions, the exact command, the
target from the working directory, folded excerpts, and GitHub permalinks pinned to the commit
when the scanned tree is a GitHub checkout (none for files with uncommitted changes)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GIT = ["git", "-c", "user.name=kvtrace tests", "-c", "user.email=tests@kvtrace.invalid",
       "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]
NIXL = "disaggregation/nixl/conn.py"


def kvtrace(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, str]:
    """A clone-like checkout: the nixl-pin tree under python/sglang/srt, a GitHub remote, one commit."""
    root = tmp_path / "sglang-fork"
    shutil.copytree(EXAMPLES / "nixl-pin", root / "python" / "sglang" / "srt")
    for args in (["init", "-q"], ["remote", "add", "origin", "git@github.com:example-org/sglang-fork.git"],
                 ["add", "-A"], ["commit", "-qm", "fork"]):
        subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True,
                            text=True).stdout.strip()
    return root, commit


def test_html_links_are_permalinks_in_a_github_checkout(checkout: tuple[Path, str]) -> None:
    root, commit = checkout
    base = f"https://github.com/example-org/sglang-fork/blob/{commit}/python/sglang/"
    page = kvtrace("scan", "python/sglang", "-f", "html", cwd=root).stdout
    links = re.findall(r'<a href="([^"]+)"><g class="node', page)
    assert links and all(link.startswith(base) for link in links), links[:3]
    # Each permalink names a line of the committed file that exists.
    for link in set(links):
        path, line = link[len(base):].split("#L")
        assert 0 < int(line) <= len((root / "python" / "sglang" / path).read_text().splitlines())
    # An uncommitted change: that file's lines may have moved, so its nodes link into the page.
    conn = root / "python" / "sglang" / "srt" / NIXL
    conn.write_text("# edited\n" + conn.read_text())
    page = kvtrace("scan", "python/sglang", "-f", "html", cwd=root).stdout
    links = re.findall(r'<a href="([^"]+)"><g class="node', page)
    assert not any("nixl/conn.py" in link and link.startswith("https://") for link in links)
    local = [link for link in links if link.startswith("#")]
    assert local and all(f'id="{link[1:]}"' in page for link in local)


def test_no_permalinks_without_a_github_remote(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES / "nixl-pin", tmp_path / "tree")
    page = kvtrace("scan", "tree", "-f", "html", cwd=tmp_path).stdout
    assert "https://github.com" not in page


def test_markdown_bug_report(checkout: tuple[Path, str]) -> None:
    root, commit = checkout
    # An absolute target: the report names it as seen from the working directory.
    result = kvtrace("scan", str(root / "python" / "sglang"), "--format", "markdown", cwd=root)
    assert result.returncode == 1, result.stderr
    md = result.stdout
    from kvtrace import __version__

    assert f"- kvtrace {__version__}, Python " in md
    assert f"- command: `python -m kvtrace scan {root / 'python' / 'sglang'} --format markdown`" in md
    assert "- target: `python/sglang` (package `srt/disaggregation`)" in md
    # The finding links to the committed line, and its code is folded underneath.
    link = (f"[`srt/{NIXL}:82`](https://github.com/example-org/sglang-fork/blob/{commit}/"
            f"python/sglang/srt/{NIXL}#L82)")
    assert link in md
    block = re.search(r"<details><summary>srt/disaggregation/nixl/conn\.py:82</summary>\n\n *```python\n(.*?)\n *```",
                      md, re.S)
    assert block and "> 82 |     def poll(self) -> KVPoll:" in block.group(1)
    assert len(block.group(1).splitlines()) == 7  # three lines either side
    assert md.count("```mermaid") == 2
