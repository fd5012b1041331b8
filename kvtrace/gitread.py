"""A git revision's files, read as stored objects: nothing from the repository runs.

`kvtrace diff` scans two revisions of a checkout without touching it. The files are read with
`git ls-tree` and `git cat-file --batch`, which hand out the raw blobs: no smudge or clean filter,
no textconv, no working tree, no index (so no fsmonitor), no hook, no pager. User text reaches git
only as a validated commit id (`rev-parse --verify --end-of-options REV^{commit}`) and, after
`--`, as a literal pathspec, never as an option. Configuration a repository could use to run a
command or reach the network is overridden on every call (core.fsmonitor, core.hooksPath,
credential helpers, and every transport, so that a partial clone cannot fetch a missing object
through ssh or an `ext::` command; see git_env), replace refs are ignored (the commit's own
objects are read), and git never prompts.

The blobs are written into a private temporary folder that the local fetch then reads, so a
revision is scanned exactly as a checkout of it would be. Symbolic links (mode 120000) are
recreated as links and meet the local fetch's rules (a link out of the tree is a gap naming it,
never followed); a submodule (mode 160000) is a gap: its files are in another repository.
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kvtrace.errors import InputError, LimitExceeded
from kvtrace.model import FetchLimits, SourceFile

# Overrides for settings a repository's own config may hold that would run a command or reach
# the network while objects are read (transports: see git_env).
_SAFE_CONFIG = ("core.fsmonitor=false", "core.hooksPath=/dev/null", "protocol.allow=never",
                "core.untrackedCache=false", "core.pager=cat", "credential.helper=")
MAX_REVISION_CHARS = 1024  # far above any real ref name or revision expression


def git_command(repo: Path, *args: str) -> list[str]:
    config = [part for setting in _SAFE_CONFIG for part in ("-c", setting)]
    return ["git", "--no-pager", "--literal-pathspecs", "--no-replace-objects", *config, "-C", str(repo), *args]


def git_env() -> dict[str, str]:
    env = dict(os.environ)
    # A partial clone fetches a missing blob from its promisor remote, which the repository's own
    # config can make a command (`ext::`, allowed by protocol.ext.allow, which protocol.allow does
    # not override). GIT_NO_LAZY_FETCH stops the fetch; an empty GIT_ALLOW_PROTOCOL allows no
    # transport whatever the config says.
    env.update(GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", PAGER="cat", GIT_NO_LAZY_FETCH="1", GIT_ALLOW_PROTOCOL="",
               GIT_ASKPASS="", SSH_ASKPASS="")
    env.pop("GIT_EXTERNAL_DIFF", None)
    return env


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(git_command(repo, *args), env=git_env(), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=600)
    except FileNotFoundError:
        raise InputError("git: not found on PATH (kvtrace diff reads revisions with git)") from None
    except OSError as exc:
        raise InputError(f"git: {exc.strerror or exc}") from None


def _first_line(data: bytes) -> str:
    """git's own reason: its fatal or error line, else the last line (warnings come first)."""
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return next((line for line in lines if line.startswith(("fatal:", "error:"))), lines[-1] if lines else "failed")


def resolve_commit(repo: Path, rev: str) -> str:
    """The full commit id `rev` names in `repo`, or one InputError line."""
    if not rev or rev.startswith("-") or len(rev) > MAX_REVISION_CHARS or "\0" in rev or "\n" in rev:
        shown = rev if len(rev) <= 80 else rev[:77] + "..."
        raise InputError(f"{shown!r}: not a folder or a git revision")
    found = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    commit = found.stdout.decode("ascii", "replace").strip()
    if found.returncode != 0 or len(commit) not in (40, 64) or not all(c in "0123456789abcdef" for c in commit):
        inside = _git(repo, "rev-parse", "--git-dir")
        where = f"a revision of the git repository at {repo}" if inside.returncode == 0 else \
            f"a folder (and {repo} is not a git checkout)"
        raise InputError(f"{rev}: not {where}")
    return commit


def clean_subdir(subdir: str | None) -> str:
    """`--path` as a plain relative path inside the repository or folder ('' for all of it): a
    leading '/' is its top, as in git's own pathspecs, never the machine's root."""
    if not subdir:
        return ""
    parts = [p for p in subdir.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts) or "\0" in subdir:
        raise InputError(f"--path {subdir}: must be a folder inside the repository (no '..')")
    return "/".join(parts)


@dataclass
class TreeEntry:
    mode: str
    kind: str
    object_id: str
    size: int | None  # None for a submodule
    path: str  # relative to the subdir


@dataclass
class Materialised:
    folder: Path
    skipped: list[SourceFile] = field(default_factory=list)  # gaps the fetch of `folder` cannot see


def list_tree(repo: Path, commit: str, subdir: str) -> list[TreeEntry]:
    """Every blob and submodule below `subdir` at `commit`, paths relative to `subdir`."""
    listed = _git(repo, "ls-tree", "-r", "-z", "-l", "--full-tree", commit, "--", *([subdir] if subdir else []))
    if listed.returncode != 0:
        raise InputError(f"git ls-tree {commit[:12]}: {_first_line(listed.stderr)}")
    prefix = subdir + "/" if subdir else ""
    entries = []
    for record in listed.stdout.split(b"\0"):
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        mode, kind, object_id, size = meta.decode("ascii").split()
        path = os.fsdecode(raw_path)
        if prefix and not path.startswith(prefix):
            continue  # `subdir` itself when it is a file, link or submodule: no folder to scan
        entries.append(TreeEntry(mode, kind, object_id, None if size == "-" else int(size), path[len(prefix):]))
    return entries


def _safe_parts(path: str) -> list[str] | None:
    parts = path.split("/")
    if any(p in ("", ".", "..") or "\0" in p for p in parts):
        return None
    return parts


class _BlobReader:
    """One `git cat-file --batch` process: raw object bytes by id, one request at a time."""

    def __init__(self, repo: Path) -> None:
        self.process = subprocess.Popen(git_command(repo, "cat-file", "--batch"), env=git_env(),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def read(self, object_id: str, limit: int) -> bytes:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(object_id.encode("ascii") + b"\n")
        self.process.stdin.flush()
        header = self.process.stdout.readline().split()
        if len(header) != 3 or header[1] != b"blob":
            raise InputError(f"git cat-file {object_id}: {b' '.join(header).decode('ascii', 'replace') or 'no answer'}")
        size = int(header[2])
        if size > limit:
            raise InputError(f"git cat-file {object_id}: {size} bytes, more than the tree listing said")
        data = self.process.stdout.read(size)
        self.process.stdout.read(1)  # the newline after each object
        return data

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _make_dirs(root: Path, parts: list[str]) -> Path:
    """Create root/parts... as real folders (never through a link) and return the last."""
    folder = root
    for part in parts:
        folder = folder / part
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                raise InputError(f"git tree: {part!r} is both a file and a folder") from None
    return folder


def materialise(repo: Path, commit: str, subdir: str, into: Path, limits: FetchLimits,
                shown: str | None = None) -> Materialised:
    """Write the `.py` blobs and the links below `subdir` at `commit` into the empty folder `into`
    (`shown`: --path as the user wrote it, for messages)."""
    entries = list_tree(repo, commit, subdir)
    if not entries:
        raise InputError(f"--path {shown or subdir}: no folder of that name in {commit[:12]}" if subdir else
                         f"{commit[:12]}: an empty tree")
    result = Materialised(into)
    links: list[tuple[list[str], TreeEntry]] = []
    wanted: list[tuple[list[str], TreeEntry]] = []
    for entry in entries:
        parts = _safe_parts(entry.path)
        if parts is None:
            result.skipped.append(SourceFile(entry.path, b"", "", status="skipped",
                                             error="a path git itself refuses to check out; not read"))
        elif entry.mode == "160000":
            result.skipped.append(SourceFile(entry.path + "/", b"", "", status="skipped",
                                             error=f"submodule at {entry.object_id[:12]}: its files are in "
                                                   "another repository; not read"))
        elif entry.mode == "120000":
            links.append((parts, entry))
        elif entry.kind == "blob" and entry.path.endswith(".py"):
            wanted.append((parts, entry))
    if len(wanted) + len(links) > limits.max_files:
        raise LimitExceeded(f"{commit[:12]}:{subdir}: more than {limits.max_files} .py files; "
                            "point --path at the disaggregation folder or raise the limit")
    readable = [(p, e) for p, e in wanted if (e.size or 0) <= limits.max_file_bytes]
    if sum(e.size or 0 for _, e in readable) > limits.max_total_bytes:
        raise LimitExceeded(f"{commit[:12]}:{subdir}: more than {limits.max_total_bytes} bytes of .py files; "
                            "point --path at the disaggregation folder")
    reader = _BlobReader(repo)
    try:
        for parts, entry in wanted:
            folder = _make_dirs(into, parts[:-1])
            fd = os.open(folder / parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as handle:
                if (entry.size or 0) > limits.max_file_bytes:
                    handle.truncate(entry.size or 0)  # its size is all the fetch looks at: a sparse stand-in
                else:
                    handle.write(reader.read(entry.object_id, entry.size or 0))
        for parts, entry in links:  # last, so that no file is ever written through one
            target = reader.read(entry.object_id, 4096) if (entry.size or 0) <= 4096 else b""
            folder = _make_dirs(into, parts[:-1])
            if not target or b"\0" in target:
                result.skipped.append(SourceFile(entry.path, b"", "", status="skipped",
                                                 error="symlink with no usable target; not followed"))
                continue
            os.symlink(os.fsdecode(target), folder / parts[-1])
    except OSError as exc:
        raise InputError(f"cannot write revision {commit[:12]} to {into}: {exc.strerror or exc}") from None
    finally:
        reader.close()
    return result


def export_revision(repo: Path, commit: str, subdir: str | None, folder: Path, limits: FetchLimits) -> Materialised:
    """`commit` of `repo` (below `subdir`) written into the empty private folder `folder`; the
    returned folder is the one to scan (`folder/subdir`)."""
    inside = clean_subdir(subdir)
    target = _make_dirs(folder, inside.split("/")) if inside else folder
    return materialise(repo, commit, inside, target, limits, shown=subdir)
