"""A hostile SSH server for tests, built on paramiko's server interface.

    with HostileServer("drip") as server:   # server.port, server.client_key, server.known_hosts

It accepts the test's client key, then misbehaves in the named way on the exec channel or over
SFTP. Shapes (see SHAPES): dripping bytes, stalls before/after the stream marker, a stderr flood
after the exit status, tar members declaring huge sizes, oversized pax and GNU long-name
records, endless record streams, endless SFTP depth, and SFTP names with `..` or a leading `/`.
Everything runs in daemon threads and stops when the `with` block ends.
"""

from __future__ import annotations

import io
import os
import socket
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paramiko

from sshd_server import HOST, generate_key

MARKER = b"KVTRACE3\0"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "nixl-pin"

SHAPES = (
    "drip", "stall-before-marker", "stall-after-marker", "stderr-flood-after-exit", "huge-size",
    "pax-huge", "longname-huge", "endless-records", "endless-after-archive", "sftp-endless-depth",
    "sftp-evil-names",
)


def example_tar() -> bytes:
    """The example tree as the remote script would send it (names relative, `./` prefixed)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(EXAMPLE.rglob("*.py")):
            tar.add(path, arcname="./" + path.relative_to(EXAMPLE).as_posix())
    return out.getvalue()


def example_records() -> bytes:
    names = [path.relative_to(EXAMPLE).as_posix() for path in sorted(EXAMPLE.rglob("*.py"))]
    return b"".join(b"R\0./" + n.encode() + b"\0" for n in names) + b"E\0"


def tar_header(name: bytes, size: int, flag: bytes) -> bytes:
    block = bytearray(512)
    block[0 : len(name)] = name
    block[100:108] = b"0000644\0"
    block[108:116] = b"0000000\0"
    block[116:124] = b"0000000\0"
    if size < 8**11:
        block[124:136] = b"%011o\0" % size
    else:  # base-256, as GNU tar writes huge sizes
        block[124] = 0x80
        block[125:136] = size.to_bytes(11, "big")
    block[136:148] = b"00000000000\0"
    block[156:157] = flag
    block[257:265] = b"ustar  \0"
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


class _Auth(paramiko.ServerInterface):
    def __init__(self, owner: HostileServer) -> None:
        self.owner = owner

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        if self.owner.shape.startswith("sftp-"):
            return False  # no commands: the client falls back to SFTP
        self.owner.commands.append(command)
        threading.Thread(target=self.owner.serve_exec, args=(channel,), daemon=True).start()
        return True


class _Handle(paramiko.SFTPHandle):
    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]

    def stat(self) -> paramiko.SFTPAttributes:
        return _attrs("x", 0o100644, len(self.data))


def _attrs(name: str, mode: int, size: int = 0) -> paramiko.SFTPAttributes:
    attr = paramiko.SFTPAttributes()
    attr.filename, attr.st_mode, attr.st_size = name, mode, size
    attr.st_uid = attr.st_gid = 0
    attr.st_mtime = attr.st_atime = 0
    return attr


class _Sftp(paramiko.SFTPServerInterface):
    """`sftp-endless-depth`: every folder holds 30 .py files and one more folder, forever.
    `sftp-evil-names`: the example tree, plus names with `..` and a leading `/` at the top."""

    def __init__(self, server: Any, *args: Any, owner: HostileServer, **kw: Any) -> None:
        super().__init__(server, *args, **kw)
        self.owner = owner

    def _real(self, path: str) -> Path:
        rel = os.path.normpath("/" + path).lstrip("/")
        rel = rel[len("srv/tree"):].lstrip("/") if rel.startswith("srv/tree") else rel
        return EXAMPLE / rel if rel not in ("", ".") else EXAMPLE

    def stat(self, path: str) -> Any:
        if self.owner.shape == "sftp-endless-depth":
            return _attrs(path, 0o040755) if not path.endswith(".py") else _attrs(path, 0o100644, 8)
        real = self._real(path)
        if not real.exists():
            return paramiko.SFTP_NO_SUCH_FILE
        st = real.stat()
        return _attrs(real.name, st.st_mode, st.st_size)

    lstat = stat

    def canonicalize(self, path: str) -> str:
        return "/" + os.path.normpath("/" + path).lstrip("/")

    def list_folder(self, path: str) -> Any:
        if self.owner.shape == "sftp-endless-depth":
            return [_attrs("d", 0o040755)] + [_attrs(f"m{i:02d}.py", 0o100644, 8) for i in range(30)]
        real = self._real(path)
        out = [_attrs(p.name, p.stat().st_mode, p.stat().st_size) for p in sorted(real.iterdir())]
        if real == EXAMPLE:
            out += [_attrs("../../../etc/passwd.py", 0o100644, 10), _attrs("/abs/evil.py", 0o100644, 10),
                    _attrs("..", 0o040755), _attrs("sub/../../x.py", 0o100644, 10)]
        return out

    def open(self, path: str, flags: int, attr: Any) -> Any:
        if self.owner.shape == "sftp-endless-depth":
            return _Handle(b"x = 1\n\n\n")
        if ".." in path.split("/") or path.startswith("//") or "/abs/" in path:
            self.owner.evil_opened.append(path)
            return _Handle(b"EVIL = 1\n")
        real = self._real(path)
        if not real.is_file():
            return paramiko.SFTP_NO_SUCH_FILE
        return _Handle(real.read_bytes())


class HostileServer:
    def __init__(self, shape: str) -> None:
        assert shape in SHAPES, shape
        self.shape = shape
        self.dir = Path(tempfile.mkdtemp(prefix="kvtrace-hostile-"))
        self.client_key = self.dir / "client"
        generate_key(self.client_key)
        key_path = self.dir / "host"
        line = generate_key(key_path, "host")
        self.host_key = paramiko.Ed25519Key.from_private_key_file(str(key_path))
        self.listener = socket.socket()
        self.listener.bind((HOST, 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.known_hosts = self.dir / "known_hosts"
        self.known_hosts.write_text(f"[{HOST}]:{self.port} {' '.join(line.split()[:2])}\n")
        self.stop = threading.Event()
        self.transports: list[paramiko.Transport] = []
        self.commands: list[bytes] = []
        self.evil_opened: list[str] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.listener.close()
        for transport in self.transports:
            transport.close()
        self.thread.join(timeout=5)

    def target(self, path: str = "/srv/tree") -> str:
        return f"kvt@{HOST}:{self.port}:{path}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(self.host_key)
            transport.set_subsystem_handler("sftp", paramiko.SFTPServer, _Sftp, owner=self)
            self.transports.append(transport)
            try:
                transport.start_server(server=_Auth(self))
            except (paramiko.SSHException, EOFError, OSError):
                continue

    # -- the exec channel -----------------------------------------------------------------

    def _send(self, chan: paramiko.Channel, data: bytes) -> bool:
        try:
            chan.sendall(data)
            return True
        except (OSError, EOFError, paramiko.SSHException):
            return False

    def _stall(self) -> None:
        self.stop.wait()

    def serve_exec(self, chan: paramiko.Channel) -> None:
        shape = self.shape
        start = MARKER + b"/srv/tree\0\0"  # root, then no name search (the client asks for all)
        if shape == "drip":
            payload = start + example_records()
            for byte in payload * 1000:
                if self.stop.is_set() or not self._send(chan, bytes([byte])):
                    return
                time.sleep(0.2)
        elif shape == "stall-before-marker":
            self._stall()
        elif shape == "stall-after-marker":
            self._send(chan, start)
            self._stall()
        elif shape == "stderr-flood-after-exit":
            self._send(chan, start + example_records() + example_tar())
            chan.send_exit_status(0)
            line = b"\x1b[31mflood\x1b[0m " * 100 + b"\n"
            while not self.stop.is_set():
                try:
                    chan.sendall_stderr(line)
                except (OSError, EOFError, paramiko.SSHException):
                    return
        elif shape == "huge-size":
            self._send(chan, start + b"R\0./disaggregation/x.py\0E\0" + tar_header(b"./disaggregation/x.py", 10**12, b"0"))
            self._endless(chan, bytes(1 << 16))
        elif shape == "pax-huge":
            self._send(chan, start + b"E\0" + tar_header(b"./PaxHeaders/x", 400_000, b"x"))
            self._endless(chan, b"%d path=" % 400_000 + b"a" * (1 << 16))
        elif shape == "longname-huge":
            self._send(chan, start + b"E\0" + tar_header(b"././@LongLink", 200 * 1024 * 1024, b"L"))
            self._endless(chan, b"a" * (1 << 16))
        elif shape == "endless-records":
            self._send(chan, start)
            i = 0
            while self._send(chan, b"".join(b"R\0./f%09d.py\0" % (i + k) for k in range(1000))):
                i += 1000
        elif shape == "endless-after-archive":
            self._send(chan, start + example_records() + example_tar())
            self._endless(chan, bytes(1 << 16))
        try:
            chan.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the client hung up first

    def _endless(self, chan: paramiko.Channel, chunk: bytes) -> None:
        while not self.stop.is_set() and self._send(chan, chunk):
            pass
