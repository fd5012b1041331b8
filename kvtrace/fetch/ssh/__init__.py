"""Fetch stage for `[user@]host:path`: read the `.py` files below a remote path over SSH.

Read-only by construction: one exec channel runs a CONSTANT command (script.py) that reads the
path, the size limit and the names to search for from its stdin, `find`s the files, reports each
one it must leave out in the stream itself and which files hold those names, then streams the
files kvtrace asks for (fetch/select.py: those the scan reads) back as ONE tar archive, unpacked
in memory by a bounded reader. When the server runs no commands (e.g. `ForceCommand internal-sftp`) or lacks
find/tar, the same walk is done over SFTP. Either way the result equals `fetch_local` of the
same tree: same relative paths, bytes and order, dot-dirs and __pycache__ pruned, symlinks never
followed out of the root.

Modules: options (SshOptions, Deadline; no paramiko), config (ssh_config via `ssh -G`),
known_hosts, connect (`open_connection`), script + stream + tarstream + exec_fetch (the exec
route), sftp_fetch, collect (what both routes gather).

Public API for other stages: `open_connection(target, options, log)` gives a verified
SshConnection (use it with `with`); `fetch_tree(conn, path, label, limits)` fetches through it;
`fetch_ssh` does both. Every failure is a RemoteError (or LimitExceeded) whose text is one line
naming the host; the whole fetch ends within `options.timeout`.
"""

from __future__ import annotations

import socket

import paramiko

from kvtrace.errors import KvtraceError, RemoteError
from kvtrace.fetch.ssh.collect import walk_order
from kvtrace.fetch.ssh.connect import SshConnection, open_connection, why
from kvtrace.fetch.ssh.options import DEFAULT_TIMEOUT, Deadline, Log, SshOptions
from kvtrace.fetch.select import Wanted, narrow
from kvtrace.model import FetchLimits, FetchResult
from kvtrace.target import SshTarget

__all__ = [
    "DEFAULT_TIMEOUT", "Deadline", "SshConnection", "SshOptions", "check_remote_path",
    "fetch_ssh", "fetch_tree", "open_connection", "remote_path", "walk_order",
]


def check_remote_path(path: str) -> None:
    """Control characters (newline above all) never reach the remote, in any form."""
    if not path.isprintable():
        raise RemoteError(f"remote path {path!r} contains control characters; refusing it")


def remote_path(path: str) -> str:
    # Relative paths are relative to the login directory for both exec and SFTP, which is
    # what a leading ~/ means (the path is data, so the remote shell never expands ~).
    if path in ("", "~", "~/"):
        return "."
    return path[2:] if path.startswith("~/") else path


def fetch_ssh(target: SshTarget, options: SshOptions, limits: FetchLimits, log: Log | None = None,
              wanted: Wanted | None = None) -> FetchResult:
    check_remote_path(target.path)
    with open_connection(target, options, log) as conn:
        return fetch_tree(conn, target.path, target.label, limits, wanted)


def fetch_tree(conn: SshConnection, path: str, label: str, limits: FetchLimits,
               wanted: Wanted | None = None) -> FetchResult:
    """Fetch the .py files below `path` through an open connection: exec + tar, else SFTP.
    With `wanted` (what a rules pack makes the scan read), only the files the scan reads are
    kept (kvtrace.fetch.select.narrow), and the exec route moves only those."""
    from kvtrace.fetch.ssh.exec_fetch import ExecFetch
    from kvtrace.fetch.ssh.sftp_fetch import SftpFetch

    check_remote_path(path)
    path = remote_path(path)
    shown = path if path.isprintable() else repr(path)
    try:
        result = ExecFetch(conn, label, path, shown, limits).run(wanted)
        if result is None:
            result = SftpFetch(conn, label, path, shown, limits).run()
            if wanted is not None:  # SFTP cannot search: every file was read, the same ones are kept
                result = narrow(result, wanted)
    except KvtraceError:
        if conn.deadline.expired:
            raise conn.deadline.error() from None
        raise
    except (TimeoutError, socket.timeout):
        conn.deadline.check()
        raise RemoteError(f"{conn.where}: timed out after {conn.options.read_timeout:g} s waiting for the remote") from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        conn.deadline.check()
        raise RemoteError(f"{conn.where}: connection lost while fetching ({why(exc)})") from exc
    received = conn.bytes_received()
    if received is not None:
        kept = sum(len(f.data) for f in result.files)
        conn.log(f"ssh: {received} bytes received from the server for {len(result.files)} files "
                 f"({kept} bytes) kept")
    return result
