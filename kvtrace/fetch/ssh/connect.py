"""Open a verified SSH connection: config resolved, host key checked against known_hosts (or
recorded when asked), authenticated, through at most one ProxyJump host, all within the
whole-fetch deadline. `open_connection` is the entry point other stages build on."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import paramiko

from kvtrace.errors import KvtraceError, RemoteError
from kvtrace.fetch.ssh.config import ResolvedHost, SshConfig
from kvtrace.fetch.ssh.known_hosts import KnownHosts, load_known_hosts, record_host_key
from kvtrace.fetch.ssh.options import Deadline, Log, SshOptions
from kvtrace.target import SshTarget, parse_authority


class SshConnection:
    """A verified, authenticated connection. Close it (or use `with`); the watchdog closes it
    anyway when the deadline passes, which ends any read blocked on it."""

    def __init__(self, host: ResolvedHost, options: SshOptions, deadline: Deadline, log: Log) -> None:
        self.host = host
        self.options = options
        self.deadline = deadline
        self.log = log
        self.clients: list[paramiko.SSHClient] = []
        self.socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._watchdog = threading.Timer(max(deadline.remaining(), 0), self._expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    @property
    def client(self) -> paramiko.SSHClient:
        return self.clients[-1]

    @property
    def where(self) -> str:
        return self.host.where

    def _expire(self) -> None:
        self.deadline.expired = True
        self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for client in reversed(self.clients):
            try:
                client.close()
            except Exception:  # noqa: BLE001 -- closing a broken transport must not mask the cause
                pass
        for sock in self.socks:
            try:
                sock.close()
            except OSError:
                pass

    def bytes_received(self) -> int | None:
        """Bytes the server (or the first hop) has sent over TCP so far, SSH framing included."""
        counted = [s.received for s in self.socks if isinstance(s, CountingSocket)]
        return sum(counted) if counted else None

    def close(self) -> None:
        self._watchdog.cancel()
        self._close_all()

    def __enter__(self) -> SshConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def quiet_paramiko() -> None:
    # paramiko logs a full traceback (e.g. on "Error reading SSH protocol banner") from its
    # transport thread; errors are reported as one RemoteError line instead.
    logger = logging.getLogger("paramiko")
    logger.setLevel(logging.CRITICAL + 10)
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())


def open_connection(target: SshTarget, options: SshOptions, log: Log | None = None,
                    deadline: Deadline | None = None) -> SshConnection:
    """Resolve `target` through ssh_config and connect; every failure is one RemoteError line."""
    say: Log = log or (lambda _msg: None)
    quiet_paramiko()
    config = SshConfig(options)
    host = config.resolve(target.host, target.user, target.port)
    deadline = deadline or Deadline(options.timeout)
    deadline.where = deadline.where or host.where
    for key in options.identity_files:
        if not os.path.isfile(os.path.expanduser(key)):
            raise RemoteError(f"{host.where}: identity file {key}: no such file")
    say(f"ssh: {target.label} -> {host.where}" + (f" via ProxyJump {host.jump}" if host.jump else ""))
    conn = SshConnection(host, options, deadline, say)
    try:
        _connect_through(conn, config)
    except KvtraceError:
        conn.close()
        if deadline.expired:
            raise deadline.error() from None
        raise
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_through(conn: SshConnection, config: SshConfig) -> None:
    host = conn.host
    if host.jump is None:
        _connect(conn, host, sock=None)
        return
    hops = host.jump.split(",")
    if len(hops) > 1:
        raise RemoteError(f"{host.where}: ProxyJump {host.jump}: only one jump host is supported")
    spec = hops[0].strip()
    spec = spec[6:] if spec.lower().startswith("ssh://") else spec
    try:
        juser, jalias, jport = parse_authority(spec)
    except (ValueError, KvtraceError) as exc:
        raise RemoteError(f"{host.where}: bad ProxyJump {host.jump!r}: {exc}") from None
    jump = config.resolve(jalias, juser, jport)
    if jump.jump is not None:
        raise RemoteError(f"{jump.where}: ProxyJump chains are not supported (jump host has its own ProxyJump)")
    jump_client = _connect(conn, jump, sock=None)
    t0 = time.monotonic()
    transport = jump_client.get_transport()
    assert transport is not None
    try:
        channel = transport.open_channel(
            "direct-tcpip", (host.hostname, host.port), ("127.0.0.1", 0),
            timeout=conn.deadline.cap(conn.options.connect_timeout),
        )
    except paramiko.ChannelException as exc:
        raise RemoteError(f"{jump.where}: jump host cannot reach {host.hostname}:{host.port} ({exc.text})") from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise RemoteError(f"{jump.where}: jump host cannot reach {host.hostname}:{host.port} ({why(exc)})") from None
    conn.log(f"ssh: tunnel {jump.where} -> {host.hostname}:{host.port} in {ms(t0)}")
    _connect(conn, host, sock=channel)


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only when it was given no key of the server key's type: the type is
    unknown for this host, or several lines name different keys of it (`several`), any of which
    OpenSSH accepts, where paramiko compares with one."""

    def __init__(self, host: ResolvedHost, known: KnownHosts, log: Log,
                 several: list[paramiko.PKey] | None = None) -> None:
        self.several = several or []
        self.host = host
        self.known = known
        self.log = log

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        kind, fp = key.get_name(), key.fingerprint
        revoked = self.known.revoked_at(key)
        if revoked:
            raise RemoteError(f"{self.host.where}: host key {kind} {fp} is REVOKED ({revoked}); refusing to connect")
        listed = [k for k in self.several if k.get_name() == kind]
        if any(k.asbytes() == key.asbytes() for k in listed):
            return  # one of the host's lines for this type names this key
        if listed:
            raise RemoteError(
                f"{self.host.where}: HOST KEY CHANGED: the server sent {kind} {fp} but known_hosts lists "
                f"{len(listed)} other {kind} keys for {self.host.known_hosts_name}; refusing to connect")
        file = self.host.known_hosts[0]
        if not self.host.accept_new:
            port = "" if self.host.port == 22 else f"-p {self.host.port} "
            unusable = "".join(f"; known_hosts {u}, not used" for u in self.known.unusable)
            raise RemoteError(
                f"{self.host.where}: unknown host key {kind} {fp} (not in {file}{unusable}); "
                f"if that fingerprint is right, trust it with `mkdir -p {os.path.dirname(file) or '.'} && "
                f"ssh-keyscan {port}{self.host.hostname} >> {file}` or rerun with --accept-new-host-key"
            )
        try:
            record_host_key(file, hostname, key)
        except OSError as exc:
            raise RemoteError(f"{self.host.where}: cannot record the host key in {file}: {why(exc)}") from None
        self.log(f"ssh: new host key {kind} {fp} for {hostname} added (hashed) to {file}")


def _connect(conn: SshConnection, host: ResolvedHost, sock: socket.socket | paramiko.Channel | None) -> paramiko.SSHClient:
    options, deadline = conn.options, conn.deadline
    t0 = time.monotonic()
    if sock is None:
        sock = _tcp_connect(host, deadline.cap(options.connect_timeout))
        conn.socks.append(sock)
        conn.log(f"ssh: tcp connect {host.hostname}:{host.port} in {ms(t0)}")
    client = paramiko.SSHClient()
    conn.clients.append(client)
    known = load_known_hosts(host.known_hosts, conn.log)
    # Only the keys whose lines match this host (OpenSSH's pattern rules, revoked keys left out):
    # paramiko then prefers their types and checks the server's key against them.
    by_type: dict[str, dict[bytes, paramiko.PKey]] = {}
    for key in known.keys_for(host.known_hosts_name, conn.log):
        by_type.setdefault(key.get_name(), {})[key.asbytes()] = key
    target_keys = client.get_host_keys()
    several: list[paramiko.PKey] = []
    for kind, keys in by_type.items():
        if len(keys) == 1:
            target_keys.add(host.known_hosts_name, kind, next(iter(keys.values())))
        else:  # paramiko holds one key per type: the policy checks against all of them
            several.extend(keys.values())
    client.set_missing_host_key_policy(_HostKeyPolicy(host, known, conn.log, several))
    t1 = time.monotonic()
    wait = deadline.cap(options.connect_timeout)
    try:
        client.connect(
            host.hostname,
            host.port,
            username=host.user,
            key_filename=host.identity_files or None,
            allow_agent=not host.identities_only,
            look_for_keys=not host.identities_only,
            sock=sock,
            # The banner wait must end first so its clearer error wins over "no session".
            timeout=2 * wait,
            banner_timeout=wait,
            auth_timeout=deadline.cap(options.read_timeout),
            channel_timeout=deadline.cap(options.read_timeout),
        )
    except KvtraceError:
        sock.close()
        raise
    except Exception as exc:  # noqa: BLE001 -- every paramiko failure becomes one clear line
        sock.close()
        if deadline.expired:
            raise deadline.error() from None
        raise _connect_error(exc, host, options, known) from exc
    key = client.get_transport().get_remote_server_key()
    conn.log(f"ssh: host key {key.get_name()} {key.fingerprint} ok; authenticated as {host.user} in {ms(t1)}")
    return client


def _tcp_connect(host: ResolvedHost, timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection((host.hostname, host.port), timeout=timeout)
    except socket.gaierror as exc:
        raise RemoteError(f"{host.where}: cannot resolve host name {host.hostname!r} ({exc.strerror})") from None
    except ConnectionRefusedError:
        raise RemoteError(f"{host.where}: connection refused (no SSH server on port {host.port})") from None
    except TimeoutError:
        raise RemoteError(f"{host.where}: timed out after {timeout:g} s connecting") from None
    except OSError as exc:
        raise RemoteError(f"{host.where}: cannot connect ({why(exc)})") from None
    # paramiko leaves Nagle on; with it off connect+auth and SFTP reads are ~3x faster.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    counted = CountingSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    counted.settimeout(timeout)
    return counted


class CountingSocket(socket.socket):
    """A TCP socket that counts the bytes it carries: what a remote scan costs on the wire
    (shown with -v, and measured by bench/run.py)."""

    received = 0
    sent = 0

    def recv(self, size: int, flags: int = 0) -> bytes:
        data = super().recv(size, flags)
        self.received += len(data)
        return data

    def send(self, data: bytes, flags: int = 0) -> int:  # type: ignore[override]
        sent = super().send(data, flags)
        self.sent += sent
        return sent


def _connect_error(exc: BaseException, host: ResolvedHost, options: SshOptions, known: KnownHosts) -> RemoteError:
    where, t = host.where, options.connect_timeout
    cause = exc.__context__  # paramiko re-raises the banner reader's error without chaining
    if isinstance(exc, paramiko.BadHostKeyException):
        revoked = known.revoked_at(exc.key)
        if revoked:
            return RemoteError(
                f"{where}: host key {exc.key.get_name()} {exc.key.fingerprint} is REVOKED ({revoked}); refusing to connect"
            )
        return RemoteError(
            f"{where}: HOST KEY CHANGED: the server sent {exc.key.get_name()} "
            f"{exc.key.fingerprint} but known_hosts has {exc.expected_key.get_name()} "
            f"{exc.expected_key.fingerprint} for {host.known_hosts_name}; refusing to connect "
            f"(if the change is expected: ssh-keygen -R '{host.known_hosts_name}' "
            f"-f {host.known_hosts[0]})"
        )
    if isinstance(exc, paramiko.PasswordRequiredException):
        return RemoteError(f"{where}: the identity file is passphrase-protected; load it with ssh-add first")
    if isinstance(exc, paramiko.BadAuthenticationType):
        return RemoteError(f"{where}: the server accepts only {', '.join(exc.allowed_types)}, not public keys")
    if isinstance(exc, paramiko.AuthenticationException):
        return RemoteError(f"{where}: authentication failed for user {host.user!r} ({_tried(host)})")
    if isinstance(exc, paramiko.SSHException):
        msg = str(exc)
        if msg.startswith("No authentication methods available"):
            return RemoteError(
                f"{where}: no key to log in with: pass -i KEY, set IdentityFile in ssh config or start ssh-agent"
            )
        if msg.startswith("Error reading SSH protocol banner"):
            if isinstance(cause, TimeoutError):
                return RemoteError(f"{where}: timed out after {t:g} s waiting for the SSH banner")
            return RemoteError(f"{where}: not an SSH server (connection closed before the SSH banner)")
        if msg.startswith(("Indecipherable protocol version", "Invalid SSH banner")) or isinstance(
            exc, paramiko.IncompatiblePeer
        ):
            return RemoteError(f"{where}: not an SSH server ({shown(msg[:120])})")
        if msg.startswith(("No existing session", "Negotiation timed out")):
            return RemoteError(f"{where}: timed out after {2 * t:g} s during the SSH handshake")
        return RemoteError(f"{where}: SSH error: {shown(msg[:200])}")
    if isinstance(exc, (EOFError, ConnectionResetError)):
        return RemoteError(f"{where}: the server closed the connection during the SSH handshake")
    if isinstance(exc, TimeoutError):
        return RemoteError(f"{where}: timed out during the SSH handshake")
    if isinstance(exc, OSError):
        return RemoteError(f"{where}: {why(exc)}")
    return RemoteError(f"{where}: {type(exc).__name__}: {shown(str(exc)[:200])}")


def _tried(host: ResolvedHost) -> str:
    tried = [f"key {k}" for k in host.identity_files]
    if not host.identities_only:
        tried += ["ssh-agent", "~/.ssh/id_*"]
    return "tried " + ", ".join(tried) if tried else "no keys to try"


def shown(text: str) -> str:
    """Text from the other side, made safe for one line: control characters escaped."""
    return text if text.isprintable() else repr(text)[1:-1]


def why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return shown(str(exc)) or type(exc).__name__


def ms(t0: float) -> str:
    return f"{(time.monotonic() - t0) * 1000:.0f} ms"
