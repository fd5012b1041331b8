"""The memory bounds of the hostile-input tests measure the command, not the test runner."""

from __future__ import annotations

import sys

from tests.peak import MeasuredPopen

_TOUCH = "x = bytearray({mb} << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\n"


def test_peak_is_the_commands_own_whatever_the_runner_holds() -> None:
    runner_ballast = bytearray(400 << 20)
    for i in range(0, len(runner_ballast), 4096):
        runner_ballast[i] = 1
    small = MeasuredPopen([sys.executable, "-c", "pass"])
    assert small.wait() == 0
    big = MeasuredPopen([sys.executable, "-c", _TOUCH.format(mb=120)])
    assert big.wait() == 0
    assert small.peak_mb() < 60 < 120 < big.peak_mb() < 300
    del runner_ballast


def test_exit_code_and_signal_pass_through() -> None:
    assert MeasuredPopen([sys.executable, "-c", "raise SystemExit(3)"]).wait() == 3
    killed = MeasuredPopen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert killed.wait() == -15
