"""What a caller may set for an SSH fetch, and the whole-fetch deadline. Free of paramiko, so
the CLI and other stages can build options without importing it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtrace.errors import RemoteError

Log = Callable[[str], None]

DEFAULT_TIMEOUT = 300.0  # whole fetch: connect, authenticate, stream, unpack


@dataclass
class SshOptions:
    identity_files: list[str] = field(default_factory=list)  # -i KEY, tried before config keys
    ssh_config: str | None = None  # default ~/.ssh/config (if it exists)
    known_hosts: str | None = None  # default: ssh config UserKnownHostsFile or ~/.ssh/known_hosts
    accept_new_host_key: bool = False  # OpenSSH accept-new: record an unknown key, never a changed one
    connect_timeout: float = 10
    read_timeout: float = 60  # the longest wait for any one reply
    timeout: float = DEFAULT_TIMEOUT  # the whole fetch, however the server paces its replies
    ssh_binary: str | None = "ssh"  # `ssh -G` resolves the config when found; None: paramiko only


class Deadline:
    """One clock for a whole fetch. Every wait is capped by what is left of it, and a watchdog
    (see connect.py) closes the connection when it passes, so no read can outlive it."""

    def __init__(self, seconds: float, where: str = "") -> None:
        self.seconds = seconds
        self.where = where
        self.end = time.monotonic() + seconds
        self.expired = False

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def cap(self, wait: float) -> float:
        """`wait`, shortened to the time left; raises when none is left."""
        left = self.remaining()
        if left <= 0:
            raise self.error()
        return min(wait, left)

    def check(self) -> None:
        if self.expired or self.remaining() <= 0:
            raise self.error()

    def error(self) -> RemoteError:
        self.expired = True
        where = f"{self.where}: " if self.where else ""
        return RemoteError(f"{where}gave up after {self.seconds:g} s (the --timeout for the whole fetch)")
