"""Errors that end a scan with one clear line and a distinct exit code (never a traceback)."""

from __future__ import annotations

# Exit codes, documented in the README and `kvtrace --help`:
#   0 no findings, 1 findings, 2 usage or input error (local or remote; nothing was analysed),
#   3 the scan finished but is incomplete (a file or a backend could not be analysed),
#   4 an internal error (a bug in kvtrace; `-v` shows the traceback).
EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_INPUT = 2
EXIT_INCOMPLETE = 3
EXIT_INTERNAL = 4


class KvtraceError(Exception):
    """A problem the user can fix; `str()` is the one line shown."""

    exit_code = EXIT_INPUT


class InputError(KvtraceError):
    """Missing path, no disaggregation package, bad rules pack, unreadable file, bad option."""


AMBIGUOUS_SHOWN = 6  # packages a several-packages error names before "and N more"


class AmbiguousTarget(InputError):
    """Several candidate packages under one target: the user must pick one (or pass --all)."""

    def __init__(self, target: str, candidates: list[str]) -> None:
        self.candidates = candidates
        # One line a reader takes in: a tree of fixtures can hold dozens of packages.
        shown = candidates if len(candidates) <= AMBIGUOUS_SHOWN else candidates[:AMBIGUOUS_SHOWN - 1]
        listed = ", ".join(f"{c}/" for c in shown)
        if len(shown) < len(candidates):
            listed += f" and {len(candidates) - len(shown)} more"
        super().__init__(
            f"{target}: {len(candidates)} packages found ({listed}); "
            "scan one of them, or pass --all to scan each as its own report"
        )


class RemoteError(KvtraceError):
    """Anything on the SSH side: refused, host key, auth, remote path, timeout."""

    exit_code = EXIT_INPUT


class LimitExceeded(KvtraceError):
    """Too many files, a file too large, or too many bytes in total."""

    exit_code = EXIT_INPUT
