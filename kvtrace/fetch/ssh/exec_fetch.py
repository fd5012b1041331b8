"""The exec route: run the constant command (script.py), feed it the path and limit on stdin,
read its records and its tar archive, bounded (stream.py, tarstream.py)."""

from __future__ import annotations

import time

import paramiko

from kvtrace.errors import LimitExceeded, RemoteError
from kvtrace.fetch.local import make_source_file, oversized_file
from kvtrace.fetch.ssh.collect import Collected, Route, relative, too_large, utf8_name
from kvtrace.fetch.ssh.connect import ms, shown as _shown
from kvtrace.fetch.ssh.script import COMMAND, MARKER, stdin_payload
from kvtrace.fetch.ssh.stream import ChannelStream
from kvtrace.fetch.ssh.tarstream import TarReader, member_over_limit
from kvtrace.model import FetchLimits, FetchResult, SourceFile

NOT_IN_ARCHIVE = "listed as readable, but tar could not read it"


def total_cap_message(label: str, limits: FetchLimits) -> str:
    return (f"{label}: more than {limits.max_total_bytes} bytes of .py files; "
            "point kvtrace at the disaggregation folder or raise --max-total-bytes")


class ExecFetch(Route):
    def run(self) -> FetchResult | None:
        """One round trip; None when the server cannot run it (the caller then uses SFTP)."""
        t0 = time.monotonic()
        conn, limits = self.conn, self.limits
        transport = conn.client.get_transport()
        assert transport is not None
        chan = transport.open_session(timeout=conn.deadline.cap(conn.options.read_timeout))
        try:
            try:
                chan.exec_command(COMMAND)
            except paramiko.SSHException as exc:
                conn.log(f"ssh: exec refused ({exc}); using SFTP")
                return None
            chan.settimeout(conn.deadline.cap(conn.options.read_timeout))
            try:
                chan.sendall(stdin_payload(self.path, limits.max_file_bytes))
                chan.shutdown_write()
            except OSError:
                # The remote ended the command before reading it (a server that runs no
                # commands answers and closes at once): what it sent says what to do next.
                conn.log("ssh: the remote command closed its input early")
            # Records, headers, padding and .py symlinks ride on top of the file bytes; anything
            # far beyond the byte budget is cut off without reading it all.
            cap = limits.max_total_bytes + 2048 * (limits.max_files + 1) + (1 << 20)
            stream = ChannelStream(chan, cap, total_cap_message(self.label, limits), self.where,
                                   conn.deadline, conn.options.read_timeout)
            if not stream.skip_to(MARKER, within=1 << 16):
                return self._no_stream(chan, stream)
            root_real = stream.token().decode("utf-8", "surrogateescape")
            collected = Collected(self.label, limits, root_real, conn.log)
            readable = self._records(stream, collected)
            self._archive(stream, collected)
            if stream.drain_to_eof():
                # Only logged: the records and the archive already say what happened.
                finished = chan.status_event.wait(conn.deadline.cap(2.0))
                status = str(chan.recv_exit_status()) if finished else "not sent"
            else:
                status = "not awaited"
                conn.log("ssh: the remote kept sending after its archive; the rest is ignored")
            for name in readable:  # hard links arrive as link members; finish() resolves them
                if name not in collected.files and name not in collected.hardlinks:
                    collected.add(name, SourceFile(name, b"", "", status="unreadable", error=NOT_IN_ARCHIVE))
            if stream.stderr:
                conn.log(f"ssh: remote stderr: {_shown(stream.stderr_first_line())}")
            result = collected.finish()
            conn.log(f"ssh: exec fetch: {len(result.files)} files, {stream.count} bytes streamed "
                     f"in {ms(t0)} (exit {status})")
            return result
        finally:
            chan.close()

    def _no_stream(self, chan: paramiko.Channel, stream: ChannelStream) -> None:
        if not stream.eof:  # some other program answering at length: not our script
            self.conn.log("ssh: exec gave no kvtrace stream; using SFTP")
            return None
        status = self._exit_status(chan)
        where, shown = self.where, self.shown
        if status == 3:
            raise RemoteError(f"{where}: {shown}: no such file or directory on the remote host")
        if status == 4:
            raise RemoteError(f"{where}: {shown}: permission denied")
        if status == 5:
            raise RemoteError(f"{where}: {shown}: not a directory or a .py file")
        why = "no find/tar there" if status == 6 else f"exit {status}; {_shown(stream.stderr_first_line())}"
        self.conn.log(f"ssh: exec gave no kvtrace stream ({why}); using SFTP")
        return None

    def _records(self, stream: ChannelStream, collected: Collected) -> list[str]:
        readable: list[str] = []
        seen = 0
        while True:
            kind = stream.token(limit=8)
            if kind == b"E":
                return readable
            seen += 1
            if seen > 4 * (self.limits.max_files + 1):  # D records too: bounded all the same
                raise RemoteError(f"{self.where}: the remote listed more than {4 * self.limits.max_files} entries; stopped")
            if kind == b"S":
                ls_line = stream.token()
                name = self._name(stream.token(), collected)
                if name is not None:
                    collected.add(name, too_large(name, _ls_size(ls_line), self.limits))
            elif kind in (b"U", b"R"):
                name = self._name(stream.token(), collected)
                if name is None:
                    continue
                if kind == b"U":
                    collected.add(name, SourceFile(name, b"", "", status="unreadable", error="Permission denied"))
                else:
                    readable.append(name)
                    if len(readable) > self.limits.max_files:
                        raise LimitExceeded(
                            f"{self.label}: more than {self.limits.max_files} .py files; "
                            "point kvtrace at the disaggregation folder or raise --max-files"
                        )
            elif kind == b"L":
                name = self._name(stream.token(), collected)
                real = stream.token().decode("utf-8", "surrogateescape")
                if name is not None:
                    collected.link(collected.folder_links, name, real)
            elif kind == b"D":
                name = self._name(stream.token(), collected)
                if name is not None:
                    collected.notes.append(f"{self.where}: cannot list {name}/: permission denied")
            else:
                raise RemoteError(f"{self.where}: the remote fetch stream is malformed (record {kind[:8]!r})")

    def _name(self, raw: bytes, collected: Collected) -> str | None:
        name = relative(raw.decode("utf-8", "surrogateescape"))
        if name is None or not utf8_name(name, collected.notes, self.where):
            return None
        return name

    def _archive(self, stream: ChannelStream, collected: Collected) -> None:
        tar = TarReader(stream, self.limits.max_file_bytes, self.where)
        message = total_cap_message(self.label, self.limits)
        for member in tar.members():
            name = relative(member.name)
            keep = name is not None and utf8_name(name, collected.notes, self.where)
            fits = member.size <= self.limits.max_file_bytes
            if keep and member.kind == "file" and fits:
                collected.add(name, make_source_file(name, tar.read_data(member)))
                continue
            if not fits:
                member_over_limit(member, stream, message)
            tar.skip_data(member)
            if not keep:
                continue
            if member.kind == "file":  # grew after find looked
                collected.add(name, oversized_file(name, member.size, self.limits))
            elif member.kind == "hardlink":  # a second name for an inode tar already sent
                collected.link(collected.hardlinks, name, relative(member.linkname) or "")
            elif member.kind == "symlink":
                collected.link(collected.symlinks, name, member.linkname)
            # Devices, fifos, dirs: never part of the tree.

    def _exit_status(self, chan: paramiko.Channel) -> int:
        conn = self.conn
        if not chan.status_event.wait(conn.deadline.cap(conn.options.read_timeout)):
            conn.deadline.check()
            raise RemoteError(f"{self.where}: timed out after {conn.options.read_timeout:g} s waiting for the remote command to finish")
        return chan.recv_exit_status()


def _ls_size(line: bytes) -> int | None:
    fields = line.split()
    try:
        return int(fields[4])  # ls -ln: mode links uid gid SIZE ...
    except (IndexError, ValueError):
        return None

