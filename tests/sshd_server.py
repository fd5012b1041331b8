"""A private OpenSSH server on 127.0.0.1 for tests: real sshd, no mocks.

    with SshdServer.start() as server:            # or start(extra_config=["ForceCommand internal-sftp"])
        server.port, server.client_key, server.known_hosts, server.ssh_config, server.user

Each server lives in its own temp dir (0755, so a throwaway non-root login can read its
authorized_keys) with generated ed25519 host and client keys, a known_hosts file holding the
host key, an empty ssh_config (so tests never read ~/.ssh/config), and the sshd log. It runs
`sshd -D -e -f CONFIG` in the foreground, is ready when its log says "Server listening", and is
stopped by PID. See /work/shared/notes/ssh-testing.md for why each setting is there.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SSHD = "/usr/sbin/sshd"
HOST = "127.0.0.1"


def sshd_missing_reason() -> str | None:
    """Why a private sshd cannot run here, or None when it can."""
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found (run .ci/install-sshd.sh)"
    return None


def require(reason: str | None, what: str = "SSH tests need sshd") -> None:
    """Skip locally, but FAIL under CI (env CI set), when `reason` says something is missing:
    CI must not go green by skipping the SSH tests."""
    import pytest

    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what} under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def require_sshd() -> None:
    require(sshd_missing_reason())


def generate_key(path: Path, comment: str = "kvtrace-test") -> str:
    """Write an unencrypted ed25519 private key (OpenSSH format, 0600) and `path.pub`; return
    the public line `ssh-ed25519 AAAA... comment`. (No ssh-keygen: it prompts when the file
    exists, which hangs a CI run.)"""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private)
    line = f"{public} {comment}"
    Path(f"{path}.pub").write_text(line + "\n")
    return line


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class SshdServer:
    def __init__(
        self,
        extra_config: Sequence[str] = (),
        users: Sequence[str] | None = None,
    ) -> None:
        self.user = getpass.getuser()
        self.users = list(users) if users is not None else [self.user]
        self.extra_config = list(extra_config)
        self.dir = Path(tempfile.mkdtemp(prefix="kvtrace-sshd-"))
        self.dir.chmod(0o755)
        self.host = HOST
        self.port = 0
        self.host_key = self.dir / "host_ed25519"
        self.host_key_line = " ".join(generate_key(self.host_key, "host").split()[:2])
        self.client_key = self.dir / "client_ed25519"
        authorized = generate_key(self.client_key, "client")
        self.authorized_keys = self.dir / "authorized_keys"
        self.authorized_keys.write_text(authorized + "\n")
        self.authorized_keys.chmod(0o644)
        self.known_hosts = self.dir / "known_hosts"
        self.ssh_config = self.dir / "ssh_config"
        self.ssh_config.write_text("")  # hermetic: never read the developer's ~/.ssh/config
        self.config = self.dir / "sshd_config"
        self.log_path = self.dir / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def start(
        cls, extra_config: Sequence[str] = (), users: Sequence[str] | None = None
    ) -> SshdServer:
        server = cls(extra_config, users)
        try:
            server._launch()
        except BaseException:
            server.stop()
            raise
        return server

    def _launch(self) -> None:
        if os.geteuid() == 0:
            # As root, sshd refuses to start without its privilege-separation directory.
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        last = ""
        # The port is picked free and then handed to sshd, so another process can take it in
        # between; a bind failure is retried on a fresh port.
        for _ in range(5):
            self.port = free_port()
            self._write_config()
            self.known_hosts.write_text(self.known_hosts_entry())
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [SSHD, "-D", "-e", "-f", str(self.config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            if self._wait_listening(timeout=10.0):
                return
            last = self.log_text()
            self._kill()
            if "Address already in use" not in last and "Bind to port" not in last:
                break
        raise RuntimeError(f"sshd did not start: {last.strip()[-2000:]}")

    def _write_config(self) -> None:
        lines = [
            f"ListenAddress {self.host}",
            f"Port {self.port}",
            f"HostKey {self.host_key}",
            f"PidFile {self.dir / 'sshd.pid'}",  # own PidFile: servers must not share one
            f"AuthorizedKeysFile {self.authorized_keys}",
            "StrictModes no",  # keys under /tmp fail the ownership/mode checks otherwise
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            f"AllowUsers {' '.join(self.users)}",
            "AllowAgentForwarding no",
            "X11Forwarding no",
            "PrintMotd no",
            "UseDNS no",
            "Subsystem sftp internal-sftp",  # no external sftp-server, no login shell start-up
            *self.extra_config,
        ]
        self.config.write_text("\n".join(lines) + "\n")

    def _wait_listening(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "Server listening" in self.log_text():
                return True
            if self.proc is not None and self.proc.poll() is not None:
                return False
            time.sleep(0.01)
        return False

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # by PID: the -D listener itself, never a name match
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def stop(self) -> None:
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SshdServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- helpers for tests -------------------------------------------------------------------

    @property
    def known_hosts_name(self) -> str:
        # Not port 22, so OpenSSH (and paramiko) look the host up as "[127.0.0.1]:PORT".
        return f"[{self.host}]:{self.port}"

    def known_hosts_entry(self, key_line: str | None = None) -> str:
        return f"{self.known_hosts_name} {key_line or self.host_key_line}\n"

    def authorize(self, public_line: str) -> None:
        with open(self.authorized_keys, "a") as fh:
            fh.write(public_line.strip() + "\n")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


# -- throwaway logins -----------------------------------------------------------------------

# useradd/userdel take /etc/passwd's lock and FAIL ("cannot lock /etc/passwd") when another one
# holds it, so parallel test runs creating users collided. All of ours are serialised on one
# flock, which the kernel releases even if the holder dies.
_USERS_LOCK = "/run/lock/kvtrace-test-users.lock" if os.path.isdir("/run/lock") else "/tmp/kvtrace-test-users.lock"


def can_create_users() -> str | None:
    """Why throwaway logins cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create throwaway logins (root itself ignores file modes)"
    if not shutil.which("useradd") or not shutil.which("userdel"):
        return "needs useradd and userdel"
    return None


def _locked_run(cmd: list[str]) -> subprocess.CompletedProcess[bytes]:
    import fcntl

    with open(_USERS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(cmd, capture_output=True)


class ThrowawayUser:
    """A non-root login with the given shell and its own home, removed on exit."""

    def __init__(self, shell: str = "/bin/sh") -> None:
        import uuid

        self.name = f"kvt{uuid.uuid4().hex[:10]}"
        self.shell = shell
        self.home = Path(tempfile.mkdtemp(prefix="kvtrace-home-"))

    def __enter__(self) -> ThrowawayUser:
        os.chmod(self.home, 0o755)
        # '*' (not the default '!') so sshd does not treat the account as locked.
        done = _locked_run(["useradd", "-M", "-N", "-d", str(self.home), "-s", self.shell, "-p", "*", self.name])
        if done.returncode != 0:
            shutil.rmtree(self.home, ignore_errors=True)
            raise RuntimeError(f"useradd {self.name} failed: {done.stderr.decode(errors='replace').strip()}")
        os.chown(self.home, pwd_uid(self.name), -1)
        return self

    def __exit__(self, *exc: object) -> None:
        # -f: a session process of this user may still be exiting after its sshd stopped;
        # userdel would refuse (exit 8) and leave the account behind.
        _locked_run(["userdel", "-f", self.name])
        shutil.rmtree(self.home, ignore_errors=True)


def pwd_uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid
