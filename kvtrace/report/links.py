"""Where a path:line can be opened upstream, so that a pasted report links to the very line:

- an installed SGLang release (its version read from the package metadata beside it): the
  release's tag on GitHub, `https://github.com/sgl-project/sglang/blob/v<version>/python/sglang/...`;
- a git checkout with a GitHub remote: a commit that is pushed (the tip of a remote-tracking
  ref) whose copy of the file is byte for byte the one scanned, so the line is the one reported
  and the page exists; a file changed since, or not in any pushed commit, gets no link;
- anything else: no link.

Nothing from the scanned tree is run: the checkout's `.git` is read as files
(kvtrace.gitfiles), never through git, whose `core.fsmonitor` and filters would execute.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from kvtrace.gitfiles import GitDir, blob_sha, find_git_dir, read_bounded
from kvtrace.model import Report

GITHUB_REMOTE = re.compile(r"^(?:https://|ssh://git@|git@)github\.com[:/](?P<repo>[\w.-]+/[\w.-]+?)(?:\.git)?/?$")
UPSTREAM = "https://github.com/sgl-project/sglang"
MAX_SOURCE = 8 << 20  # a scanned file larger than this is not hashed (and gets no link)
# PEP 440 release spellings as SGLang tags them (v0.5.14, v0.4.6.post5, v0.5.0rc2)
RELEASE = re.compile(r"^\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?$")


@dataclass
class Permalinks:
    bases: dict[str, str] = field(default_factory=dict)  # report path -> URL of that file
    default: str | None = None  # prefix for every path (an installed release's tag)
    shown: dict[str, str] = field(default_factory=dict)  # a path as shown to the reader -> report path
    known: frozenset[str] = frozenset()  # the paths (as shown) that prose may mention: the scan's own

    def mentions(self, text: str) -> list[tuple[int, int, str, int]]:
        """(start, end, path, line) of each `path:line` in `text` whose path is one the scan read
        (never a guess at what looks like a path) and that has a link."""
        present = [p for p in self.known if p in text]
        if not present:
            return []
        found = []
        for match in _mention_pattern(tuple(sorted(present, key=len, reverse=True))).finditer(text):
            path, line = match.group(1), int(match.group(2))
            if self.url(path, line) is not None:
                found.append((match.start(), match.end(), path, line))
        return found

    def url(self, path: str, line: int) -> str | None:
        path = self.shown.get(path, path)
        base = self.bases.get(path) or (f"{self.default}{path}" if self.default is not None else None)
        if base is None:
            return None
        return f"{base}#L{line}" if line > 0 else base


@functools.lru_cache(maxsize=256)
def _mention_pattern(paths: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(p) for p in paths)
    return re.compile(rf"(?<![\w./~+-])({alternatives}):(\d+)(?!\d)")


def github_repo(url: str) -> str | None:
    match = GITHUB_REMOTE.match(url.strip())
    return match.group("repo") if match else None


def _target_path(report: Report) -> tuple[str, bool] | None:
    """(the target's path, whether it is local)."""
    from kvtrace.target import LocalTarget, parse_target

    try:
        parsed = parse_target(report.target)
    except Exception:  # noqa: BLE001 -- a label that is no longer a valid target: no links
        return None
    if isinstance(parsed, LocalTarget):
        return str(parsed.path.resolve()), True
    return parsed.path, False


def release_links(report: Report) -> Permalinks | None:
    """Links to the release's tag when the tree is an installed release: the path of each
    file below the `sglang` package folder is its path below `python/sglang/` upstream."""
    version = str((report.host_facts or {}).get("sglang_version") or "")
    if not RELEASE.match(version):
        return None
    found = _target_path(report)
    if found is None:
        return None
    path, _ = found
    parts = [p for p in PurePosixPath(path.replace("\\", "/")).parts if p != "/"]
    root_parts = [p for p in report.root.split("/") if p]
    full = parts + root_parts
    # The deepest `sglang` folder holding the located package: the one the metadata sits beside.
    where = [i for i, p in enumerate(full) if p == "sglang"]
    if where:
        inside = parts[where[-1]:] if where[-1] < len(parts) else []
        prefix = "/".join(inside)
        return Permalinks(default=f"{UPSTREAM}/blob/v{version}/python/{prefix + '/' if prefix else ''}")
    if root_parts[:1] == ["sglang"]:  # the target is site-packages itself: paths start with sglang/
        return Permalinks(default=f"{UPSTREAM}/blob/v{version}/python/")
    return None


def checkout_links(report: Report) -> Permalinks | None:
    found = _target_path(report)
    if found is None or not found[1]:
        return None
    target = Path(found[0])
    folder = target if target.is_dir() else target.parent
    repo = find_git_dir(folder)
    if repo is None:
        return None
    try:
        prefix = folder.relative_to(repo.work_tree).as_posix()
    except ValueError:
        return None
    prefix = "" if prefix == "." else prefix + "/"
    candidates = _pushed_commits(repo)
    if not candidates:
        return None
    links = Permalinks()
    for source in report.files:
        data = read_bounded(folder / source.path, MAX_SOURCE)
        if data is None:
            continue
        wanted = blob_sha(data)
        for commit, github in candidates:
            if repo.blob_at(commit, prefix + source.path) == wanted:
                links.bases[source.path] = f"https://github.com/{github}/blob/{commit}/{prefix}{source.path}"
                break
    return links if links.bases else None


def _pushed_commits(repo: GitDir) -> list[tuple[str, str]]:
    """(commit, owner/name) of the remote-tracking tips on GitHub remotes, the most telling
    first: HEAD when it is one of them, the branch's upstream, the remote's HEAD, the rest."""
    urls = {name: github_repo(url) for name, url in repo.remote_urls().items()}
    tips = repo.remote_tracking()
    head = repo.head()
    upstream = repo.upstream(repo.current_branch())

    def rank(ref: str) -> tuple:
        return (tips[ref] != head, ref != upstream, not ref.endswith("/HEAD"), ref)

    found: list[tuple[str, str]] = []
    for ref in sorted(tips, key=rank):
        remote = ref[len("refs/remotes/"):].split("/", 1)[0]
        github = urls.get(remote)
        if github and (tips[ref], github) not in found:
            found.append((tips[ref], github))
    return found[:32]


def permalinks(report: Report) -> Permalinks | None:
    return release_links(report) or checkout_links(report)
