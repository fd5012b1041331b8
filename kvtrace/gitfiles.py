"""Read-only git forensics from the files of `.git`, never by running git: a scanned tree is
untrusted, and `git status` there runs its `core.fsmonitor` command and clean filters.

What is read: HEAD, loose refs, packed-refs, the remotes' URLs in `config`, and objects (loose,
or in packs with their deltas) to look a file's blob up in a commit's tree. Every file is opened
without following a symlink, must be a regular file and is read up to a bound; a `.git` file
(`gitdir: ...`, a linked worktree or a submodule) is followed only to a git directory that
names this checkout back (a worktree) or that lies in an enclosing repository's `.git/modules`.
Anything unexpected means "not known", never an error.
"""

from __future__ import annotations

import configparser
import hashlib
import mmap
import os
import stat
import zlib
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from kvtrace.outside import read_bounded

PACKED_REFS = 64 << 20
LOOSE_OBJECT = 64 << 20
MAX_DELTA_DEPTH = 64
MAX_TREE_DEPTH = 64
SHA_HEX = frozenset("0123456789abcdef")


def _text(path: Path) -> str | None:
    data = read_bounded(path)
    return data.decode("utf-8", "replace") if data is not None else None


def _is_sha(text: str) -> bool:
    return len(text) == 40 and set(text) <= SHA_HEX


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


@dataclass
class GitDir:
    work_tree: Path  # the checkout's top folder
    git_dir: Path  # where HEAD is (a worktree's own folder for a linked worktree)
    common_dir: Path  # where objects, refs and config are
    _packs: list[tuple[bytes, Path]] | None = field(default=None, repr=False)

    # --- refs -----------------------------------------------------------------------------
    def _packed_refs(self) -> dict[str, str]:
        data = read_bounded(self.common_dir / "packed-refs", PACKED_REFS)
        refs: dict[str, str] = {}
        for line in (data or b"").decode("utf-8", "replace").splitlines():
            parts = line.split(" ", 1)
            if len(parts) == 2 and _is_sha(parts[0]):
                refs[parts[1].strip()] = parts[0]
        return refs

    def resolve(self, ref: str, depth: int = 0) -> str | None:
        """A ref name (or HEAD) to its commit sha, following `ref:` links a few steps."""
        if depth > 5 or ".." in ref.split("/") or ref.startswith("/"):
            return None
        base = self.git_dir if ref == "HEAD" else self.common_dir
        text = _text(base / ref)
        if text is None and ref != "HEAD":
            return self._packed_refs().get(ref)
        text = (text or "").strip()
        if text.startswith("ref:"):
            return self.resolve(text[4:].strip(), depth + 1)
        return text if _is_sha(text) else None

    def head(self) -> str | None:
        return self.resolve("HEAD")

    def current_branch(self) -> str | None:
        text = (_text(self.git_dir / "HEAD") or "").strip()
        return text[4:].strip() if text.startswith("ref:") else None

    def remote_tracking(self) -> dict[str, str]:
        """refs/remotes/<remote>/<branch> -> sha, from loose refs and packed-refs."""
        found = {name: sha for name, sha in self._packed_refs().items() if name.startswith("refs/remotes/")}
        top = self.common_dir / "refs" / "remotes"
        if _real_dir(top):
            for folder, dirs, files in os.walk(top, followlinks=False):
                if len(found) > 10_000:
                    break
                for name in files:
                    ref = Path(folder, name).relative_to(self.common_dir).as_posix()
                    text = (_text(Path(folder, name)) or "").strip()
                    if _is_sha(text):
                        found[ref] = text
        return found

    def upstream(self, branch: str | None) -> str | None:
        """The remote-tracking ref the current branch follows (`branch.<name>.remote/merge`)."""
        if not branch or not branch.startswith("refs/heads/"):
            return None
        section = f'branch "{branch[len("refs/heads/"):]}"'
        config = self.config()
        if not config.has_section(section):
            return None
        remote, merge = config.get(section, "remote", fallback=""), config.get(section, "merge", fallback="")
        if not remote or not merge.startswith("refs/heads/"):
            return None
        return f"refs/remotes/{remote}/{merge[len('refs/heads/'):]}"

    def config(self) -> configparser.RawConfigParser:
        parser = configparser.RawConfigParser(strict=False, interpolation=None)
        text = _text(self.common_dir / "config") or ""
        try:
            parser.read_string(text)
        except configparser.Error:
            return configparser.RawConfigParser()
        return parser

    def remote_urls(self) -> dict[str, str]:
        config = self.config()
        urls = {}
        for section in config.sections():
            if section.startswith('remote "') and section.endswith('"'):
                url = config.get(section, "url", fallback="").strip().strip('"')
                if url:
                    urls[section[len('remote "'):-1]] = url
        return urls

    # --- objects --------------------------------------------------------------------------
    def _pack_indexes(self) -> list[tuple[bytes, Path]]:
        if self._packs is None:
            self._packs = []
            folder = self.common_dir / "objects" / "pack"
            try:
                names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".idx"))[:256]
            except OSError:
                names = []
            for name in names:
                idx = folder / name
                data = read_bounded(idx, 512 << 20)
                if data is not None and data[:4] == b"\xfftOc" and data[4:8] == b"\x00\x00\x00\x02":
                    self._packs.append((data, idx.with_suffix(".pack")))
        return self._packs

    def read_object(self, sha: str, depth: int = 0) -> tuple[str, bytes] | None:
        """(type, body) of an object, loose or packed; None when it cannot be read."""
        if not _is_sha(sha) or depth > MAX_DELTA_DEPTH:
            return None
        raw = read_bounded(self.common_dir / "objects" / sha[:2] / sha[2:], LOOSE_OBJECT)
        if raw is not None:
            try:
                data = zlib.decompressobj().decompress(raw, LOOSE_OBJECT)
            except zlib.error:
                return None
            header, _, body = data.partition(b"\0")
            kind, _, size = header.decode("ascii", "replace").partition(" ")
            return (kind, body) if size.isdigit() and int(size) == len(body) else None
        binary = bytes.fromhex(sha)
        for idx, pack in self._pack_indexes():
            offset = _idx_offset(idx, binary)
            if offset is not None:
                return self._packed(pack, offset, depth)
        return None

    def _packed(self, pack: Path, offset: int, depth: int) -> tuple[str, bytes] | None:
        try:
            fd = os.open(pack, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as data:
                return _unpack(self, data, offset, depth)
        except (OSError, ValueError, IndexError, zlib.error):
            return None
        finally:
            os.close(fd)

    def blob_at(self, commit: str, path: str) -> str | None:
        """The blob sha of `path` (relative to the work tree) in `commit`'s tree."""
        found = self.read_object(commit)
        if found is None or found[0] != "commit":
            return None
        first = found[1].split(b"\n", 1)[0]
        if not first.startswith(b"tree "):
            return None
        tree = first[5:].decode("ascii", "replace").strip()
        parts = [p for p in path.split("/") if p]
        for i, name in enumerate(parts[:MAX_TREE_DEPTH]):
            node = self.read_object(tree)
            if node is None or node[0] != "tree":
                return None
            entry = _tree_entry(node[1], name.encode("utf-8", "surrogateescape"))
            if entry is None:
                return None
            mode, sha = entry
            if i == len(parts) - 1:
                return sha if mode.startswith(b"100") else None
            tree = sha
        return None


def _idx_offset(idx: bytes, sha: bytes) -> int | None:
    fanout = 8
    count = int.from_bytes(idx[fanout + 255 * 4:fanout + 256 * 4], "big")
    lo = int.from_bytes(idx[fanout + (sha[0] - 1) * 4:fanout + sha[0] * 4], "big") if sha[0] else 0
    hi = int.from_bytes(idx[fanout + sha[0] * 4:fanout + (sha[0] + 1) * 4], "big")
    names = fanout + 256 * 4
    if len(idx) < names + count * 28:
        return None

    class _Names:  # a sequence view of the sorted sha table for bisect
        def __len__(self) -> int:
            return count

        def __getitem__(self, i: int) -> bytes:
            return idx[names + i * 20:names + i * 20 + 20]

    i = bisect_left(_Names(), sha, lo, hi)
    if i >= count or idx[names + i * 20:names + i * 20 + 20] != sha:
        return None
    offsets = names + count * 24
    offset = int.from_bytes(idx[offsets + i * 4:offsets + i * 4 + 4], "big")
    if offset & 0x80000000:
        large = offsets + count * 4 + (offset & 0x7FFFFFFF) * 8
        offset = int.from_bytes(idx[large:large + 8], "big")
    return offset


PACK_TYPES = {1: "commit", 2: "tree", 3: "blob", 4: "tag"}


def _unpack(repo: GitDir, data: mmap.mmap, offset: int, depth: int) -> tuple[str, bytes] | None:
    if depth > MAX_DELTA_DEPTH:
        return None
    start = offset
    byte = data[offset]
    kind, size, shift = (byte >> 4) & 7, byte & 15, 4
    offset += 1
    while byte & 0x80:
        byte = data[offset]
        size |= (byte & 0x7F) << shift
        shift += 7
        offset += 1
    if size > LOOSE_OBJECT:
        return None
    base: tuple[str, bytes] | None = None
    if kind == 6:  # OFS_DELTA: the base is earlier in this pack
        byte = data[offset]
        back = byte & 0x7F
        offset += 1
        while byte & 0x80:
            byte = data[offset]
            back = ((back + 1) << 7) | (byte & 0x7F)
            offset += 1
        base = _unpack(repo, data, start - back, depth + 1)
    elif kind == 7:  # REF_DELTA: the base named by sha
        base = repo.read_object(bytes(data[offset:offset + 20]).hex(), depth + 1)
        offset += 20
    elif kind not in PACK_TYPES:
        return None
    body = _inflate(data, offset, size)
    if body is None:
        return None
    if kind in PACK_TYPES:
        return PACK_TYPES[kind], body
    if base is None:
        return None
    patched = _apply_delta(base[1], body)
    return (base[0], patched) if patched is not None else None


def _inflate(data: mmap.mmap, offset: int, size: int) -> bytes | None:
    inflater = zlib.decompressobj()
    out = bytearray()
    position = offset
    while len(out) < size and not inflater.eof:
        chunk = data[position:position + 65536]
        if not chunk:
            break
        position += len(chunk)
        out += inflater.decompress(chunk, size + 1 - len(out))
        if inflater.unconsumed_tail:
            break
    return bytes(out) if len(out) == size else None


def _varint(delta: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = delta[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _apply_delta(base: bytes, delta: bytes) -> bytes | None:
    source_size, i = _varint(delta, 0)
    target_size, i = _varint(delta, i)
    if source_size != len(base) or target_size > LOOSE_OBJECT:
        return None
    out = bytearray()
    while i < len(delta):
        op = delta[i]
        i += 1
        if op & 0x80:  # copy from the base
            offset = size = 0
            for bit in range(4):
                if op & (1 << bit):
                    offset |= delta[i] << (8 * bit)
                    i += 1
            for bit in range(3):
                if op & (1 << (4 + bit)):
                    size |= delta[i] << (8 * bit)
                    i += 1
            size = size or 0x10000
            if offset + size > len(base):
                return None
            out += base[offset:offset + size]
        elif op:  # insert literal bytes
            out += delta[i:i + op]
            i += op
        else:
            return None
    return bytes(out) if len(out) == target_size else None


def _tree_entry(tree: bytes, name: bytes) -> tuple[bytes, str] | None:
    i = 0
    while i < len(tree):
        space = tree.find(b" ", i)
        nul = tree.find(b"\0", space)
        if space < 0 or nul < 0 or nul + 21 > len(tree):
            return None
        if tree[space + 1:nul] == name:
            return tree[i:space], tree[nul + 1:nul + 21].hex()
        i = nul + 21
    return None


def blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 -- git's object name


def find_git_dir(folder: Path) -> GitDir | None:
    """The repository that `folder` (resolved) is in, found by walking up to a `.git`."""
    for top in [folder, *folder.parents]:
        dot = top / ".git"
        try:
            mode = os.lstat(dot).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            return _checked(top, dot, dot)
        if stat.S_ISREG(mode):
            return _linked(top, dot)
        return None  # a symlinked .git: not followed
    return None


def _checked(top: Path, git_dir: Path, common: Path) -> GitDir | None:
    if read_bounded(git_dir / "HEAD") is None or not _real_dir(common / "objects"):
        return None
    return GitDir(top, git_dir, common)


def _linked(top: Path, dot: Path) -> GitDir | None:
    """A `.git` file: follow it only where git itself would find this checkout named back."""
    text = (_text(dot) or "").strip()
    if not text.startswith("gitdir:"):
        return None
    target = Path(text[len("gitdir:"):].strip())
    git_dir = Path(os.path.normpath(target if target.is_absolute() else top / target))
    if not _real_dir(git_dir):
        return None
    back = (_text(git_dir / "gitdir") or "").strip()  # a linked worktree names its .git file
    if back:
        if Path(os.path.normpath(back)) != dot:
            return None
        common_text = (_text(git_dir / "commondir") or "").strip()
        if not common_text:
            return None
        common = Path(os.path.normpath(git_dir / common_text))
        if git_dir.parent != common / "worktrees":
            return None
        return _checked(top, git_dir, common)
    # A submodule: its git dir sits in an enclosing checkout's .git/modules.
    if any(git_dir.is_relative_to(parent / ".git" / "modules") for parent in top.parents):
        return _checked(top, git_dir, git_dir)
    return None
