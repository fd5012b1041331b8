"""`kvtrace scan X 2>&1 | cat` pipes stdout and stderr both: the text is folded to the width of
the controlling terminal (/dev/tty) when one can be opened; COLUMNS comes first; with neither
(a CI runner) it is not folded."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import termios

import pytest

from kvtrace.report import plain_width


def _pty_of_width(columns: int) -> tuple[int, int]:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
    return leader, follower


def test_width_comes_from_dev_tty_when_stderr_is_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    leader, follower = _pty_of_width(73)
    real_open = os.open
    opened: list[str] = []

    def open_tty(path, flags, *args):  # type: ignore[no-untyped-def]
        if path == "/dev/tty":
            opened.append(path)
            return os.dup(follower)
        return real_open(path, flags, *args)

    read, write = os.pipe()  # stderr is a pipe, as in `2>&1 | cat`
    saved = os.dup(2)
    try:
        os.dup2(write, 2)
        monkeypatch.delenv("COLUMNS", raising=False)
        monkeypatch.setattr(os, "open", open_tty)
        assert plain_width(piped=True) == 73
        assert opened == ["/dev/tty"]
        monkeypatch.setenv("COLUMNS", "90")
        assert plain_width(piped=True) == 90  # COLUMNS first
        monkeypatch.delenv("COLUMNS")
        assert plain_width(piped=False) == 1000  # a file: never folded

        def no_tty(path, flags, *args):  # type: ignore[no-untyped-def]
            if path == "/dev/tty":
                raise OSError(6, "No such device or address")
            return real_open(path, flags, *args)

        monkeypatch.setattr(os, "open", no_tty)
        assert plain_width(piped=True) == 1000  # no controlling terminal: not folded, as before
    finally:
        os.dup2(saved, 2)
        for fd in (saved, read, write, leader, follower):
            os.close(fd)
