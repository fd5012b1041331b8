"""Run a command and learn its own peak memory, not the test runner's.

Linux carries a process's resident high-water mark over fork and exec: a child forked from a
pytest that holds 540 MB reports ru_maxrss ≥ 540 MB whatever it did itself. So the command is
started by a small launcher interpreter (a few MB), which spawns it, waits for it, and writes
the ru_maxrss of that wait (the command and every descendant it waited for, the analysis fork
included) to a file. The launcher leads its own session, so a timeout can kill the whole group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_LAUNCHER = """\
import os, signal, sys
out, argv = sys.argv[1], sys.argv[2:]
pid = os.posix_spawn(argv[0], argv, os.environ)
_, status, usage = os.wait4(pid, 0)
with open(out, "w") as handle:
    handle.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
if code < 0:  # die by the same signal, so the caller sees what the command saw
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


class MeasuredPopen(subprocess.Popen):  # type: ignore[type-arg]
    """`subprocess.Popen(args)` through the launcher; `peak_mb()` after it ended."""

    def __init__(self, args: list[str], **kwargs: Any) -> None:
        handle, name = tempfile.mkstemp(prefix="kvtrace-peak-")
        os.close(handle)
        self.peak_file = Path(name)
        kwargs.setdefault("start_new_session", True)
        super().__init__([sys.executable, "-S", "-c", _LAUNCHER, name, *args], **kwargs)

    def kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def peak_mb(self) -> float:
        try:
            text = self.peak_file.read_text()
        finally:
            self.peak_file.unlink(missing_ok=True)
        assert text, "the launcher was killed before its command ended: no peak recorded"
        return int(text) / 1024
