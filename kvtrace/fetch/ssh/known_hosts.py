"""known_hosts as OpenSSH reads it, and accept-new writes as OpenSSH's would.

Read once, linearly, within bounds: a known_hosts file must be a regular file (a FIFO or a
device is refused without blocking) of at most MAX_BYTES; each line is split and checked on its
own (paramiko's loader raised on the first line it could not decode, so one odd line about an
unrelated host broke every scan, and it added entries one by one, each add scanning every entry
before it: 10,000 lines took 19 s). Keys are decoded only for the lines that match the host.

Host patterns follow OpenSSH's match_hostname: a comma-separated list of patterns with `*` and
`?` wildcards, compared case-insensitively; a negated pattern (`!host`) that matches makes the
whole line not match, whatever else in it does; `|1|salt|hash` is a hashed name
(HashKnownHosts); a host on a port other than 22 is written `[host]:port`.

Malformed lines and key types paramiko lacks are skipped with a note, `@cert-authority` lines
are accepted and not used (kvtrace does not verify host certificates; such a host must also
have a plain entry), and a key under `@revoked` is refused by name even when listed as known.
"""

from __future__ import annotations

import binascii
import hmac
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry

from kvtrace.fetch.ssh.options import Log

MAX_BYTES = 32 << 20  # ~250,000 hashed entries; OpenSSH has no bound, a hostile file must have one
MAX_NOTES = 20  # skipped lines named with -v; the rest counted


def _key_types() -> frozenset[str]:
    """The key type names paramiko can verify with."""
    names: set[str] = set()
    for name in ("RSAKey", "DSSKey", "ECDSAKey", "Ed25519Key"):
        cls = getattr(paramiko, name, None)
        if cls is not None:
            names.update(cls.identifiers())
    return frozenset(names)


KEY_TYPES = _key_types()


@dataclass(frozen=True)
class HostLine:
    """One usable entry: where it is, its host field, its key (not decoded yet)."""

    file: str
    number: int
    hosts: str
    key_type: str
    blob: bytes

    @property
    def where(self) -> str:
        return f"{self.file} line {self.number}"


@dataclass
class KnownHosts:
    entries: list[HostLine] = field(default_factory=list)
    revoked: dict[bytes, str] = field(default_factory=dict)  # key blob -> "file line N"
    notes: list[str] = field(default_factory=list)
    unusable: list[str] = field(default_factory=list)  # "FILE: why" for files present but not read
    skipped: int = 0

    def revoked_at(self, key: paramiko.PKey) -> str | None:
        return self.revoked.get(key.asbytes())

    def keys_for(self, name: str, log: Log) -> list[paramiko.PKey]:
        """The keys known for `name` (`host`, or `[host]:port` off port 22), revoked ones left
        out (so paramiko sees such a host as unknown and the policy refuses it by name)."""
        found: list[paramiko.PKey] = []
        for entry in self.entries:
            if entry.blob in self.revoked or not host_matches(name, entry.hosts):
                continue
            try:
                found.append(paramiko.PKey.from_type_string(entry.key_type, entry.blob))
            except Exception:  # noqa: BLE001 -- a blob that does not decode as its type: OpenSSH skips it too
                log(f"ssh: note: {entry.where}: skipped (the {entry.key_type} key does not decode)")
        return found


def read_bounded(path: str, limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; OSError (with strerror) otherwise.
    Opened non-blocking, so a FIFO in its place cannot stall the scan."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file")
        if info.st_size > limit:
            raise OSError(0, f"larger than {limit >> 20} MiB")
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:  # grew while read
            raise OSError(0, f"larger than {limit >> 20} MiB")
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_known_hosts(files: list[str], log: Log) -> KnownHosts:
    known = KnownHosts()
    for file in files:
        try:
            raw = read_bounded(file)
        except FileNotFoundError:
            continue
        except OSError as exc:
            why = exc.strerror or str(exc)
            known.unusable.append(f"{file}: {why}")
            log(f"ssh: cannot read known_hosts {file}: {why}; not used")
            continue
        for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
            _read_line(known, file, number, line.strip())
    for note in known.notes:
        log(f"ssh: note: {note}")
    if known.skipped > len(known.notes):
        log(f"ssh: note: ... and {known.skipped - len(known.notes)} more known_hosts lines skipped or not used")
    return known


def _read_line(known: KnownHosts, file: str, number: int, line: str) -> None:
    if not line or line.startswith("#"):
        return
    marker = ""
    if line.startswith("@"):
        marker, _, line = line.partition(" ")
        line = line.strip()
        if marker not in ("@revoked", "@cert-authority"):
            _note(known, f"{file} line {number}: unknown marker {marker[:40]!r} skipped")
            return
    fields = line.split(None, 3)
    if len(fields) < 3:
        _note(known, f"{file} line {number}: skipped (not a known_hosts entry: fewer than 3 fields)")
        return
    hosts, key_type, encoded = fields[:3]
    try:
        blob = binascii.a2b_base64(encoded)  # a key that is still not one is found when it is decoded
    except (binascii.Error, ValueError):
        _note(known, f"{file} line {number}: skipped (the key is not base64)")
        return
    if key_type not in KEY_TYPES:
        _note(known, f"{file} line {number}: skipped (key type {key_type[:40]!r} is one paramiko cannot use)")
        return
    if marker == "@revoked":
        known.revoked[blob] = f"{file} line {number}"
    elif marker == "@cert-authority":
        _note(known, f"{file} line {number}: @cert-authority not used (host certificates are not checked)")
    else:
        known.entries.append(HostLine(file, number, hosts, key_type, blob))


def _note(known: KnownHosts, text: str) -> None:
    known.skipped += 1
    if len(known.notes) < MAX_NOTES:  # a file of a million bad lines costs no million messages
        known.notes.append(text)


def host_matches(name: str, hosts: str) -> bool:
    """OpenSSH's match_hostname: does the host field of a line cover `name`?"""
    name = name.lower()
    if hosts.startswith("|1|"):
        return _hashed_matches(name, hosts)
    positive = False
    for pattern in hosts.split(","):
        negated = pattern.startswith("!")
        if negated:
            pattern = pattern[1:]
        if pattern and _glob_matches(name, pattern.lower()):
            if negated:
                return False  # a negated match anywhere: the line does not apply
            positive = True
    return positive


def _hashed_matches(name: str, field_text: str) -> bool:
    parts = field_text.split("|")
    if len(parts) != 4:
        return False
    try:
        salt, digest = binascii.a2b_base64(parts[2]), binascii.a2b_base64(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.digest(salt, name.encode(), "sha1"), digest)


def _glob_matches(name: str, pattern: str) -> bool:
    if "*" not in pattern and "?" not in pattern:
        return name == pattern
    return _glob(pattern).fullmatch(name) is not None


@lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.DOTALL)


def record_host_key(file: str, name: str, key: paramiko.PKey) -> None:
    """Append `name key` hashed (HashKnownHosts), writing the whole file anew and renaming it
    into place, so a crash or a concurrent reader never sees half a file. A symlinked
    known_hosts (dotfiles kept elsewhere) is written through: the link's target is replaced,
    the link stays."""
    path = Path(os.path.realpath(file))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        old = read_bounded(str(path))
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        old, mode = b"", 0o600
    if old and not old.endswith(b"\n"):
        old += b"\n"
    line = HostKeyEntry([paramiko.HostKeys.hash_host(name)], key).to_line()
    fd, tmp = tempfile.mkstemp(prefix=".known_hosts.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(old + line.encode())
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
