"""Turn the TARGET argument into a local path or an SSH location.

Accepted remote forms (everything else is a local path):

    [user@]host:path            scp style; an empty path means the login directory
    [user@]host:port:path       port given when the part after the host is all digits and
                                followed by another ':' (`host:2222` alone is refused: no path)
    [user@][v6addr]:[port:]path IPv6 in brackets
    ssh://[user@]host[:port]/path   URL style; `ssh://host/~/x` means x below the login directory

Never taken for a host: an existing local path, a Windows drive path (`C:\\x`, `C:/x`), anything
with a '/' or '\\' before the first ':' (`./a:b`, `/abs/a:b`), or a "host" that is not a plain
host name (so a file called `notes:v2` stays local when spelled `./notes:v2`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote

from kvtrace.errors import InputError


# The parsed targets are NamedTuples rather than frozen dataclasses, whose generated methods
# every run (a cached rescan's too) would pay to build.
class LocalTarget(NamedTuple):
    """A path on this machine, and the TARGET text as the user wrote it."""

    path: Path
    label: str


class SshTarget(NamedTuple):
    """A path on a host reached over SSH."""

    user: str | None
    host: str  # a host name, an IP address (IPv6 without brackets) or an ~/.ssh/config alias
    port: int | None
    path: str  # remote path exactly as given ("" is normalised to ".")
    label: str  # the TARGET text as the user wrote it

    @property
    def display(self) -> str:
        """`user@host:port` with only the parts that were given, IPv6 bracketed."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port is not None else ""
        return f"{user}{host}{port}"


# A DNS name, an IPv4 address or an ssh_config alias. Must not start with '-' (it would read
# as an option to ssh tools) or '.' (relative paths).
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?")
_USER = re.compile(r"[^/\\:\s]+")
_DRIVE = re.compile(r"[A-Za-z]:")


def parse_target(text: str) -> LocalTarget | SshTarget:
    if text == "":
        raise InputError("empty TARGET: give a local path or [user@]host:path")
    if text == "-":
        raise InputError("-: reading from stdin is not supported; give a local path or [user@]host:path")
    if text[:6].lower() == "ssh://":
        return _parse_url(text)
    if _looks_local(text):
        return LocalTarget(Path(text), text)
    remote = _parse_scp(text)
    if remote is None:
        _reject_malformed_remote(text)
        return LocalTarget(Path(text), text)
    return remote


def parse_authority(text: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` (host may be `[v6]`) -> (user, host, port); ValueError if malformed.

    Also used for ProxyJump values."""
    user, at, rest = text.rpartition("@")
    if at and not _USER.fullmatch(user):
        raise ValueError(f"bad user name in {text!r}")
    host, after = _split_host(rest)
    if host is None:
        raise ValueError(f"bad host in {text!r}")
    port: int | None = None
    if after:
        if not after.startswith(":") or not after[1:].isdigit():
            raise ValueError(f"bad port in {text!r}")
        port = _port(after[1:], text)
    return (user if at else None), host, port


def _looks_local(text: str) -> bool:
    if ":" not in text or os.path.lexists(text):
        return True
    head = text.split(":", 1)[0]
    if "/" in head or "\\" in head:  # scp's rule: a '/' before the first ':' means a local path
        return True
    return bool(_DRIVE.match(text))  # C:\x, C:/x, C:x -- a one-letter host is never meant


def _reject_malformed_remote(text: str) -> None:
    """A TARGET that is unmistakably meant as a remote one (a user part or a bracketed host
    before the first ':') but does not parse is an error, never a local path "user@:x"."""
    head = text.split(":", 1)[0]
    if "@" in head:
        user, _, host = head.rpartition("@")
        if not user:
            raise InputError(f"{text}: empty user name before '@'; expected [user@]host:path")
        if not host:
            raise InputError(f"{text}: no host between '@' and ':'; expected [user@]host:path")
        if not _USER.fullmatch(user):
            raise InputError(f"{text}: bad user name {user!r}; expected [user@]host:path")
        raise InputError(f"{text}: bad host name {host!r}; expected [user@]host:path")
    if text.startswith("["):
        raise InputError(f"{text}: not a valid [IPv6] host; expected [user@][address]:path")


def _split_host(text: str) -> tuple[str | None, str]:
    """Split a leading host (plain or [v6]) from `text`; return (host or None, the rest)."""
    if text.startswith("["):
        end = text.find("]")
        inner = text[1:end] if end > 0 else ""
        if not inner or not _IPV6.fullmatch(inner) or ":" not in inner:
            return None, text
        return inner, text[end + 1 :]
    m = _HOST.match(text)
    if not m:
        return None, text
    return m.group(0), text[m.end() :]


def _parse_scp(text: str) -> SshTarget | None:
    user: str | None = None
    rest = text
    at = text.split(":", 1)[0].rfind("@")  # the last '@' before the first ':' ends the user
    if at != -1:
        user, rest = text[:at], text[at + 1 :]
        if not _USER.fullmatch(user):
            return None
    host, after = _split_host(rest)
    if host is None or not after.startswith(":"):
        return None
    path = after[1:]
    port: int | None = None
    m = re.fullmatch(r"(\d+):(.*)", path, re.S)
    if m:
        port, path = _port(m.group(1), text), m.group(2)
    elif path.isdigit():
        # `host:2299` reads as the port the user meant, never as a folder named 2299 (which
        # scp would take, then fail far away with "port 22: connection refused").
        raise InputError(f"{text}: no path given ({path} reads as a port); write {text}:PATH, e.g. "
                         f"{text}:/opt/venv/lib/python3.11/site-packages/sglang (a folder named {path} in the "
                         f"login directory: {text[:len(text) - len(path)]}./{path})")
    return SshTarget(user, host, port, path or ".", text)


def _parse_url(text: str) -> SshTarget:
    rest = text[6:]
    authority, slash, path = rest.partition("/")
    try:
        user, host, port = parse_authority(authority)
    except ValueError:
        raise InputError(
            f"{text}: not a valid ssh:// target; expected ssh://[user@]host[:port]/path"
        ) from None
    path = unquote(slash + path)
    if port is not None and not slash:
        # As `host:2299` (a port and no path): a scan of the login directory is never what was meant.
        raise InputError(f"{text}: no path given (after port {port}); write {text}/PATH, e.g. "
                         f"{text}/opt/venv/lib/python3.11/site-packages/sglang")
    if path.startswith("/~"):  # ssh://host/~/x is x below the login directory (as git reads it)
        path = path[1:]
    return SshTarget(unquote(user) if user else None, host, port, path or ".", text)


def _port(digits: str, text: str) -> int:
    port = int(digits)
    if not 0 < port < 65536:
        raise InputError(f"{text}: port {digits} is out of range 1-65535")
    return port
