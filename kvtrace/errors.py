"""Errors that end a scan with one clear line and a distinct exit code (never a traceback)."""

from __future__ import annotations

# Exit codes, documented in the README and `kvtrace --help`:
#   0 no findings, 1 findings, 2 usage or input error (local or remote; nothing was analysed),
#   3 the scan finished but some files could not be analysed (syntax error, not UTF-8, ...).
EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_INPUT = 2
EXIT_INCOMPLETE = 3


class KvtraceError(Exception):
    """A problem the user can fix; `str()` is the one line shown."""

    exit_code = EXIT_INPUT


class InputError(KvtraceError):
    """Missing path, no disaggregation package, bad rules pack, unreadable file."""


class RemoteError(KvtraceError):
    """Anything on the SSH side: refused, host key, auth, remote path, timeout."""

    exit_code = EXIT_INPUT


class LimitExceeded(KvtraceError):
    """Too many files, a file too large, or too many bytes in total."""

    exit_code = EXIT_INPUT
