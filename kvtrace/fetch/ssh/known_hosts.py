"""known_hosts as OpenSSH reads it, and accept-new writes as OpenSSH's would.

paramiko's own loader raises on the first line it cannot decode (so one odd line about an
unrelated host broke every scan) and knows no markers. Here each line is read on its own:
malformed ones and key types paramiko lacks are skipped with a note, `@cert-authority` lines
are accepted and not used (kvtrace does not verify host certificates; such a host must also have
a plain entry), and a key under `@revoked` is refused by name even when listed as known.
"""

from __future__ import annotations

import binascii
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from kvtrace.fetch.ssh.options import Log


@dataclass
class KnownHosts:
    keys: paramiko.HostKeys = field(default_factory=paramiko.HostKeys)
    revoked: dict[bytes, str] = field(default_factory=dict)  # key blob -> "file:line"
    notes: list[str] = field(default_factory=list)

    def revoked_at(self, key: paramiko.PKey) -> str | None:
        return self.revoked.get(key.asbytes())


def load_known_hosts(files: list[str], log: Log) -> KnownHosts:
    known = KnownHosts()
    for file in files:
        try:
            with open(file, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log(f"ssh: cannot read known_hosts {file}: {exc.strerror}; not used")
            continue
        for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
            _read_line(known, file, number, line.strip())
    for note in known.notes:
        log(f"ssh: note: {note}")
    return known


def _read_line(known: KnownHosts, file: str, number: int, line: str) -> None:
    if not line or line.startswith("#"):
        return
    marker = ""
    if line.startswith("@"):
        marker, _, line = line.partition(" ")
        line = line.strip()
        if marker not in ("@revoked", "@cert-authority"):
            known.notes.append(f"{file} line {number}: unknown marker {marker[:40]!r} skipped")
            return
    try:
        entry = HostKeyEntry.from_line(line, lineno=number)
    except (InvalidHostKey, binascii.Error, ValueError, TypeError, IndexError) as exc:
        entry, why = None, type(exc).__name__
    else:
        why = "not a known_hosts entry, or a key type paramiko cannot use"
    if entry is None or entry.key is None:
        known.notes.append(f"{file} line {number}: skipped ({why})")
        return
    if marker == "@revoked":
        known.revoked[entry.key.asbytes()] = f"{file} line {number}"
    elif marker == "@cert-authority":
        known.notes.append(f"{file} line {number}: @cert-authority not used (host certificates are not checked)")
    else:
        for name in entry.hostnames:
            known.keys.add(name, entry.key.get_name(), entry.key)


def drop_revoked(known: KnownHosts) -> None:
    """A revoked key listed as known too must not be trusted: drop it, so paramiko sees the host
    as unknown and the policy refuses it by name."""
    if not known.revoked:
        return
    cleaned = paramiko.HostKeys()
    for name in list(known.keys.keys()):
        for kind, key in known.keys[name].items():
            if key.asbytes() not in known.revoked:
                cleaned.add(name, kind, key)
    known.keys = cleaned


def record_host_key(file: str, name: str, key: paramiko.PKey) -> None:
    """Append `name key` hashed (HashKnownHosts), writing the whole file anew and renaming it
    into place, so a crash or a concurrent reader never sees half a file."""
    path = Path(file)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        old = path.read_bytes()
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
