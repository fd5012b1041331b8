"""The markdown bug report and the links of every picture: versions, the exact command, the
target from the working directory, folded excerpts, and GitHub permalinks pinned to the commit
when the scanned tree is a GitHub checkout (none for files with uncommitted changes)."""

from __future__ import annotations

import os
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
    """A clone-like checkout: the nixl-pin tree under python/sglang/srt, a GitHub remote, one pushed commit."""
    root = tmp_path / "sglang-fork"
    shutil.copytree(EXAMPLES / "nixl-pin", root / "python" / "sglang" / "srt")
    for args in (["init", "-q"], ["remote", "add", "origin", "git@github.com:example-org/sglang-fork.git"],
                 ["add", "-A"], ["commit", "-qm", "fork"],
                 ["update-ref", "refs/remotes/origin/main", "HEAD"]):  # as a push or fetch leaves it
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
    poll = next(n for n, text in enumerate((EXAMPLES / "nixl-pin" / NIXL).read_text().splitlines(), 1)
                if "def poll(self)" in text and "pinned-state[nixl" in text)
    # Shown as it opens from the working directory (the checkout's root), linked to the commit.
    link = (f"[`python/sglang/srt/{NIXL}:{poll}`](https://github.com/example-org/sglang-fork/blob/{commit}/"
            f"python/sglang/srt/{NIXL}#L{poll})")
    assert link in md
    # The excerpt's summary names the line and links it too.
    summary = (f'<summary><a href="https://github.com/example-org/sglang-fork/blob/{commit}/python/sglang/srt/{NIXL}'
               f'#L{poll}"><code>python/sglang/srt/{NIXL}:{poll}</code></a></summary>')
    block = re.search(rf"<details>{re.escape(summary)}\n\n *```python\n(.*?)\n *```", md, re.S)
    assert block and f"> {poll} |     def poll(self) -> KVPoll:" in block.group(1)
    assert len(block.group(1).splitlines()) == 7  # three lines either side
    assert md.count("```mermaid") == 2  # nixl's, which pins, and mooncake's, folded (it fits)


def _node_links(root: Path) -> list[str]:
    page = kvtrace("scan", "python/sglang", "-f", "html", cwd=root).stdout
    return re.findall(r'<a href="([^"]+)"><g class="node', page)


def test_an_unpushed_commit_gets_no_link(checkout: tuple[Path, str]) -> None:
    """A commit no remote-tracking ref holds would be a 404 on GitHub: no link to it. The pushed
    commit still holds the unchanged files, so those keep their links (to the pushed commit)."""
    root, pushed = checkout
    conn = root / "python" / "sglang" / "srt" / NIXL
    conn.write_text("# edited\n" + conn.read_text())
    subprocess.run([*GIT, "commit", "-qam", "local"], cwd=root, check=True, capture_output=True)
    links = _node_links(root)
    remote = [link for link in links if link.startswith("https://")]
    assert remote and all(f"/blob/{pushed}/" in link for link in remote)
    assert not any("nixl/conn.py" in link for link in remote)
    subprocess.run([*GIT, "update-ref", "refs/remotes/origin/main", "HEAD"], cwd=root, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    assert any(f"/blob/{head}/python/sglang/srt/{NIXL}#L" in link for link in _node_links(root))


def test_links_read_packed_objects_and_refs(checkout: tuple[Path, str]) -> None:
    """After `git gc` the objects are in a pack (with deltas) and the refs in packed-refs."""
    root, commit = checkout
    conn = root / "python" / "sglang" / "srt" / NIXL
    conn.write_text(conn.read_text() + "\n# a second version, stored as a delta\n")
    subprocess.run([*GIT, "commit", "-qam", "second"], cwd=root, check=True, capture_output=True)
    subprocess.run([*GIT, "update-ref", "refs/remotes/origin/main", "HEAD"], cwd=root, check=True)
    subprocess.run([*GIT, "gc", "-q", "--aggressive", "--prune=now"], cwd=root, check=True, capture_output=True)
    assert not list((root / ".git" / "objects").glob("??/*")) and (root / ".git" / "packed-refs").exists()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    links = [link for link in _node_links(root) if link.startswith("https://")]
    assert any(f"/blob/{head}/python/sglang/srt/{NIXL}#L" in link for link in links), links[:3]


def test_links_in_a_linked_worktree(checkout: tuple[Path, str], tmp_path: Path) -> None:
    root, commit = checkout
    linked = tmp_path / "linked"
    subprocess.run([*GIT, "worktree", "add", "-q", "--detach", str(linked), "HEAD"], cwd=root, check=True,
                   capture_output=True)
    links = _node_links(linked)
    assert links and all(link.startswith(f"https://github.com/example-org/sglang-fork/blob/{commit}/") for link in links)
    # A .git file pointing at a git folder that does not name this checkout back is not followed.
    (linked / ".git").write_text(f"gitdir: {root / '.git'}\n")
    assert not any(link.startswith("https://") for link in _node_links(linked))


@pytest.mark.parametrize("hostile", ["fsmonitor", "filter"])
def test_links_run_nothing_from_the_scanned_tree(checkout: tuple[Path, str], hostile: str) -> None:
    """`git status` would run core.fsmonitor and the clean filter of a changed file: kvtrace reads
    .git as files, so the marker those commands would write never appears."""
    root, _ = checkout
    marker = root.parent / f"ran-{hostile}"
    command = f"touch {marker}"
    if hostile == "fsmonitor":
        subprocess.run([*GIT, "config", "core.fsmonitor", command], cwd=root, check=True)
    else:
        subprocess.run([*GIT, "config", "filter.evil.clean", command], cwd=root, check=True)
        (root / ".gitattributes").write_text("*.py filter=evil\n")
        # Same size, new mtime: git must hash the file again, through the clean filter.
        conn = root / "python" / "sglang" / "srt" / NIXL
        os.utime(conn, (conn.stat().st_atime + 100, conn.stat().st_mtime + 100))
    for fmt in ("html", "markdown"):
        result = kvtrace("scan", "python/sglang", "-f", fmt, cwd=root)
        assert result.returncode == 1, result.stderr
        assert "https://github.com/example-org/sglang-fork/blob/" in result.stdout
    assert not marker.exists()
    # The same config does run under git itself: the test would notice if kvtrace ran git.
    subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True)
    assert marker.exists()


def _installed(tmp_path: Path, version: str) -> Path:
    """An installed release: site-packages with the package and its dist-info METADATA."""
    from tests.sglang_wheels import sglang_tree

    site = tmp_path / "site-packages"
    shutil.copytree(sglang_tree(version) / "sglang", site / "sglang")
    dist = site / f"sglang-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return site


def test_installed_release_links_to_its_tag(tmp_path: Path) -> None:
    site = _installed(tmp_path, "0.4.6.post5")
    for target in ("site-packages/sglang", "site-packages/sglang/srt/disaggregation", "site-packages"):
        md = kvtrace("scan", target, "-f", "markdown", cwd=tmp_path).stdout
        links = re.findall(r"\]\((https://[^)]+)\)", md)
        assert links, target
        base = "https://github.com/sgl-project/sglang/blob/v0.4.6.post5/python/sglang/srt/"
        assert all(link.startswith(base) for link in links), (target, links[:2])
        for link in set(links):  # each names a line that exists in the installed file
            path, line = link[len("https://github.com/sgl-project/sglang/blob/v0.4.6.post5/python/"):].split("#L")
            assert 0 < int(line) <= len((site / path).read_text().splitlines())


HOSTILE = ["<img src=x onerror=alert(1)>", "a``b|c", "`x|y`", "*em* _u_ [l](javascript:alert(1))", "&lt;", "x\\|y",
           "```", "<details>", "~~~"]


class _Elements(__import__("html.parser").parser.HTMLParser):
    """The elements and text of rendered HTML, as a browser would build them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.rows: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.rows[-1].append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _commonmark(markdown: str) -> _Elements:
    """Rendered as a CommonMark renderer does (raw HTML allowed, GitHub's tables)."""
    from markdown_it import MarkdownIt

    parsed = _Elements()
    parsed.feed(MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown))
    return parsed


@pytest.mark.parametrize("name", HOSTILE)
def test_markdown_text_helpers_keep_hostile_text_as_text(name: str) -> None:
    from kvtrace.report.mdtext import cell, code, html, link, prose

    for rendered in (code(name), prose(name)):
        parsed = _commonmark(f"- {rendered} and more\n")
        assert {tag for tag, _ in parsed.tags} <= {"ul", "li", "code"}, (name, rendered, parsed.tags)
        assert "".join(parsed.text).strip() == f"{name} and more"
    table = f"| a | b |\n|---|---|\n| {cell(code(name))} | {cell(prose(name))} |\n"
    parsed = _commonmark(table)
    assert parsed.rows == [["th", "th"], ["td", "td"]] and "img" not in {t for t, _ in parsed.tags}
    assert "".join(parsed.text).count(name) == 2
    parsed = _commonmark(f"<details><summary>{html(name)}</summary>\n\nbody\n\n</details>\n")
    assert [t for t, _ in parsed.tags] == ["details", "summary", "p"] and name in "".join(parsed.text)
    parsed = _commonmark(link(code(name), "https://example.invalid/a b(c)") + "\n")
    assert [(t, a.get("href")) for t, a in parsed.tags if t == "a"] == [("a", "https://example.invalid/a%20b%28c%29")]


def test_markdown_report_of_a_hostile_backend_folder(tmp_path: Path) -> None:
    """A backend folder named `x``|<img src=x onerror=alert(1)>`: before, its name went raw into
    `<summary>` (the img ran its onerror) and broke the code spans and table rows."""
    name = "x``|<img src=x onerror=alert(1)>"
    shutil.copytree(EXAMPLES / "nixl-pin", tmp_path / "tree")
    (tmp_path / "tree" / "disaggregation" / "nixl").rename(tmp_path / "tree" / "disaggregation" / name)
    for detail in ("summary", "full"):
        result = kvtrace("scan", "tree", "-f", "markdown", "--detail", detail, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        parsed = _commonmark(result.stdout)
        assert "img" not in {tag for tag, _ in parsed.tags}
        header = next(row for row in parsed.rows)
        assert all(len(row) == len(header) for row in parsed.rows[:3])  # the grid's rows are whole
        text = "".join(parsed.text)
        assert f"{name} pins WaitingForInput, Transferring" in text
        assert f"disaggregation/{name}/conn.py:" in text
        assert not re.search(r"^\s*(```|~~~)(?!python|mermaid)\S", result.stdout, re.M)  # no stray fence


@pytest.mark.parametrize("version", ["0.4.8", "0.5.14", "0.5.23"])
def test_markdown_bug_report_fits_an_issue(tmp_path: Path, version: str) -> None:
    """Before: 39 KB on 0.4.8, 53 KB on 0.5.14 (five diagrams, one backend pins) and 105 KB on
    0.5.23, over GitHub's 65,536-character limit for an issue body; no title, no links."""
    from kvtrace.report.diagram import diagrams
    from kvtrace.scan import scan_path

    site = _installed(tmp_path, version)
    md = kvtrace("scan", "site-packages/sglang", "-f", "markdown", cwd=tmp_path).stdout
    assert len(md) < 60_000
    report = scan_path(site / "sglang")
    pinning = [d.backend.name for d in diagrams(report) if d.pinned]
    lines = md.splitlines()
    # Two queues are judged (bootstrap and inflight): the title names the release, the findings their queues.
    assert lines[0].startswith("# kvtrace: ") and f"(sglang {version})" in lines[0]
    errors = [f for f in report.findings if f.severity == "error"]
    if pinning:
        assert all(f"{name} pins" in lines[0] for name in pinning)
    else:
        assert lines[0].startswith("# kvtrace: no errors · ") and not errors
    # The answer next: the summary line, then the grid, before any finding.
    assert lines[2].startswith("**") and "Verdicts for `disagg_prefill_inflight_queue`:" in "\n".join(lines[3:8])
    # One diagram per backend that pins, unfolded; each error with its chain of links and its code.
    answer, folded = md.split("## Environment")
    assert answer.count("```mermaid") == len(pinning)
    for name in pinning:
        assert f"### {name} pins " in answer
    for f in errors:
        # Shown as it opens from the working directory, linked to the release's own path.
        queue = f"in `{f.queue}` " if f.queue else ""  # named when the report judges several queues
        assert (f"- **{f.rule}** (error) {queue}[`site-packages/sglang/{f.path}:{f.line}`]"
                f"(https://github.com/sgl-project/sglang/blob/v{version}/python/sglang/{f.path}#L{f.line})") in answer
    # Every path:line links to the release's tag.
    spans = re.findall(r"(\[?)`[^`\n]+:\d+`(\]?)", md)
    assert spans and all(opened and closed for opened, closed in spans)
    # The full report holds every backend's diagram and is not bounded.
    full = kvtrace("scan", "site-packages/sglang", "-f", "markdown", "--detail", "full", cwd=tmp_path).stdout
    assert full.count("```mermaid") == len(report.backends) and "<details><summary>Release map" not in full
    assert "## Release map: disagg_prefill_inflight_queue" in full and "Left out to keep" not in full


def unlinked_mentions(markdown: str) -> list[str]:
    """Each `path:line` outside a link, in prose, tables and `<details>` (code blocks aside: a
    mermaid or python block cannot hold a link)."""
    text = re.sub(r"^(```+|~~~+)[^\n]*\n.*?^\1[ \t]*$", "", markdown, flags=re.S | re.M)
    text = re.sub(r"\[(?:[^\[\]]|\\\[|\\\])*\]\(https://[^)]+\)", "", text)
    text = re.sub(r'<a href="https://[^"]+">.*?</a>', "", text)
    return re.findall(r"[\w./\\-]+\.py:\d+", text)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_every_path_line_in_the_markdown_of_an_installed_release_is_a_link(tmp_path: Path, version: str) -> None:
    """Before: 0.5.14 had 42 mentions not linked ("What frees" lines, way-out cells, notes, the
    fates, the excerpts' summaries), 0.5.23 43. Each link names a line of the installed file."""
    site = _installed(tmp_path, version)
    _with_environ(site, version)
    md = kvtrace("scan", "site-packages/sglang", "-f", "markdown", cwd=tmp_path).stdout
    assert unlinked_mentions(md) == []
    base = f"https://github.com/sgl-project/sglang/blob/v{version}/python/"
    links = set(re.findall(r"\]\((https://[^)]+)\)", md)) | set(re.findall(r'<a href="(https://[^"]+)"', md))
    assert len(links) > 20 and all(link.startswith(base) for link in links)
    for link in links:
        path, line = link[len(base):].split("#L")
        assert 0 < int(line) <= len((site / path).read_text().splitlines()), link
    # Neither a release nor a pushed checkout: no link at all, the mentions as they were.
    shutil.rmtree(site / f"sglang-{version}.dist-info")
    plain = kvtrace("scan", "site-packages/sglang", "-f", "markdown", cwd=tmp_path).stdout
    assert "](https://" not in plain and "<a href" not in plain and len(unlinked_mentions(plain)) > 50


@pytest.mark.parametrize("version", ["0.5.12", "0.5.6.post2"])
def test_markdown_keeps_the_chain_of_a_warning_level_pin(tmp_path: Path, version: str) -> None:
    """Before: on 0.5.12 ... 0.5.22 the pins are warnings (each holds under a premise) and their
    chains (entry, drain loop, keep, premise) were in the folded evidence, the first thing left out
    to stay under budget, while four diagrams of backends that pin nothing stayed: 0 chain lines."""
    from kvtrace.report.diagram import diagrams
    from kvtrace.scan import scan_path

    site = _installed(tmp_path, version)
    md = kvtrace("scan", "site-packages/sglang", "-f", "markdown", cwd=tmp_path).stdout
    assert len(md) < 60_000
    report = scan_path(site / "sglang")
    pinning = {d.backend.name for d in diagrams(report) if d.pinned}
    pins = [f for f in report.findings if f.rule == "pinned-state" and f.backend in pinning]
    assert [f for f in pins if f.severity == "warning"]  # what the case is about
    answer = md.split("## Findings")[0]
    for f in pins:
        assert f"- **pinned-state** ({f.severity}) in `{f.queue}` [`site-packages/sglang/{f.path}:{f.line}`]" in answer
        for e in f.evidence:  # every link of the chain, with its line
            assert f"  - [`site-packages/sglang/{e.path}:{e.line}`]" in answer, (f.backend, e)


def _with_environ(site: Path, version: str) -> None:
    """An installed release has srt/environ.py (the env registry); the test trees keep only the
    files kvtrace scans, so it is taken from the same wheel."""
    import zipfile

    from tests.sglang_wheels import wheel

    with zipfile.ZipFile(wheel(version)) as archive:
        (site / "sglang" / "srt" / "environ.py").write_bytes(archive.read("sglang/srt/environ.py"))


@pytest.mark.parametrize(("version", "style"), [("0.5.2", "call"), ("0.5.14", "registry")])
def test_what_frees_each_state_names_the_timeout_variable_and_default(tmp_path: Path, version: str,
                                                                      style: str) -> None:
    """0.5.2 reads `get_int_env_var("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300)` in
    mooncake/conn.py; 0.5.14 reads `envs.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.get()`, declared
    `EnvInt(300)` in srt/environ.py. Both are found from the timeout check's compared name."""
    from kvtrace.freeing import what_frees
    from kvtrace.scan import scan_path

    site = _installed(tmp_path, version)
    if style == "registry":
        _with_environ(site, version)
    report = scan_path(site / "sglang")
    mooncake = next(b for b in report.backends if b.name == "mooncake")
    frees = {f.state: f for f in what_frees(report, mooncake)}
    boot = frees["Bootstrapping"]
    assert "a timeout frees it: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default 300" in boot.text
    read = next(e for e in boot.evidence if e.note.startswith("reads "))
    text = (site / "sglang" / read.path).read_text().splitlines()[read.line - 1]
    assert "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT" in text or "bootstrap_timeout" in text
    if style == "registry":
        declared = next(e for e in boot.evidence if e.note.startswith("declares"))
        assert declared.path == "srt/environ.py"
        assert "EnvInt(300)" in (site / "sglang" / "srt" / "environ.py").read_text().splitlines()[declared.line - 1]
    nixl = next(b for b in report.backends if b.name == "nixl")
    pinned = {f.state for f in report.findings if f.rule == "pinned-state" and f.backend == "nixl"}
    for freeing in what_frees(report, nixl):
        if freeing.state in pinned:
            assert freeing.how == "nothing" and "restarts" in freeing.text
    # The bug report and the text report say it where the pin is.
    md = kvtrace("scan", "site-packages/sglang", "-f", "markdown", cwd=tmp_path).stdout.split("## Findings")[0]
    assert "until the server restarts" in md
    text_report = " ".join(kvtrace("scan", "site-packages/sglang", "--backend", "mooncake", cwd=tmp_path).stdout.split())
    assert re.search(r"what frees Bootstrapping: .*?SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default 300", text_report)


def test_html_header_names_the_installed_release(tmp_path: Path) -> None:
    """Before: the text and markdown reports named the installed release (from its dist-info
    METADATA) but the HTML page's header did not say which SGLang it was drawn from."""
    _installed(tmp_path, "0.4.6.post5")
    page = kvtrace("scan", "site-packages/sglang", "-f", "html", cwd=tmp_path).stdout
    header = re.search(r"<h1>(.*?)</h1>", page, re.S)
    assert header is not None and "sglang 0.4.6.post5" in re.sub(r"<[^>]+>", "", header.group(1)), header


def test_a_default_declared_outside_the_scanned_folder_says_so(tmp_path: Path) -> None:
    """0.5.14 declares SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT = EnvInt(300) in srt/environ.py.
    Scanned without that file, the default was "not found", as if the release had none; it now
    says which file declares it and that it was not found where kvtrace looks for it (a folder
    named like the package at, above or just below the target: a renamed copy is not one)."""
    from kvtrace.freeing import what_frees
    from kvtrace.scan import scan_path

    site = _installed(tmp_path, "0.5.14")
    assert not (site / "sglang" / "srt" / "environ.py").exists()
    report = scan_path(site / "sglang")
    mooncake = next(b for b in report.backends if b.name == "mooncake")
    boot = next(f for f in what_frees(report, mooncake) if f.state == "Bootstrapping")
    assert ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default unknown: it is declared in sglang/srt/environ.py, "
            "which was not found at, above or just below the scanned folder (checked at ") in boot.text, boot.text
    assert "default not found" not in boot.text
    _with_environ(site, "0.5.14")  # with the file, its default
    report = scan_path(site / "sglang")
    mooncake = next(b for b in report.backends if b.name == "mooncake")
    boot = next(f for f in what_frees(report, mooncake) if f.state == "Bootstrapping")
    assert "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default 300" in boot.text and "unknown" not in boot.text


def test_a_copy_of_the_package_under_another_name_reads_its_own_environ(tmp_path: Path) -> None:
    """Before: versions/sglang-0.5.14/ (a copy of the package named otherwise) holds
    srt/environ.py, but kvtrace looked for it only under a folder named `sglang`: "default
    unknown ... not found", scanned alone or with --all. With --all the lookup was also
    remembered per target, not per package: two releases of one run would share it."""
    versions = tmp_path / "versions"
    versions.mkdir()
    declared = {}
    for version in ("0.5.14", "0.5.23"):
        site = _installed(tmp_path / version, version)
        _with_environ(site, version)
        lines = (site / "sglang" / "srt" / "environ.py").read_text().splitlines()
        declared[version] = next(n for n, line in enumerate(lines, 1)
                                 if re.match(r"\s*SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT\b", line))
        shutil.move(site / "sglang", versions / f"sglang-{version}")
    assert declared["0.5.14"] != declared["0.5.23"]  # so that one package's line cannot pass for the other's
    alone = " ".join(kvtrace("scan", "versions/sglang-0.5.14", "--backend", "mooncake", "--no-cache",
                             cwd=tmp_path).stdout.split())
    assert "default unknown" not in alone
    assert re.search(r"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default 300 .*?"
                     rf"versions/sglang-0\.5\.14/srt/environ\.py:{declared['0.5.14']}\b", alone), alone
    both = " ".join(kvtrace("scan", "versions", "--all", "--backend", "mooncake", "--no-cache",
                            cwd=tmp_path).stdout.split())
    assert "default unknown" not in both
    for version, line in declared.items():
        assert f"versions/sglang-{version}/srt/environ.py:{line}" in both, version


def test_a_backend_with_no_finding_of_its_own_still_says_what_frees_the_state_it_keeps(tmp_path: Path) -> None:
    """Before: 0.5.23's fake backend keeps WaitingForInput (the drain's queue-level silent-wait)
    and its timeout covers it (fake/conn.py:92, SGLANG_DISAGGREGATION_WAITING_TIMEOUT), so no
    no-timeout note names it; the text report printed "what frees" only under a backend's own
    findings, and fake had none: no line at all."""
    site = _installed(tmp_path, "0.5.23")
    _with_environ(site, "0.5.23")
    out = " ".join(kvtrace("scan", "site-packages/sglang", "--backend", "fake", cwd=tmp_path).stdout.split())
    told = re.search(r"what frees WaitingForInput: (.*?)(?= what frees |$)", out)
    assert told is not None, out[-2000:]
    assert re.search(r"a timeout frees it: SGLANG_DISAGGREGATION_WAITING_TIMEOUT, default \d+ \(checked at "
                     r"site-packages/sglang/srt/disaggregation/fake/conn\.py:92\)", told.group(1)), told.group(1)


def test_each_queue_names_only_the_states_it_keeps_in_what_frees_on_0_4_8(tmp_path: Path) -> None:
    """Before: 0.4.8's section "mooncake pins WaitingForInput in disagg_prefill_inflight_queue"
    listed what frees Bootstrapping too, which the inflight drain never keeps (it raises there;
    only the bootstrap queue keeps and pins it)."""
    from kvtrace.model import Outcome
    from kvtrace.scan import scan_path

    site = _installed(tmp_path, "0.4.8")
    report = scan_path(site / "sglang")
    kept = {q.name: {s for s, fate in q.states.items() if Outcome.KEPT in fate.fate} for q in report.queues}
    assert "Bootstrapping" not in kept["disagg_prefill_inflight_queue"]  # what the case is about
    md = kvtrace("scan", "site-packages/sglang", "-f", "markdown", cwd=tmp_path).stdout
    section = md.split("### mooncake pins ", 1)[1].split("\n- **", 1)[0]
    heading = section.splitlines()[0]
    assert heading == ("WaitingForInput in `disagg_prefill_inflight_queue`; "
                       "Bootstrapping in `disagg_prefill_bootstrap_queue`"), heading
    blocks = dict(re.findall(r"^In `(\w+)`:\n\n((?:- .*\n)+)", section, re.M))
    assert set(blocks) == {"disagg_prefill_inflight_queue", "disagg_prefill_bootstrap_queue"}
    mooncake = next(b for b in report.backends if b.name == "mooncake")
    for queue, block in blocks.items():
        told = set(re.findall(r"^- (\w+):", block, re.M))
        assert told == kept[queue] & set(mooncake.verdicts), (queue, told)


@pytest.mark.parametrize(("version", "clauses"), [
    ("0.5.9", ["nixl pins Bootstrapping and WaitingForInput", "WaitingForInput and Transferring crash the scheduler",
               "nixl's poll() raises instead of returning Failed"]),
    ("0.4.8", ["mooncake pins Bootstrapping and WaitingForInput", "nixl pins Bootstrapping and WaitingForInput"]),
])
def test_the_markdown_title_reads_as_a_sentence(tmp_path: Path, version: str, clauses: list[str]) -> None:
    """Before: 0.5.9's title read "queue state-crash WaitingForInput, Transferring; nixl:
    poll-raises" (a rule's name where a verb goes, "queue" for the drain). No rule's name is left."""
    from kvtrace.rulemeta import RULES

    _installed(tmp_path, version)
    title = kvtrace("scan", "site-packages/sglang", "-f", "markdown", cwd=tmp_path).stdout.splitlines()[0]
    assert title.startswith("# kvtrace: ") and title.endswith(f" (sglang {version})"), title
    for clause in clauses:
        assert clause in title, title
    assert not [r.name for r in RULES if r.name in title], title
    assert not re.search(r"(: |; )queue ", title) and ": poll" not in title, title


def _many_pinning_backends(count: int, evidence_times: int = 6, pad: int = 0):
    """examples/nixl-pin's report with `count` more backends that pin as nixl does (each with a
    longer chain): pins' chains alone far past the budget."""
    import dataclasses

    from kvtrace.scan import scan_path

    report = scan_path(EXAMPLES / "nixl-pin")
    nixl = next(b for b in report.backends if b.name == "nixl")
    pins = [f for f in report.findings if f.backend == "nixl"]
    backends, findings = list(report.backends), list(report.findings)
    for i in range(count):
        name = f"nixl{i:04d}" + "x" * pad
        backends.append(dataclasses.replace(nixl, name=name))
        findings += [dataclasses.replace(f, backend=name, evidence=list(f.evidence) * evidence_times) for f in pins]
    return dataclasses.replace(report, backends=backends, findings=findings)


def test_markdown_stays_under_budget_when_the_pins_chains_alone_would_pass_it() -> None:
    """Before: only the folded sections were trimmed; the pins' chains never were, so 40 pinning
    backends made a 400,000-character report (0.5.13 and 0.5.14 were at 59,857 of 60,000)."""
    from kvtrace.report.markdown import MARKDOWN_BUDGET, render

    report = _many_pinning_backends(40)
    full = render([report], detail="full")
    assert len(full) > 3 * MARKDOWN_BUDGET  # what the case is about
    md = render([report])
    assert len(md) < MARKDOWN_BUDGET
    # The first pins whole: heading, what frees, chain and diagram, in the order of the full report.
    told = re.findall(r"^### (\S+) pins ", md, re.M)
    assert told and told == re.findall(r"^### (\S+) pins ", full, re.M)[:len(told)]
    assert md.count("```mermaid") >= len(told)
    for name in told:
        section = md.split(f"### {name} pins ", 1)[1].split("\n### ", 1)[0]
        assert "- **pinned-state** (error)" in section and "```mermaid" in section
    left = [line for line in md.splitlines() if "chains (pinning backends and errors) left out" in line]
    assert len(left) == 1 and f"*{41 - len(told)} more " in left[0] and "--detail full" in left[0], left
    assert md.count("```") % 2 == 0


def test_markdown_stays_under_budget_when_the_answer_alone_would_pass_it() -> None:
    """Forty backends named with 2,000 characters each: the title and the verdict grid are over
    the budget by themselves; the last guard cuts the document at a line and says so."""
    from kvtrace.report.markdown import MARKDOWN_BUDGET, render

    md = render([_many_pinning_backends(40, evidence_times=1, pad=2000)])
    assert len(md) < MARKDOWN_BUDGET
    assert md.rstrip().endswith("writes it all.*") and md.count("```") % 2 == 0
