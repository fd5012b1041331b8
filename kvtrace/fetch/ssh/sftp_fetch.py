"""The SFTP route, for servers that run no commands (`ForceCommand internal-sftp`) or lack
find/tar: the same walk as fetch_local, bounded by the same limits and the deadline. Names the
server sends with a `/` or equal to `.`/`..` are dropped, as the tar route drops them."""

from __future__ import annotations

import posixpath
import socket
import stat
import time

import paramiko
from paramiko.sftp import CMD_CLOSE, CMD_HANDLE, CMD_NAME, CMD_OPENDIR, CMD_READDIR

from kvtrace.errors import LimitExceeded, RemoteError
from kvtrace.fetch.local import make_source_file, oversized_file
from kvtrace.fetch.ssh.collect import Collected, Route
from kvtrace.fetch.ssh.connect import ms, why
from kvtrace.model import FetchResult, SourceFile

MAX_PATH = 4096  # PATH_MAX: a deeper tree is a hostile (or endless) one


class SftpFetch(Route):
    entries_seen = 0  # READDIR names over the whole walk, bounded
    _last_listing_had_dot = False

    def run(self) -> FetchResult:
        t0 = time.monotonic()
        try:
            sftp = self.conn.client.open_sftp()
        except (paramiko.SSHException, EOFError) as exc:
            self.conn.deadline.check()
            raise RemoteError(f"{self.where}: the server runs neither the fetch command nor SFTP ({why(exc)})") from None
        try:
            result = self._walk(sftp)
        except (TimeoutError, socket.timeout):
            self.conn.deadline.check()
            raise RemoteError(f"{self.where}: timed out after {self.conn.options.read_timeout:g} s waiting for the SFTP server") from None
        finally:
            sftp.close()
        self.conn.log(f"ssh: sftp fetch: {len(result.files)} files in {ms(t0)}")
        return result

    def _tick(self, sftp: paramiko.SFTPClient) -> None:
        """Before every request: the deadline, and each wait capped by what is left of it."""
        deadline = self.conn.deadline
        deadline.check()
        sftp.get_channel().settimeout(deadline.cap(self.conn.options.read_timeout))

    def _walk(self, sftp: paramiko.SFTPClient) -> FetchResult:
        self._tick(sftp)
        try:
            top = sftp.stat(self.path)
        except FileNotFoundError:
            raise RemoteError(f"{self.where}: {self.shown}: no such file or directory on the remote host") from None
        except PermissionError:
            raise RemoteError(f"{self.where}: {self.shown}: permission denied") from None
        mode = top.st_mode or 0
        if stat.S_ISREG(mode) and self.path.endswith(".py"):
            collected = Collected(self.label, self.limits, "", self.conn.log)
            name = posixpath.basename(self.path)
            sf = self._read(sftp, self.path, name, top.st_size)
            if sf is not None:
                collected.add(name, sf)
            return collected.finish()
        if not stat.S_ISDIR(mode):
            raise RemoteError(f"{self.where}: {self.shown}: not a directory or a .py file")
        self._tick(sftp)
        collected = Collected(self.label, self.limits, sftp.normalize(self.path), self.conn.log)
        notes = collected.notes
        pending = [""]
        while pending:
            rel_dir = pending.pop()
            full_dir = posixpath.join(self.path, rel_dir) if rel_dir else self.path
            try:
                entries = self._listdir(sftp, full_dir)
                if not entries and not self._last_listing_had_dot:
                    self._check_searchable(sftp, full_dir)
            except PermissionError:
                if not rel_dir:
                    raise RemoteError(f"{self.where}: {self.shown}: permission denied") from None
                notes.append(f"{self.where}: cannot list {rel_dir}/: permission denied")
                continue
            for raw, attr in entries:
                named = self._entry_name(raw, rel_dir, notes)
                if named is None:
                    continue
                name, rel = named
                mode = attr.st_mode or 0
                if stat.S_ISDIR(mode):  # lstat attributes: a link to a dir is S_ISLNK, not walked
                    if not name.startswith(".") and name != "__pycache__":
                        pending.append(rel)
                elif stat.S_ISLNK(mode):
                    self._link(sftp, collected, posixpath.join(full_dir, name), rel, name)
                elif not name.endswith(".py"):
                    continue
                elif stat.S_ISREG(mode):
                    sf = self._read(sftp, posixpath.join(full_dir, name), rel, attr.st_size)
                    if sf is not None:
                        collected.add(rel, sf)
        return collected.finish()

    def _entry_name(self, raw: bytes, rel_dir: str, notes: list[str]) -> tuple[str, str] | None:
        """A listed entry's name and its path below the root, or None (noted) when it cannot be one."""
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            shown = posixpath.join(rel_dir.encode(), raw) if rel_dir else raw
            notes.append(f"{self.where}: skipped {shown!r}: file name is not UTF-8")
            return None
        if "/" in name or name in ("", ".", ".."):  # a hostile server's path, not a name
            notes.append(f"{self.where}: skipped {name!r} in {rel_dir or '.'}/: not a plain file name")
            return None
        rel = posixpath.join(rel_dir, name) if rel_dir else name
        if len(rel) > MAX_PATH:
            notes.append(f"{self.where}: skipped {rel[:80]!r}...: path longer than {MAX_PATH}")
            return None
        return name, rel

    def _link(self, sftp: paramiko.SFTPClient, collected: Collected, full: str, rel: str, name: str) -> None:
        """A link to a folder (any name) is recorded with the folder's real path, a .py link
        with its text; collect.py decides, as fetch_local does, what each one is."""
        self._tick(sftp)
        try:
            is_dir = stat.S_ISDIR(sftp.stat(full).st_mode or 0)
        except (OSError, paramiko.SSHException):
            is_dir = False  # dangling or a loop: only a .py name can be missed
        try:
            if is_dir:
                self._tick(sftp)
                collected.link(collected.folder_links, rel, sftp.normalize(full))
            elif name.endswith(".py"):
                self._tick(sftp)
                collected.link(collected.symlinks, rel, sftp.readlink(full) or "")
        except OSError as exc:
            if isinstance(exc, (TimeoutError, socket.timeout)):
                raise
            self.conn.log(f"ssh: cannot read symlink {rel}: {why(exc)}")
            if name.endswith(".py") or is_dir:
                collected.add(rel, SourceFile(rel, b"", "", status="unreadable", error=f"symlink: {why(exc)}"))

    def _read(self, sftp: paramiko.SFTPClient, full: str, rel: str, size: int | None) -> SourceFile | None:
        """The file, too-large or unreadable; None when it vanished since the listing."""
        limit = self.limits.max_file_bytes
        if size is not None and size > limit:
            return oversized_file(rel, size, self.limits)
        self._tick(sftp)
        try:
            with sftp.open(full, "rb") as fh:
                chunks: list[bytes] = []
                got = 0
                while got <= limit:  # never more than the limit, whatever the server claims
                    self._tick(sftp)
                    chunk = fh.read(min(1 << 16, limit + 1 - got))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                if got > limit:  # grew since it was listed
                    return oversized_file(rel, got, self.limits)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if isinstance(exc, (TimeoutError, socket.timeout)):
                raise
            return SourceFile(rel, b"", "", status="unreadable", error=exc.strerror or str(exc))
        return make_source_file(rel, b"".join(chunks))

    def _check_searchable(self, sftp: paramiko.SFTPClient, path: str) -> None:
        """A folder the user may read but not enter (r without x) lists as empty over OpenSSH's
        sftp-server: it drops every name it cannot lstat, `.` too. Entering it says which: a
        PermissionError here is a folder not read, never an empty one."""
        self._tick(sftp)
        try:
            sftp.stat(posixpath.join(path, "."))
        except FileNotFoundError:
            pass  # gone since it was listed
        except PermissionError:
            raise
        except OSError as exc:
            if isinstance(exc, (TimeoutError, socket.timeout)):
                raise

    def _listdir(self, sftp: paramiko.SFTPClient, path: str) -> list[tuple[bytes, paramiko.SFTPAttributes]]:
        """SFTP READDIR keeping names as bytes. paramiko's listdir_attr decodes every name as
        UTF-8 and so fails the whole directory on one bad name; this is its loop without the
        decode (paramiko's private _request, stable since paramiko 1.x), bounded in entries."""
        bound = 20 * (self.limits.max_files + 1)
        self._tick(sftp)
        self._last_listing_had_dot = False
        kind, msg = sftp._request(CMD_OPENDIR, path)
        if kind != CMD_HANDLE:
            raise paramiko.SFTPError("Expected handle")
        handle = msg.get_binary()
        entries: list[tuple[bytes, paramiko.SFTPAttributes]] = []
        try:
            while True:
                self._tick(sftp)
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
                    if name == b".":
                        self._last_listing_had_dot = True
                    if name not in (b".", b".."):
                        entries.append((name, attr))
                    self.entries_seen += 1
                    if self.entries_seen > bound:
                        raise LimitExceeded(
                            f"{self.label}: the SFTP server listed more than {bound} entries "
                            "(20 x --max-files); stopped"
                        )
        finally:
            try:
                sftp._request(CMD_CLOSE, handle)
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the connection is gone: the error that ended the loop is the one to report
        entries.sort(key=lambda e: e[0])
        return entries
