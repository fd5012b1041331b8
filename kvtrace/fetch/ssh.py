"""Fetch stage for `[user@]host:path`: read the `.py` files below a remote path over SSH.

Read-only by construction: one exec channel runs a FIXED POSIX-sh script (the path and the
size limits are passed as shell-quoted positional arguments, never spliced into the script)
that `find`s the files and streams them back as ONE tar archive; it is unpacked in memory.
When the server runs no commands (e.g. `ForceCommand internal-sftp`) or lacks find/tar, the
same walk is done over SFTP. Either way the result equals `fetch_local` of the same tree:
same relative paths, bytes and order, dot-dirs and __pycache__ pruned, symlinks never
followed out of the root (a `.py` link to a fetched file inside the root is kept, as locally).

Known differences from the local fetcher, both rare: a file name that is not UTF-8 is skipped
with a note (locally it is kept with surrogate escapes); a `.py` symlink is resolved against the
fetched files only, so one pointing at a non-.py file, into a pruned dir or through a directory
symlink is skipped (shown with --verbose).

Every failure is a RemoteError (or LimitExceeded) whose text is one line naming the host.
"""

from __future__ import annotations

import getpass
import logging
import os
import posixpath
import re
import shlex
import socket
import stat
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.sftp import CMD_CLOSE, CMD_HANDLE, CMD_NAME, CMD_OPENDIR, CMD_READDIR

from kvtrace.errors import KvtraceError, LimitExceeded, RemoteError
from kvtrace.fetch.local import Budget, make_source_file, oversized_file
from kvtrace.model import FetchLimits, FetchResult, SourceFile
from kvtrace.target import SshTarget, parse_authority

Log = Callable[[str], None]


@dataclass
class SshOptions:
    identity_files: list[str] = field(default_factory=list)  # -i KEY, tried before config keys
    ssh_config: str | None = None  # default ~/.ssh/config (if it exists)
    known_hosts: str | None = None  # default: ssh config UserKnownHostsFile or ~/.ssh/known_hosts
    accept_new_host_key: bool = False  # OpenSSH accept-new: record an unknown key, never a changed one
    connect_timeout: float = 10
    read_timeout: float = 60


def fetch_ssh(
    target: SshTarget,
    options: SshOptions,
    limits: FetchLimits,
    log: Log | None = None,
    after_fetch: Callable[[paramiko.SSHClient, FetchResult], None] | None = None,
) -> FetchResult:
    """`after_fetch` runs on the still-open, verified connection once the files are read (the
    fleet's --metrics reads a page through it); it must not raise."""
    say: Log = log or (lambda _msg: None)
    _quiet_paramiko()
    config = _load_config(options)
    host = _resolve_host(target.host, target.user, target.port, config, options)
    for key in options.identity_files:
        if not os.path.isfile(os.path.expanduser(key)):
            raise RemoteError(f"{host.where}: identity file {key}: no such file")
    say(f"ssh: {target.label} -> {host.where}" + (f" via ProxyJump {host.jump}" if host.jump else ""))
    clients: list[paramiko.SSHClient] = []
    try:
        client = _open_client(host, config, options, say, clients)
        path = _remote_path(target.path)
        try:
            fetch = _Fetch(target.label, host.where, path, limits, options.read_timeout, say)
            result = fetch.via_exec(client)
            if result is None:
                result = fetch.via_sftp(client)
            if after_fetch is not None:
                after_fetch(client, result)
        except KvtraceError:
            raise
        except (TimeoutError, socket.timeout):
            raise RemoteError(
                f"{host.where}: timed out after {options.read_timeout:g} s waiting for the remote"
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise RemoteError(f"{host.where}: connection lost while fetching ({_why(exc)})") from exc
        return result
    finally:
        for c in reversed(clients):
            c.close()


# --- configuration -------------------------------------------------------------------------


@dataclass
class _Host:
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


def _quiet_paramiko() -> None:
    # paramiko logs a full traceback (e.g. on "Error reading SSH protocol banner") from its
    # transport thread; errors are reported as one RemoteError line instead.
    logger = logging.getLogger("paramiko")
    logger.setLevel(logging.CRITICAL + 10)
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())


def _load_config(options: SshOptions) -> paramiko.SSHConfig:
    if options.ssh_config is not None:
        path = Path(options.ssh_config).expanduser()
        if not path.exists() or path.is_dir():  # /dev/null is fine: `ssh -F /dev/null`
            raise RemoteError(f"ssh config {options.ssh_config}: no such file")
    else:
        path = Path("~/.ssh/config").expanduser()
        if not path.is_file():
            return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except (OSError, ValueError, paramiko.ConfigParseError) as exc:
        raise RemoteError(f"ssh config {path}: {exc}") from None


def _resolve_host(
    alias: str,
    user: str | None,
    port: int | None,
    config: paramiko.SSHConfig,
    options: SshOptions,
) -> _Host:
    """Apply ~/.ssh/config to `alias`; explicit user/port in the target win, as with ssh."""
    c = config.lookup(alias)
    hostname = c.get("hostname", alias)
    label = alias
    try:
        port = port or int(c.get("port", 22))
    except ValueError:
        raise RemoteError(f"{label}: bad Port {c.get('port')!r} in ssh config") from None
    proxy_command = c.get("proxycommand")
    if proxy_command and proxy_command.lower() != "none":
        raise RemoteError(f"{label}: ProxyCommand in ssh config is not supported; use ProxyJump")
    jump = c.get("proxyjump")
    # Like ssh, missing IdentityFile entries from the config are ignored (-i ones are checked).
    config_keys = [os.path.expanduser(k) for k in c.get("identityfile", [])]
    keys = [os.path.expanduser(k) for k in options.identity_files]
    keys += [k for k in config_keys if os.path.isfile(k) and k not in keys]
    if options.known_hosts is not None:
        known = [os.path.expanduser(options.known_hosts)]
    else:
        user_files = c.get("userknownhostsfile", "~/.ssh/known_hosts").split()
        known = [os.path.expanduser(k) for k in user_files] + ["/etc/ssh/ssh_known_hosts"]
    strict = c.get("stricthostkeychecking", "").lower()
    return _Host(
        alias=alias,
        hostname=hostname,
        port=port,
        user=user or c.get("user") or getpass.getuser(),
        identity_files=keys,
        identities_only=c.get("identitiesonly", "no").lower() == "yes",
        jump=None if jump is None or jump.lower() == "none" else jump,
        known_hosts=known,
        # ssh's accept-new, and "no" read as accept-new: a changed key is refused regardless.
        accept_new=options.accept_new_host_key or strict in ("accept-new", "no", "off"),
    )


# --- connecting ----------------------------------------------------------------------------


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only when known_hosts has no entry at all for the host."""

    def __init__(self, host: _Host, log: Log) -> None:
        self.host = host
        self.log = log

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        kind, fp = key.get_name(), key.fingerprint
        file = self.host.known_hosts[0]
        if not self.host.accept_new:
            port = "" if self.host.port == 22 else f"-p {self.host.port} "
            raise RemoteError(
                f"{self.host.where}: unknown host key {kind} {fp} (not in {file}); "
                f"if that fingerprint is right, trust it with `ssh-keyscan {port}"
                f"{self.host.hostname} >> {file}` or rerun with --accept-new-host-key"
            )
        try:
            _append_known_host(file, hostname, key)
        except OSError as exc:
            raise RemoteError(f"{self.host.where}: cannot record the host key in {file}: {_why(exc)}") from None
        self.log(f"ssh: new host key {kind} {fp} for {hostname} added to {file}")


def _append_known_host(file: str, name: str, key: paramiko.PKey) -> None:
    path = Path(file)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    prefix = ""
    if path.is_file() and path.stat().st_size:
        with open(path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            prefix = "" if fh.read(1) == b"\n" else "\n"
    with open(path, "a") as fh:
        fh.write(f"{prefix}{name} {key.get_name()} {key.get_base64()}\n")


def _open_client(
    host: _Host,
    config: paramiko.SSHConfig,
    options: SshOptions,
    log: Log,
    clients: list[paramiko.SSHClient],
) -> paramiko.SSHClient:
    """Connect (through one ProxyJump host if configured); every client opened is appended to
    `clients` so the caller closes them all."""
    if host.jump is None:
        return _connect(host, options, log, clients, sock=None)
    hops = host.jump.split(",")
    if len(hops) > 1:
        raise RemoteError(f"{host.where}: ProxyJump {host.jump}: only one jump host is supported")
    spec = hops[0].strip()
    spec = spec[6:] if spec.lower().startswith("ssh://") else spec
    try:
        juser, jalias, jport = parse_authority(spec)
    except ValueError as exc:
        raise RemoteError(f"{host.where}: bad ProxyJump {host.jump!r}: {exc}") from None
    jump = _resolve_host(jalias, juser, jport, config, options)
    if jump.jump is not None:
        raise RemoteError(f"{jump.where}: ProxyJump chains are not supported (jump host has its own ProxyJump)")
    jump_client = _connect(jump, options, log, clients, sock=None)
    t0 = time.monotonic()
    transport = jump_client.get_transport()
    assert transport is not None
    try:
        channel = transport.open_channel(
            "direct-tcpip",
            (host.hostname, host.port),
            ("127.0.0.1", 0),
            timeout=options.connect_timeout,
        )
    except paramiko.ChannelException as exc:
        raise RemoteError(
            f"{jump.where}: jump host cannot reach {host.hostname}:{host.port} ({exc.text})"
        ) from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise RemoteError(
            f"{jump.where}: jump host cannot reach {host.hostname}:{host.port} ({_why(exc)})"
        ) from None
    log(f"ssh: tunnel {jump.where} -> {host.hostname}:{host.port} in {_ms(t0)}")
    return _connect(host, options, log, clients, sock=channel)


def _connect(
    host: _Host,
    options: SshOptions,
    log: Log,
    clients: list[paramiko.SSHClient],
    sock: socket.socket | paramiko.Channel | None,
) -> paramiko.SSHClient:
    t0 = time.monotonic()
    if sock is None:
        sock = _tcp_connect(host, options.connect_timeout)
        log(f"ssh: tcp connect {host.hostname}:{host.port} in {_ms(t0)}")
    client = paramiko.SSHClient()
    clients.append(client)
    for file in host.known_hosts:
        if os.path.isfile(file):
            try:
                client.load_system_host_keys(file)
            except (OSError, paramiko.SSHException, ValueError) as exc:
                raise RemoteError(f"{host.where}: cannot read known_hosts {file}: {_why(exc)}") from None
    client.set_missing_host_key_policy(_HostKeyPolicy(host, log))
    t1 = time.monotonic()
    try:
        client.connect(
            host.hostname,
            host.port,
            username=host.user,
            key_filename=host.identity_files or None,
            allow_agent=not host.identities_only,
            look_for_keys=not host.identities_only,
            sock=sock,
            # The banner wait must end first so its clearer error wins over "no session".
            timeout=2 * options.connect_timeout,
            banner_timeout=options.connect_timeout,
            auth_timeout=options.read_timeout,
            channel_timeout=options.read_timeout,
        )
    except KvtraceError:
        sock.close()
        raise
    except Exception as exc:  # noqa: BLE001 -- every paramiko failure becomes one clear line
        sock.close()
        raise _connect_error(exc, host, options) from exc
    key = client.get_transport().get_remote_server_key()  # type: ignore[union-attr]
    log(f"ssh: host key {key.get_name()} {key.fingerprint} ok; authenticated as {host.user} in {_ms(t1)}")
    return client


def _tcp_connect(host: _Host, timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection((host.hostname, host.port), timeout=timeout)
    except socket.gaierror as exc:
        raise RemoteError(f"{host.where}: cannot resolve host name {host.hostname!r} ({exc.strerror})") from None
    except ConnectionRefusedError:
        raise RemoteError(f"{host.where}: connection refused (no SSH server on port {host.port})") from None
    except TimeoutError:
        raise RemoteError(f"{host.where}: timed out after {timeout:g} s connecting") from None
    except OSError as exc:
        raise RemoteError(f"{host.where}: cannot connect ({_why(exc)})") from None
    # paramiko leaves Nagle on; with it off connect+auth and SFTP reads are ~3x faster.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _connect_error(exc: BaseException, host: _Host, options: SshOptions) -> RemoteError:
    where, t = host.where, options.connect_timeout
    cause = exc.__context__  # paramiko re-raises the banner reader's error without chaining
    if isinstance(exc, paramiko.BadHostKeyException):
        return RemoteError(
            f"{where}: HOST KEY CHANGED: the server sent {exc.key.get_name()} "
            f"{exc.key.fingerprint} but known_hosts has {exc.expected_key.get_name()} "
            f"{exc.expected_key.fingerprint} for {host.known_hosts_name}; refusing to connect "
            f"(if the change is expected: ssh-keygen -R '{host.known_hosts_name}' "
            f"-f {host.known_hosts[0]})"
        )
    if isinstance(exc, paramiko.PasswordRequiredException):
        return RemoteError(f"{where}: the identity file is passphrase-protected; load it with ssh-add first")
    if isinstance(exc, paramiko.BadAuthenticationType):
        return RemoteError(
            f"{where}: the server accepts only {', '.join(exc.allowed_types)}, not public keys"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return RemoteError(f"{where}: authentication failed for user {host.user!r} ({_tried(host)})")
    if isinstance(exc, paramiko.SSHException):
        msg = str(exc)
        if msg.startswith("No authentication methods available"):
            return RemoteError(
                f"{where}: no key to log in with: pass -i KEY, set IdentityFile in ssh config "
                "or start ssh-agent"
            )
        if msg.startswith("Error reading SSH protocol banner"):
            if isinstance(cause, TimeoutError):
                return RemoteError(f"{where}: timed out after {t:g} s waiting for the SSH banner")
            return RemoteError(f"{where}: not an SSH server (connection closed before the SSH banner)")
        if msg.startswith(("Indecipherable protocol version", "Invalid SSH banner")) or isinstance(
            exc, paramiko.IncompatiblePeer
        ):
            return RemoteError(f"{where}: not an SSH server ({msg[:120]})")
        if msg.startswith(("No existing session", "Negotiation timed out")):
            return RemoteError(f"{where}: timed out after {2 * t:g} s during the SSH handshake")
        return RemoteError(f"{where}: SSH error: {msg[:200]}")
    if isinstance(exc, (EOFError, ConnectionResetError)):
        return RemoteError(f"{where}: the server closed the connection during the SSH handshake")
    if isinstance(exc, TimeoutError):
        return RemoteError(f"{where}: timed out during the SSH handshake")
    if isinstance(exc, OSError):
        return RemoteError(f"{where}: {_why(exc)}")
    return RemoteError(f"{where}: {type(exc).__name__}: {exc}")


def _tried(host: _Host) -> str:
    tried = [f"key {k}" for k in host.identity_files]
    if not host.identities_only:
        tried += ["ssh-agent", "~/.ssh/id_*"]
    return "tried " + ", ".join(tried) if tried else "no keys to try"


# --- fetching ------------------------------------------------------------------------------

# The one command run remotely. POSIX sh, one line (csh and fish login shells pass it on
# intact), no backslashes outside printf formats. $1 = path, $2 = max file bytes, $3 = $2 + 1.
# Output: "KVTRACE1\0" pwd -P "\0", then "ls -l line\0name\0" per oversized file, "\0", then
# one tar archive of the kept .py files and .py symlinks (as links, never followed).
# Exit 3: missing path (ls says why on stderr), 4: cannot enter/read it, 5: not a dir or .py
# file, 6: no find/tar (use SFTP).
_PRUNE = '"(" -type d "(" -name ".*" -o -name __pycache__ ")" -prune ")" -o'
_SCRIPT = (
    "command -v find >/dev/null && command -v tar >/dev/null || exit 6; r=$1; "
    'if [ -d "$r" ]; then cd -- "$r" 2>/dev/null && [ -r . ] || exit 4; s=.; m=1; h=; '
    'elif [ -f "$r" ]; then case $r in *.py) ;; *) exit 5;; esac; '
    'case $r in */*) d=${r%/*}; s=./${r##*/};; *) d=.; s=./$r;; esac; '
    'cd -- "${d:-/}" 2>/dev/null || exit 4; m=0; h=-h; '
    'elif [ -e "$r" ]; then exit 5; else ls -d -- "$r" >/dev/null; exit 3; fi; '
    "printf 'KVTRACE1\\0%s\\0' \"$(pwd -P)\"; "
    f'find -H "$s" -mindepth $m {_PRUNE} -type f -name "*.py" -size +"$2"c '
    "-exec sh -c 'for f; do printf \"%s\\0%s\\0\" \"$(ls -lnLd -- \"$f\")\" \"$f\"; done' sh {} +; "
    "printf '\\0'; "
    f'find -H "$s" -mindepth $m {_PRUNE} "(" -type l -o -type f -size -"$3"c ")" -name "*.py" '
    "-print0 | tar $h --null --no-recursion -T - -cf -"
)
_MARKER = b"KVTRACE1\0"
_TAR_CANNOT = re.compile(r"^tar: (.+): Cannot (?:open|read): (.+)$")


def _remote_path(path: str) -> str:
    # Relative paths are relative to the login directory for both exec and SFTP, which is
    # what a leading ~/ means (the path is quoted, so the remote shell never expands ~).
    if path in ("", "~", "~/"):
        return "."
    return path[2:] if path.startswith("~/") else path


class _Fetch:
    def __init__(
        self, label: str, where: str, path: str, limits: FetchLimits, read_timeout: float, log: Log
    ) -> None:
        self.label = label
        self.where = where
        self.path = path
        self.shown = path if path.isprintable() else repr(path)  # error text stays one line
        self.limits = limits
        self.read_timeout = read_timeout
        self.log = log

    # -- exec + tar -------------------------------------------------------------------------

    def via_exec(self, client: paramiko.SSHClient) -> FetchResult | None:
        """One round trip; None when the server cannot run it (the caller then uses SFTP)."""
        t0 = time.monotonic()
        limits = self.limits
        args = [self.path, str(limits.max_file_bytes), str(limits.max_file_bytes + 1)]
        command = " ".join(["sh", "-c", shlex.quote(_SCRIPT), "kvtrace", *map(shlex.quote, args)])
        transport = client.get_transport()
        assert transport is not None
        chan = transport.open_session(timeout=self.read_timeout)
        try:
            chan.settimeout(self.read_timeout)
            try:
                chan.exec_command(command)
            except paramiko.SSHException as exc:
                self.log(f"ssh: exec refused ({exc}); using SFTP")
                return None
            chan.shutdown_write()
            # Headers, padding and .py symlinks ride on top of the file bytes; anything far
            # beyond the byte budget is cut off without reading it all.
            cap = limits.max_total_bytes + 2048 * (limits.max_files + 1) + (1 << 20)
            stream = _ChannelStream(chan, cap, self)
            if not stream.skip_to(_MARKER, within=1 << 16):
                if not stream.eof:  # some other program answering at length: not our script
                    self.log("ssh: exec gave no kvtrace stream; using SFTP")
                    return None
                status = self._exit_status(chan)
                err = stream.stderr_text()
                self._raise_for_status(status, err)
                self.log(f"ssh: exec gave no kvtrace stream (exit {status}; {_first_line(err)}); using SFTP")
                return None
            root_real = stream.token().decode("utf-8", "surrogateescape")
            oversize: dict[str, int | None] = {}
            notes: list[str] = []
            while True:
                ls_line = stream.token()
                if not ls_line:
                    break
                name = _rel(stream.token().decode("utf-8", "surrogateescape"))
                if name is not None and self._name_ok(name, notes):
                    oversize[name] = _ls_size(ls_line)
            collected = _Collected(self, root_real, notes)
            for name, size in oversize.items():
                collected.add(name, _too_large(name, size, limits))
            if not self._read_tar(stream, collected):
                return None
            status = self._exit_status(chan)
            if status == 6:
                self.log("ssh: no find/tar on the remote; using SFTP")
                return None
            for line in stream.stderr_text().splitlines():
                self._stderr_line(line, collected, notes)
            result = collected.finish()
            self.log(
                f"ssh: exec fetch: {len(result.files)} files, {stream.count} bytes streamed "
                f"in {_ms(t0)} (exit {status})"
            )
            return result
        finally:
            chan.close()

    def _read_tar(self, stream: _ChannelStream, collected: _Collected) -> bool:
        try:
            archive = tarfile.open(
                fileobj=stream, mode="r|", encoding="utf-8", errors="surrogateescape"  # type: ignore[call-overload]
            )
        except tarfile.ReadError as exc:
            self.log(f"ssh: no tar archive from the remote ({exc}); using SFTP")
            return False
        try:
            for member in archive:
                name = _rel(member.name)
                if name is None or not self._name_ok(name, collected.notes):
                    continue
                if member.isreg():
                    if member.size > self.limits.max_file_bytes:  # grew after find looked
                        collected.add(name, oversized_file(name, member.size, self.limits))
                        continue
                    fh = archive.extractfile(member)
                    assert fh is not None
                    collected.add(name, make_source_file(name, fh.read()))
                elif member.islnk():  # a second name for an inode tar already sent
                    collected.hardlinks[name] = _rel(member.linkname) or ""
                elif member.issym():
                    collected.symlinks[name] = member.linkname
                # Devices, fifos, dirs: never part of the tree.
        except tarfile.TarError as exc:
            raise RemoteError(f"{self.where}: the remote tar stream broke off ({exc})") from None
        return True

    def _stderr_line(self, line: str, collected: _Collected, notes: list[str]) -> None:
        m = _TAR_CANNOT.match(line)
        if m:
            name = _rel(m.group(1))
            reason = m.group(2)
            if name is not None and "No such file" not in reason:  # vanished since find: as locally
                collected.add(name, SourceFile(name, b"", "", status="unreadable", error=reason))
            return
        if line.startswith(("find:", "tar:")):
            notes.append(f"{self.where}: remote {line.strip()[:300]}")
        elif line.strip():
            self.log(f"ssh: remote stderr: {line.strip()[:300]}")

    def _exit_status(self, chan: paramiko.Channel) -> int:
        if not chan.status_event.wait(self.read_timeout):
            raise RemoteError(f"{self.where}: timed out after {self.read_timeout:g} s waiting for the remote command")
        return chan.recv_exit_status()

    def _raise_for_status(self, status: int, err: str) -> None:
        if status == 3:
            if "ermission denied" in err:
                raise RemoteError(f"{self.where}: {self.shown}: permission denied")
            raise RemoteError(f"{self.where}: {self.shown}: no such file or directory on the remote host")
        if status == 4:
            raise RemoteError(f"{self.where}: {self.shown}: permission denied")
        if status == 5:
            raise RemoteError(f"{self.where}: {self.shown}: not a directory or a .py file")

    def _name_ok(self, name: str, notes: list[str]) -> bool:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raw = name.encode("utf-8", "surrogateescape")
            notes.append(f"{self.where}: skipped {raw!r}: file name is not UTF-8")
            return False
        return True

    # -- SFTP fallback ----------------------------------------------------------------------

    def via_sftp(self, client: paramiko.SSHClient) -> FetchResult:
        t0 = time.monotonic()
        try:
            sftp = client.open_sftp()
        except (paramiko.SSHException, EOFError) as exc:
            raise RemoteError(
                f"{self.where}: the server runs neither the fetch command nor SFTP ({_why(exc)})"
            ) from None
        try:
            sftp.get_channel().settimeout(self.read_timeout)  # type: ignore[union-attr]
            result = self._sftp_walk(sftp)
        finally:
            sftp.close()
        self.log(f"ssh: sftp fetch: {len(result.files)} files in {_ms(t0)}")
        return result

    def _sftp_walk(self, sftp: paramiko.SFTPClient) -> FetchResult:
        try:
            top = sftp.stat(self.path)
        except FileNotFoundError:
            raise RemoteError(f"{self.where}: {self.shown}: no such file or directory on the remote host") from None
        except PermissionError:
            raise RemoteError(f"{self.where}: {self.shown}: permission denied") from None
        mode = top.st_mode or 0
        notes: list[str] = []
        if stat.S_ISREG(mode) and self.path.endswith(".py"):
            collected = _Collected(self, "", notes)
            name = posixpath.basename(self.path)
            sf = self._sftp_read(sftp, self.path, name, top.st_size)
            if sf is not None:
                collected.add(name, sf)
            return collected.finish()
        if not stat.S_ISDIR(mode):
            raise RemoteError(f"{self.where}: {self.shown}: not a directory or a .py file")
        collected = _Collected(self, sftp.normalize(self.path), notes)
        pending = [""]
        while pending:
            rel_dir = pending.pop()
            full_dir = posixpath.join(self.path, rel_dir) if rel_dir else self.path
            try:
                entries = _listdir_bytes(sftp, full_dir)
            except PermissionError:
                if not rel_dir:
                    raise RemoteError(f"{self.where}: {self.shown}: permission denied") from None
                notes.append(f"{self.where}: cannot list {rel_dir}/: permission denied")
                continue
            for raw, attr in entries:
                try:
                    name = raw.decode("utf-8")
                except UnicodeDecodeError:
                    shown = posixpath.join(rel_dir.encode(), raw) if rel_dir else raw
                    notes.append(f"{self.where}: skipped {shown!r}: file name is not UTF-8")
                    continue
                rel = posixpath.join(rel_dir, name) if rel_dir else name
                mode = attr.st_mode or 0
                if stat.S_ISDIR(mode):  # lstat attributes: a link to a dir is S_ISLNK, not walked
                    if not name.startswith(".") and name != "__pycache__":
                        pending.append(rel)
                elif not name.endswith(".py"):
                    continue
                elif stat.S_ISREG(mode):
                    sf = self._sftp_read(sftp, posixpath.join(full_dir, name), rel, attr.st_size)
                    if sf is not None:
                        collected.add(rel, sf)
                elif stat.S_ISLNK(mode):
                    try:
                        collected.symlinks[rel] = sftp.readlink(posixpath.join(full_dir, name)) or ""
                    except OSError as exc:
                        self.log(f"ssh: cannot read symlink {rel}: {_why(exc)}")
        return collected.finish()

    def _sftp_read(
        self, sftp: paramiko.SFTPClient, full: str, rel: str, size: int | None
    ) -> SourceFile | None:
        """The file, too-large or unreadable; None when it vanished since the listing."""
        limit = self.limits.max_file_bytes
        if size is not None and size > limit:
            return oversized_file(rel, size, self.limits)
        try:
            with sftp.open(full, "rb") as fh:
                if size:
                    fh.prefetch(size)
                data = fh.read(limit + 1)
                if len(data) > limit:  # grew since it was listed
                    return oversized_file(rel, fh.stat().st_size or len(data), self.limits)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if isinstance(exc, TimeoutError):
                raise
            return SourceFile(rel, b"", "", status="unreadable", error=exc.strerror or str(exc))
        return make_source_file(rel, data)


class _Collected:
    """Files gathered by either route, then links resolved, budget applied and sorted."""

    def __init__(self, fetch: _Fetch, root_real: str, notes: list[str]) -> None:
        self.fetch = fetch
        self.root_real = root_real
        self.notes = notes
        self.files: dict[str, SourceFile] = {}
        self.symlinks: dict[str, str] = {}
        self.hardlinks: dict[str, str] = {}
        self.budget = Budget(fetch.limits, fetch.label)

    def add(self, rel: str, sf: SourceFile) -> None:
        if sf.status == "ok":
            self.budget.take(len(sf.data))
        elif sf.status == "too-large":
            self.budget.take(0)  # counted as a file, not read: as fetch_local does
        self.files[rel] = sf

    def finish(self) -> FetchResult:
        for rel, target in self.hardlinks.items():
            if target in self.files:
                self.add(rel, _renamed(self.files[target], rel))
        for rel in list(self.symlinks):
            resolved = self._follow(rel)
            if resolved in self.files:
                self.add(rel, _renamed(self.files[resolved], rel))
            else:
                why = "a loop" if resolved == "" else "outside the root or not a fetched .py file"
                self.fetch.log(f"ssh: symlink {rel} -> {self.symlinks[rel]} not followed ({why})")
        files = sorted(self.files.values(), key=lambda f: walk_order(f.path))
        for note in self.notes:
            self.fetch.log(f"ssh: note: {note}")
        return FetchResult(target=self.fetch.label, files=files, notes=self.notes)

    def _follow(self, rel: str) -> str | None:
        """Resolve a .py symlink lexically among the fetched names: the relative path it ends
        at, None when it leaves the root, "" on a loop. Never touches the remote."""
        current = rel
        for _ in range(40):  # the kernel's own limit on link chains
            link = self.symlinks.get(current)
            if link is None:
                return current
            if link.startswith("/"):
                root = self.root_real.rstrip("/")
                if not self.root_real or not link.startswith(root + "/"):
                    return None
                link_rel = link[len(root) + 1 :]
            else:
                link_rel = posixpath.join(posixpath.dirname(current), link)
            current = posixpath.normpath(link_rel)
            if current == ".." or current.startswith("../") or current.startswith("/"):
                return None
        return ""


class _ChannelStream:
    """File-like reader over an exec channel's stdout for tarfile's stream mode: counts bytes
    against a cap, and keeps stderr drained so the shared SSH window never stalls."""

    def __init__(self, chan: paramiko.Channel, cap: int, fetch: _Fetch) -> None:
        self.chan = chan
        self.cap = cap
        self.fetch = fetch
        self.buf = bytearray()
        self.eof = False
        self.count = 0
        self.stderr = bytearray()

    def _fill(self) -> None:
        try:
            data = self.chan.recv(1 << 16)
        except TimeoutError:
            raise RemoteError(
                f"{self.fetch.where}: timed out after {self.fetch.read_timeout:g} s reading from the remote"
            ) from None
        self._drain_stderr()
        if not data:
            self.eof = True
            return
        self.count += len(data)
        if self.count > self.cap:
            limits = self.fetch.limits
            raise LimitExceeded(
                f"{self.fetch.label}: more than {limits.max_total_bytes} bytes of .py files; "
                "point kvtrace at the disaggregation folder or raise --max-total-bytes"
            )
        self.buf += data

    def _drain_stderr(self, block: bool = False) -> None:
        while block or self.chan.recv_stderr_ready():
            chunk = self.chan.recv_stderr(1 << 16)
            if not chunk:
                return
            if len(self.stderr) < (1 << 20):  # keep the first MiB; the rest is only drained
                self.stderr += chunk

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            while not self.eof:
                self._fill()
            size = len(self.buf)
        if not self.buf and not self.eof:
            self._fill()
        out = bytes(self.buf[:size])
        del self.buf[:size]
        return out

    def token(self, limit: int = 1 << 16) -> bytes:
        """Bytes up to the next NUL (consumed, not returned); a missing NUL is a broken stream."""
        while True:
            end = self.buf.find(b"\0")
            if end != -1:
                out = bytes(self.buf[:end])
                del self.buf[: end + 1]
                return out
            if self.eof or len(self.buf) > limit:
                raise RemoteError(f"{self.fetch.where}: the remote fetch stream is malformed")
            self._fill()

    def skip_to(self, marker: bytes, within: int) -> bool:
        """Drop anything a login script printed before our marker; False if it never came."""
        while True:
            at = self.buf.find(marker)
            if at != -1:
                del self.buf[: at + len(marker)]
                return True
            if self.eof or len(self.buf) > within:
                return False
            self._fill()

    def stderr_text(self) -> str:
        self._drain_stderr(block=True)
        return self.stderr.decode("utf-8", "surrogateescape")


def _listdir_bytes(sftp: paramiko.SFTPClient, path: str) -> list[tuple[bytes, paramiko.SFTPAttributes]]:
    """SFTP READDIR keeping names as bytes. paramiko's listdir_attr decodes every name as UTF-8
    and so fails the whole directory on one bad name; this is its loop without the decode
    (it uses paramiko's private _request, stable since paramiko 1.x)."""
    kind, msg = sftp._request(CMD_OPENDIR, path)
    if kind != CMD_HANDLE:
        raise paramiko.SFTPError("Expected handle")
    handle = msg.get_binary()
    entries: list[tuple[bytes, paramiko.SFTPAttributes]] = []
    try:
        while True:
            try:
                kind, msg = sftp._request(CMD_READDIR, handle)
            except EOFError:  # end of directory
                break
            if kind != CMD_NAME:
                raise paramiko.SFTPError("Expected name response")
            for _ in range(msg.get_int()):
                name = msg.get_string()
                msg.get_string()  # the ls -l style "longname"
                attr = paramiko.SFTPAttributes._from_msg(msg)
                if name not in (b".", b".."):
                    entries.append((name, attr))
    finally:
        sftp._request(CMD_CLOSE, handle)
    entries.sort(key=lambda e: e[0])
    return entries


# --- small helpers -------------------------------------------------------------------------


def walk_order(path: str) -> tuple[tuple[int, str], ...]:
    """Sort key reproducing fetch_local's order: os.walk top-down with sorted names, i.e. a
    directory's files first, then each subdirectory in turn."""
    *dirs, name = path.split("/")
    return tuple((1, d) for d in dirs) + ((0, name),)


def _rel(name: str) -> str | None:
    """An archive name as a root-relative posix path, or None if it would leave the root."""
    name = posixpath.normpath(name)
    if name in (".", "..") or name.startswith(("/", "../")):
        return None
    return name


def _renamed(sf: SourceFile, path: str) -> SourceFile:
    return SourceFile(path, sf.data, sf.sha256, status=sf.status, error=sf.error)


def _too_large(name: str, size: int | None, limits: FetchLimits) -> SourceFile:
    if size is None:
        return SourceFile(name, b"", "", status="too-large",
                          error=f"over the per-file limit of {limits.max_file_bytes}")
    return oversized_file(name, size, limits)


def _ls_size(line: bytes) -> int | None:
    fields = line.split()
    try:
        return int(fields[4])  # ls -ln: mode links uid gid SIZE ...
    except (IndexError, ValueError):
        return None


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:200] if lines else "no stderr"


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _ms(t0: float) -> str:
    return f"{(time.monotonic() - t0) * 1000:.0f} ms"
