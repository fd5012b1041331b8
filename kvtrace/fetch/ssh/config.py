"""ssh_config, read as OpenSSH reads it.

Where the local `ssh` client exists, `ssh -G` is the resolver (Include, Match, Canonicalize*,
tokens: exactly what ssh would use). Without it, paramiko's SSHConfig reads the file with its
Include lines expanded here. Either way kvtrace runs nothing the config asks for: a config
with `Match exec` (which even `ssh -G` would run) or a ProxyCommand for the host is refused.
A config that ssh (or paramiko) cannot parse is an error, never half-read.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kvtrace.errors import RemoteError
from kvtrace.fetch.ssh.options import SshOptions

_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+)(.*?)\s*$")
_MATCH_EXEC = re.compile(r"(?:^|\s)!?exec(?:\s|=|$)", re.IGNORECASE)


@dataclass
class ResolvedHost:
    alias: str
    hostname: str
    port: int
    user: str
    identity_files: list[str]
    identities_only: bool
    jump: str | None
    known_hosts: list[str]  # files read; the first is the one accept-new writes to
    accept_new: bool

    @property
    def where(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        text = f"{self.user}@{host}:{self.port}"
        return text if self.alias == self.hostname else f"{self.alias} ({text})"

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


class SshConfig:
    """A checked config file (or none) that resolves host aliases."""

    def __init__(self, options: SshOptions) -> None:
        self.options = options
        self.path: Path | None = self._locate(options.ssh_config)
        self.text = self._expand(self.path, 0) if self.path is not None else ""
        self.ssh = shutil.which(options.ssh_binary) if options.ssh_binary else None

    @staticmethod
    def _locate(given: str | None) -> Path | None:
        if given is not None:
            path = Path(given).expanduser()
            if not path.exists() or path.is_dir():  # /dev/null is fine: `ssh -F /dev/null`
                raise RemoteError(f"ssh config {given}: no such file")
            return path
        default = Path("~/.ssh/config").expanduser()
        return default if default.is_file() else None

    def _expand(self, path: Path, depth: int) -> str:
        """The file's text with Include lines replaced by the files they name, checked line by
        line: what paramiko alone would silently skip or misread is an error here."""
        if depth > _MAX_INCLUDE_DEPTH:
            raise RemoteError(f"ssh config {path}: Include nested more than {_MAX_INCLUDE_DEPTH} deep")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise RemoteError(f"ssh config {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
        out: list[str] = []
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                out.append(line)
                continue
            m = _LINE.match(line)
            if m is None or (not m.group(2) and m.group(1).lower() not in ("host", "match")):
                raise RemoteError(f"ssh config {path} line {number}: cannot parse {_shown(stripped)}")
            keyword, value = m.group(1).lower(), m.group(2)
            if keyword == "match" and _MATCH_EXEC.search(value):
                raise RemoteError(
                    f"ssh config {path} line {number}: `Match exec` runs a local command; kvtrace "
                    "runs none (nor ProxyCommand): remove it or pass --ssh-config with a config without it"
                )
            if keyword == "include":
                for pattern in value.split():
                    pattern = os.path.expanduser(pattern.strip('"'))
                    if not os.path.isabs(pattern):  # relative to ~/.ssh, as ssh does for user configs
                        pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
                    for included in sorted(glob.glob(pattern)):
                        out.append(self._expand(Path(included), depth + 1))
                continue
            out.append(line)
        return "\n".join(out) + "\n"

    def resolve(self, alias: str, user: str | None, port: int | None) -> ResolvedHost:
        """Apply the config to `alias`; explicit user/port in the target win, as with ssh."""
        values = self._ssh_g(alias, user, port) if self.ssh else self._paramiko(alias)
        return self._host(alias, user, port, values)

    def _ssh_g(self, alias: str, user: str | None, port: int | None) -> dict[str, list[str]]:
        assert self.ssh is not None
        cmd = [self.ssh, "-G", "-F", str(self.path) if self.path is not None else os.devnull]
        if user:
            cmd += ["-l", user]
        if port:
            cmd += ["-p", str(port)]
        cmd += ["--", alias]
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=10, stdin=subprocess.DEVNULL,
                                  env={**os.environ, "LC_ALL": "C"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RemoteError(f"ssh config: `ssh -G {alias}` failed ({exc})") from None
        if proc.returncode != 0:
            first = next((ln for ln in proc.stderr.decode(errors="replace").splitlines() if ln.strip()), "")
            raise RemoteError(f"ssh config {self.path}: {_shown(first.strip()[:200]) or 'ssh -G failed'}")
        values: dict[str, list[str]] = {}
        for line in proc.stdout.decode(errors="replace").splitlines():
            key, _, value = line.partition(" ")
            values.setdefault(key.lower(), []).append(value)
        return values

    def _paramiko(self, alias: str) -> dict[str, list[str]]:
        import paramiko

        try:
            config = paramiko.SSHConfig.from_text(self.text)
            found = config.lookup(alias)
        except (ValueError, paramiko.ConfigParseError) as exc:
            raise RemoteError(f"ssh config {self.path}: {exc}") from None
        values: dict[str, list[str]] = {}
        for key, value in found.items():
            values[key] = list(value) if isinstance(value, list) else [str(value)]
        return values

    def _host(self, alias: str, user: str | None, port: int | None, c: dict[str, list[str]]) -> ResolvedHost:
        def one(key: str, default: str = "") -> str:
            return c.get(key, [default])[0]

        hostname = one("hostname", alias)
        try:
            port = port or int(one("port", "22"))
        except ValueError:
            raise RemoteError(f"{alias}: bad Port {one('port')!r} in ssh config") from None
        proxy_command = one("proxycommand")
        if proxy_command and proxy_command.lower() != "none":
            raise RemoteError(f"{alias}: ProxyCommand in ssh config is not supported (kvtrace runs no local commands); use ProxyJump")
        jump = one("proxyjump")
        # Like ssh, missing IdentityFile entries from the config are ignored (-i ones are checked).
        config_keys = [os.path.expanduser(k) for k in c.get("identityfile", [])]
        keys = [os.path.expanduser(k) for k in self.options.identity_files]
        keys += [k for k in config_keys if os.path.isfile(k) and k not in keys]
        if self.options.known_hosts is not None:
            known = [os.path.expanduser(self.options.known_hosts)]
        else:
            user_files = " ".join(c.get("userknownhostsfile", ["~/.ssh/known_hosts"])).split()
            global_files = " ".join(c.get("globalknownhostsfile", ["/etc/ssh/ssh_known_hosts"])).split()
            known = [os.path.expanduser(k) for k in user_files + global_files]
        strict = one("stricthostkeychecking").lower()
        return ResolvedHost(
            alias=alias,
            hostname=hostname,
            port=port,
            user=user or one("user") or getpass.getuser(),
            identity_files=keys,
            identities_only=one("identitiesonly", "no").lower() == "yes",
            jump=None if not jump or jump.lower() == "none" else jump,
            known_hosts=known,
            # ssh's accept-new, and "no" read as accept-new: a changed key is refused regardless.
            accept_new=self.options.accept_new_host_key or strict in ("accept-new", "no", "off", "false"),
        )


def _shown(text: str) -> str:
    return text if text.isprintable() else repr(text)
