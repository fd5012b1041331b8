"""The exec route: run the constant command (script.py), feed it the path, the limit and the names
to search for on stdin, read its records, ask for the files the scan reads (kvtrace.fetch.select)
and read their tar archive, bounded (stream.py, tarstream.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import paramiko

from kvtrace.errors import LimitExceeded, RemoteError
from kvtrace.fetch.local import make_source_file, oversized_file
from kvtrace.fetch.ssh.collect import Collected, Route, relative, too_large, utf8_name
from kvtrace.fetch.ssh.connect import ms, shown as _shown
from kvtrace.fetch.ssh.script import COMMAND, MARKER, request_all, request_some, stdin_payload
from kvtrace.fetch.select import Wanted, choose, named_folders, narrow, package_roots
from kvtrace.fetch.ssh.stream import ChannelStream
from kvtrace.fetch.ssh.tarstream import TarReader, member_over_limit
from kvtrace.model import FetchLimits, FetchResult, SourceFile

NOT_IN_ARCHIVE = "listed as readable, but tar could not read it"


def total_cap_message(label: str, limits: FetchLimits) -> str:
    return (f"{label}: more than {limits.max_total_bytes} bytes of .py files; "
            "point kvtrace at the disaggregation folder or raise --max-total-bytes")


class NeedsAll(Exception):
    """The files asked for held no package after all (only its name): fetch the whole tree."""


class ExecFetch(Route):
    def run(self, wanted: Wanted | None = None) -> FetchResult | None:
        """None when the server cannot run the command (the caller then uses SFTP). With
        `wanted`, only the files the scan reads are moved and kept (select.narrow)."""
        if wanted is None or not wanted.searchable or "" in named_folders([], wanted.package_dir, self.label):
            # Nothing to search for, or the target is named like the package: the scan reads all of it.
            result = self._run(None)
            return narrow(result, wanted) if result is not None and wanted is not None else result
        try:
            result = self._run(wanted)
        except NeedsAll:
            self.conn.log("ssh: no package among the files holding its name; fetching the whole tree")
            result = self._run(None)
        return narrow(result, wanted) if result is not None else None

    def _run(self, wanted: Wanted | None) -> FetchResult | None:
        """One exec channel, answering in one round trip (wanted None: every file) or two."""
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
            payload = stdin_payload(self.path, limits.max_file_bytes, *((wanted.enum, wanted.queues) if wanted else ()))
            try:
                chan.sendall(payload if wanted else payload + request_all())
                if not wanted:
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
                self._no_stream(chan, stream)  # raises, or says why SFTP is used instead
                return None
            root_real = stream.token().decode("utf-8", "surrogateescape")
            searched = stream.token(limit=8) == b"1"
            collected = Collected(self.label, limits, root_real, conn.log)
            listing = self._records(stream, collected)
            listed_bytes = stream.count - stream.available()
            asked, some = listing.readable, False
            if wanted:
                asked, some = self._ask(stream, collected, listing, wanted if searched else None)
            self._archive(stream, collected, set(asked) if some else None)
            if stream.drain_to_eof():
                # Only logged: the records and the archive already say what happened.
                finished = chan.status_event.wait(conn.deadline.cap(2.0))
                status = str(chan.recv_exit_status()) if finished else "not sent"
            else:
                status = "not awaited"
                conn.log("ssh: the remote kept sending after its archive; the rest is ignored")
            for name in asked:  # hard links arrive as link members; finish() resolves them
                if name not in collected.files and name not in collected.hardlinks:
                    collected.add(name, SourceFile(name, b"", "", status="unreadable", error=NOT_IN_ARCHIVE))
            if stream.stderr:
                conn.log(f"ssh: remote stderr: {_shown(stream.stderr_first_line())}")
            result = collected.finish()
            conn.log(f"ssh: exec fetch: {len(listing.readable)} readable .py files listed ({listed_bytes} bytes), "
                     f"{len(asked)} fetched ({stream.count - listed_bytes} bytes) in {ms(t0)} (exit {status})")
            if some and wanted is not None and not package_roots(result.files, wanted, self.label):
                raise NeedsAll()
            return result
        finally:
            chan.close()

    def _ask(self, stream: ChannelStream, collected: Collected, listing: Listing,
             wanted: Wanted | None) -> tuple[list[str], bool]:
        """Round 2: ask for the files the scan reads (all of them when the names were not
        searched for, or a .py symlink makes a file's content depend on another's)."""
        chosen = None
        if wanted is not None and not listing.py_links:
            if listing.total_bytes > self.limits.max_total_bytes:
                raise LimitExceeded(total_cap_message(self.label, self.limits))
            readable = set(listing.readable)
            paths = [*listing.readable, *collected.files]
            chosen = choose(paths, listing.enum_hits & readable, listing.queue_hits & readable, wanted, self.label)
        if chosen is None:
            stream.send(request_all())
            asked = listing.readable
        else:
            asked = [name for name in listing.readable if name in chosen]
            stream.send(request_some([listing.raw[name] for name in asked]))
        stream.chan.shutdown_write()
        return asked, chosen is not None

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

    def _records(self, stream: ChannelStream, collected: Collected) -> Listing:
        listing = Listing()
        seen = 0
        while True:
            kind = stream.token(limit=8)
            if kind == b"E":
                return listing
            if kind == b"Y":  # not a file or folder record: bounded on its own, as links are
                stream.token()
                listing.py_links += 1
                if listing.py_links > 4 * (self.limits.max_files + 1):
                    raise RemoteError(f"{self.where}: the remote listed more than {4 * self.limits.max_files} "
                                      ".py symlinks; stopped")
                continue
            seen += 1
            if seen > 4 * (self.limits.max_files + 1):  # D records too: bounded all the same
                raise RemoteError(f"{self.where}: the remote listed more than {4 * self.limits.max_files} entries; stopped")
            if kind == b"S":
                ls_line = stream.token()
                name = self._name(stream.token(), collected)
                if name is not None:
                    collected.add(name, too_large(name, _ls_size(ls_line), self.limits))
            elif kind in (b"U", b"R"):
                self._file_record(kind, stream, collected, listing)
            elif kind == b"L":
                name = self._name(stream.token(), collected)
                real = stream.token().decode("utf-8", "surrogateescape")
                if name is not None:
                    collected.link(collected.folder_links, name, real)
            elif kind == b"T":
                try:
                    listing.total_bytes += int(stream.token(limit=32))
                except ValueError:
                    raise RemoteError(f"{self.where}: the remote fetch stream is malformed (a byte count)") from None
            elif kind in (b"K", b"Q"):
                self._hits_record(listing.enum_hits if kind == b"K" else listing.queue_hits, stream)
            elif kind == b"D":
                name = self._name(stream.token(), collected)
                if name is not None:
                    collected.notes.append(f"{self.where}: cannot list {name}/: permission denied")
            else:
                raise RemoteError(f"{self.where}: the remote fetch stream is malformed (record {kind[:8]!r})")

    def _file_record(self, kind: bytes, stream: ChannelStream, collected: Collected, listing: Listing) -> None:
        """A .py file: readable (R, listed to fetch) or not (U, reported as unreadable)."""
        raw = stream.token()
        name = self._name(raw, collected)
        if name is None:
            return
        if kind == b"U":
            collected.add(name, SourceFile(name, b"", "", status="unreadable", error="Permission denied"))
        elif name not in listing.raw:
            listing.readable.append(name)
            listing.raw[name] = raw
            if len(listing.readable) > self.limits.max_files:
                raise LimitExceeded(
                    f"{self.label}: more than {self.limits.max_files} .py files; "
                    "point kvtrace at the disaggregation folder or raise --max-files"
                )

    def _hits_record(self, hits: set[str], stream: ChannelStream) -> None:
        """The files holding a name (the enum's, K, or a queue's, Q)."""
        while raw := stream.token():  # names, then an empty one; each file at most once a kind
            if len(hits) > self.limits.max_files:
                raise RemoteError(f"{self.where}: the remote named more than {self.limits.max_files} "
                                  "files holding a name; stopped")
            name = relative(raw.decode("utf-8", "surrogateescape"))
            if name is not None:
                hits.add(name)

    def _name(self, raw: bytes, collected: Collected) -> str | None:
        name = relative(raw.decode("utf-8", "surrogateescape"))
        if name is None or not utf8_name(name, collected.notes, self.where):
            return None
        return name

    def _archive(self, stream: ChannelStream, collected: Collected, asked: set[str] | None) -> None:
        """The archive's members; with `asked`, only those names (the choice made in round 1)."""
        tar = TarReader(stream, self.limits.max_file_bytes, self.where)
        message = total_cap_message(self.label, self.limits)
        for member in tar.members():
            name = relative(member.name)
            kept = name if name is not None and utf8_name(name, collected.notes, self.where) \
                and (asked is None or name in asked) else None
            fits = member.size <= self.limits.max_file_bytes
            if kept is not None and member.kind == "file" and fits:
                collected.add(kept, make_source_file(kept, tar.read_data(member)))
                continue
            if not fits:
                member_over_limit(member, stream, message)
            tar.skip_data(member)
            if kept is None:
                continue
            if member.kind == "file":  # grew after find looked
                collected.add(kept, oversized_file(kept, member.size, self.limits))
            elif member.kind == "hardlink":  # a second name for an inode tar already sent
                collected.link(collected.hardlinks, kept, relative(member.linkname) or "")
            elif member.kind == "symlink":
                collected.link(collected.symlinks, kept, member.linkname)
            # Devices, fifos, dirs: never part of the tree.

    def _exit_status(self, chan: paramiko.Channel) -> int:
        conn = self.conn
        if not chan.status_event.wait(conn.deadline.cap(conn.options.read_timeout)):
            conn.deadline.check()
            raise RemoteError(f"{self.where}: timed out after {conn.options.read_timeout:g} s waiting for the remote command to finish")
        return chan.recv_exit_status()


@dataclass
class Listing:
    """What round 1 said about the readable files: their names (and the bytes naming each on the
    remote), their total size, which hold the enum's or a queue's name, any .py symlink."""

    readable: list[str] = field(default_factory=list)
    raw: dict[str, bytes] = field(default_factory=dict)
    total_bytes: int = 0
    enum_hits: set[str] = field(default_factory=set)
    queue_hits: set[str] = field(default_factory=set)
    py_links: int = 0


def _ls_size(line: bytes) -> int | None:
    fields = line.split()
    try:
        return int(fields[4])  # ls -ln: mode links uid gid SIZE ...
    except (IndexError, ValueError):
        return None

