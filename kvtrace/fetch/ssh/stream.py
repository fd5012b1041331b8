"""Bounded reading of an exec channel: every read waits at most --read-timeout and never past
the whole-fetch deadline; nothing is allocated before its size is checked against a limit; the
total is capped; stderr is drained (so the shared window never stalls) but only its start kept."""

from __future__ import annotations

import socket
import time

import paramiko

from kvtrace.errors import LimitExceeded, RemoteError
from kvtrace.fetch.ssh.options import Deadline

_CHUNK = 1 << 16
_STDERR_KEPT = 1 << 16
_STDERR_MAX = 16 << 20  # more than this on stderr is not a fetch, it is a flood


class ChannelStream:
    def __init__(self, chan: paramiko.Channel, cap: int, cap_message: str, where: str,
                 deadline: Deadline, read_timeout: float) -> None:
        self.chan = chan
        self.cap = cap
        self.cap_message = cap_message
        self.where = where
        self.deadline = deadline
        self.read_timeout = read_timeout
        self.buf = bytearray()
        self.pos = 0
        self.eof = False
        self.count = 0
        self.stderr = bytearray()
        self.stderr_count = 0

    def _fill(self) -> None:
        self.deadline.check()
        self.chan.settimeout(self.deadline.cap(self.read_timeout))
        try:
            data = self.chan.recv(_CHUNK)
        except (TimeoutError, socket.timeout):
            self.deadline.check()
            raise RemoteError(f"{self.where}: timed out after {self.read_timeout:g} s waiting for data from the remote") from None
        self.drain_stderr()
        if not data:
            self.eof = True
            return
        self.count += len(data)
        if self.count > self.cap:
            raise LimitExceeded(self.cap_message)
        if self.pos > _CHUNK * 16:  # keep the buffer small: drop what was consumed
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += data

    def send(self, data: bytes) -> None:
        """Send `data` while taking in what the remote sends meanwhile: the remote may already be
        answering the first names of a long request, and with both windows full each side
        would wait for the other forever."""
        view = memoryview(data)
        waited_since = time.monotonic()
        while view:
            self.deadline.check()
            if self.chan.send_ready():
                sent = self.chan.send(view[:_CHUNK])
                view = view[sent:]
                waited_since = time.monotonic()
            elif self.chan.recv_ready():
                self._fill()
                waited_since = time.monotonic()
            elif self.chan.closed or self.chan.eof_received:
                return  # the remote is done: what it sent says what happened
            else:
                if time.monotonic() - waited_since > self.read_timeout:
                    raise RemoteError(f"{self.where}: timed out after {self.read_timeout:g} s sending the request")
                self.drain_stderr()
                self.chan.status_event.wait(0.005)

    def drain_stderr(self) -> None:
        """Read what stderr has ready now (never waits); keep the first 64 KiB. Once the
        command has exited nothing more is needed from it: a flood after exit is left unread."""
        while self.chan.recv_stderr_ready() and not self.chan.exit_status_ready():
            self.deadline.check()
            chunk = self.chan.recv_stderr(_CHUNK)
            if not chunk:
                return
            self.stderr_count += len(chunk)
            if self.stderr_count > _STDERR_MAX:
                raise RemoteError(f"{self.where}: the remote wrote more than {_STDERR_MAX >> 20} MiB on stderr; stopped")
            if len(self.stderr) < _STDERR_KEPT:
                self.stderr += chunk[: _STDERR_KEPT - len(self.stderr)]

    def available(self) -> int:
        return len(self.buf) - self.pos

    def read_exact(self, size: int, what: str) -> bytes:
        """`size` bytes (the caller has bounded `size`); a short stream is a broken one."""
        while self.available() < size:
            if self.eof:
                raise RemoteError(f"{self.where}: the remote stream broke off in {what}")
            self._fill()
        out = bytes(self.buf[self.pos : self.pos + size])
        self.pos += size
        return out

    def skip(self, size: int, what: str) -> None:
        """Consume `size` bytes without keeping them (the cap still counts them)."""
        while size > 0:
            if not self.available():
                if self.eof:
                    raise RemoteError(f"{self.where}: the remote stream broke off in {what}")
                self._fill()
                continue
            take = min(size, self.available())
            self.pos += take
            size -= take

    def token(self, limit: int = 1 << 16) -> bytes:
        """Bytes up to the next NUL (consumed, not returned); a missing NUL is a broken stream."""
        searched = 0  # relative to self.pos: _fill may compact the buffer
        while True:
            end = self.buf.find(b"\0", self.pos + searched)
            if end != -1:
                out = bytes(self.buf[self.pos : end])
                self.pos = end + 1
                return out
            searched = self.available()
            if self.eof or self.available() > limit:
                raise RemoteError(f"{self.where}: the remote fetch stream is malformed (a field longer than {limit} bytes, or cut off)")
            self._fill()

    def skip_to(self, marker: bytes, within: int) -> bool:
        """Drop anything a login script printed before our marker; False if it never came."""
        while True:
            at = self.buf.find(marker, self.pos)
            if at != -1:
                self.pos = at + len(marker)
                return True
            if self.eof or self.available() > within:
                return False
            self._fill()

    def drain_to_eof(self, within: int = 1 << 20) -> bool:
        """Read (and drop) what follows the archive: tar's padding. False when more than
        `within` bytes follow: the archive is complete, the rest is not read."""
        start = self.count - self.available()
        waited_since = time.monotonic()
        while not self.eof:
            self.pos = len(self.buf)
            if self.count - start > within:
                return False
            if not self.chan.recv_ready() and not self.chan.eof_received:
                if self.chan.exit_status_ready():
                    return True  # exited; whatever it still says on stderr is not waited for
                self.deadline.check()
                if time.monotonic() - waited_since > self.read_timeout:
                    raise RemoteError(f"{self.where}: timed out after {self.read_timeout:g} s waiting for the remote command to finish")
                self.drain_stderr()
                self.chan.status_event.wait(0.05)
                continue
            self._fill()
            waited_since = time.monotonic()
        return True

    def stderr_first_line(self) -> str:
        self.drain_stderr()
        text = self.stderr.decode("utf-8", "replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[0][:200] if lines else "no stderr"
