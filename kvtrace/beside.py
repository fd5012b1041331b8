"""Work done in a forked child beside the parent's own, on a second core.

A scan analyses the senders (their poll(), abort() and managers) and the queue's drain loop;
the two share nothing but the parsed trees. On a machine with a spare core the senders run in a
child forked after parsing (it inherits the trees, nothing is re-parsed) while the parent walks
the drain loop, and the child sends back its result as bytes through a pipe.

Only where it is safe and pays: Linux, a second CPU, no other thread in the process (a fork
copies a lock another thread holds in its held state: paramiko's transport and the fleet's
pool have threads), and work large enough to cover the ~10 ms a fork and its JSON result cost. A
child that fails for any reason yields None and the caller does the work itself, so the result
never depends on whether the child ran.
"""

from __future__ import annotations

import gc
import mmap
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import TracebackType


def can_fork() -> bool:
    if not sys.platform.startswith("linux") or os.environ.get("KVTRACE_NO_FORK"):
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except OSError:
        return False
    return cpus >= 2 and threading.active_count() == 1


class Beside:
    """`with Beside(work) as child: ...; data = child.result()`: `work()` runs in a forked child
    while the block runs; result() is its bytes, or None when it did not run or failed."""

    def __init__(self, work: Callable[[], bytes], enabled: bool = True):
        self._work = work
        self._enabled = enabled and can_fork()
        self._pid: int | None = None
        self._fd: int | None = None

    def __enter__(self) -> "Beside":
        if not self._enabled:
            return self
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            status = 1
            try:
                os.close(read_end)
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it with the parent
                # The inherited objects are never collected here: without this the collector's
                # first pass would touch (and so copy) every page of the parent's heap.
                gc.freeze()
                data = self._work()
                with os.fdopen(write_end, "wb") as out:
                    out.write(data)
                status = 0
            except BaseException:  # noqa: BLE001 - any failure means "the parent does it"
                pass
            finally:
                os._exit(status)
        os.close(write_end)
        self._pid, self._fd = pid, read_end
        return self

    @property
    def forked(self) -> bool:
        """A child is running (its result() is still to be read)."""
        return self._pid is not None

    def result(self) -> bytes | None:
        if self._pid is None or self._fd is None:
            return None
        try:
            with os.fdopen(self._fd, "rb") as pipe:
                self._fd = None
                data = pipe.read()
        finally:
            _, status = os.waitpid(self._pid, 0)
            self._pid = None
        return data if os.waitstatus_to_exitcode(status) == 0 else None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        # Left early (an error, Ctrl-C) or result() never asked: end the child, never leave it.
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._pid is not None:
            _end(self._pid, kill=True)
            self._pid = None


class Claims:
    """Work items 0..n-1 shared by a parent and its forked child: `claim(i)` is True for exactly
    one of them, whichever asks first, so each takes what the other has not started. One byte
    per item in a memory file both see (made before the fork), guarded by a POSIX record lock on
    that file: the kernel grants it to one process at a time and takes it back from a process
    that dies holding it, so a child killed mid-claim (the OOM killer) never blocks the parent."""

    def __init__(self, count: int):
        size = max(count, 1)
        # Only Linux forks a child (can_fork); elsewhere one process claims alone, unlocked.
        self._file = os.memfd_create("kvtrace-claims", os.MFD_CLOEXEC) if hasattr(os, "memfd_create") else None
        if self._file is None:
            self._taken = mmap.mmap(-1, size)
        else:
            os.ftruncate(self._file, size)
            self._taken = mmap.mmap(self._file, size)

    def claim(self, item: int) -> bool:
        self._lock()
        try:
            won = self._taken[item] == 0
            self._taken[item] = 1
        finally:
            self._unlock()
        return won

    def claim_unless_last(self, item: int, among: range) -> bool:
        """claim(item), but only while another item of `among` is unclaimed too: the last one is
        left to the process that takes them in order (see kvtrace.pipeline.graph)."""
        self._lock()
        try:
            won = self._taken[item] == 0 and sum(self._taken[i] == 0 for i in among) > 1
            if won:
                self._taken[item] = 1
        finally:
            self._unlock()
        return won

    def _lock(self) -> None:
        if self._file is not None:
            import fcntl  # POSIX only, like the fork it guards against

            fcntl.lockf(self._file, fcntl.LOCK_EX)

    def _unlock(self) -> None:
        if self._file is not None:
            import fcntl

            fcntl.lockf(self._file, fcntl.LOCK_UN)

    def close(self) -> None:
        self._taken.close()
        if self._file is not None:
            os.close(self._file)


class Server:
    """`with Server(handle) as server: reply = server.call(request)`: a child forked at the start
    (while the process still has one thread) that answers requests with `handle(request)`, one at
    a time, on a second core, while the parent's threads go on (a fleet fetches hosts while an
    earlier host's tree is analysed). call() is None when the child is not running or could not
    answer; the caller then does the work itself, so a result never depends on whether it ran."""

    def __init__(self, handle: Callable[[bytes], bytes], enabled: bool = True):
        self._handle = handle
        self._enabled = enabled and can_fork()
        self._pid: int | None = None
        self._to_child: int | None = None
        self._from_child: int | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> "Server":
        if not self._enabled:
            return self
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: serves until the parent closes its end, never returns
            status = 1
            try:
                os.close(requests_write)
                os.close(replies_read)
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it with the parent
                gc.freeze()  # see Beside: the inherited heap is never collected (nor copied) here
                while (request := _read_frame(requests_read)) is not None:
                    try:
                        reply = b"R" + self._handle(request)
                    except Exception:  # noqa: BLE001 - the parent does this one itself
                        reply = b"F"
                    _write_frame(replies_write, reply)
                status = 0
            except BaseException:  # noqa: BLE001
                pass
            finally:
                os._exit(status)
        os.close(requests_read)
        os.close(replies_write)
        self._pid, self._to_child, self._from_child = pid, requests_write, replies_read
        return self

    def call(self, request: bytes) -> bytes | None:
        with self._lock:
            if self._to_child is None or self._from_child is None:
                return None
            try:
                _write_frame(self._to_child, request)
                reply = _read_frame(self._from_child)
            except OSError:
                reply = None
            if reply is None:  # the child is gone: every later request is done by the caller
                self._close()
                return None
            return reply[1:] if reply[:1] == b"R" else None

    def _close(self) -> None:
        for fd in (self._to_child, self._from_child):
            if fd is not None:
                os.close(fd)
        self._to_child = self._from_child = None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        with self._lock:
            self._close()  # the child reads the end of its requests and exits
        if self._pid is not None:
            # Left early (an error, Ctrl-C): do not wait for a request to finish.
            _end(self._pid, kill=kind is not None)
            self._pid = None


def _end(pid: int, kill: bool) -> None:
    """Reap the child, killed first when `kill`."""
    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.waitpid(pid, 0)


def _write_frame(fd: int, data: bytes) -> None:
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        view = view[os.write(fd, view):]


def _read_frame(fd: int) -> bytes | None:
    """One frame, or None at the end of the pipe (or a frame cut short)."""
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    return _read_exactly(fd, int.from_bytes(head, "big"))


def _read_exactly(fd: int, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)
