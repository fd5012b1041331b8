"""A TCP relay on 127.0.0.1 that counts the bytes each way: put it in front of a test sshd to
measure what a remote scan moves (server -> client), independently of kvtrace's own counters."""

from __future__ import annotations

import socket
import threading
from types import TracebackType

from sshd_server import HOST


class ByteRelay:
    def __init__(self, port: int) -> None:
        self.target = (HOST, port)
        self.listener = socket.create_server((HOST, 0))
        self.port = int(self.listener.getsockname()[1])
        self.server_to_client = 0
        self.client_to_server = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.target)
            for source, sink, upstream in ((client, server, True), (server, client, False)):
                thread = threading.Thread(target=self._pump, args=(source, sink, upstream), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                with self._lock:
                    if upstream:
                        self.client_to_server += len(data)
                    else:
                        self.server_to_client += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def wait_idle(self) -> None:
        """Every relayed connection has ended (its counts are final)."""
        for thread in self._threads:
            thread.join(timeout=10)

    def close(self) -> None:
        self.listener.close()

    def __enter__(self) -> ByteRelay:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
