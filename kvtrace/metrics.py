"""The symptom beside the cause: sample a Prometheus page (`--metrics URL`) as the host sees it.

For a remote target the page is read through the SSH connection the fetch already verified, on
a `direct-tcpip` channel (what `ssh -L` uses): sshd opens the TCP connection on the host's side,
so nothing runs there and nothing is written. For a local target it is a plain TCP connection.
The exposition text is parsed with prometheus_client's parser; the queue gauges (every sample
whose name mentions `queue`, e.g. `sglang:num_prefill_inflight_queue_reqs`) are kept, sampled a
few times over a short window, so "stuck at 1" can be told from "busy".
"""

from __future__ import annotations

import http.client
import io
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kvtrace.errors import InputError

# A connection factory: (host, port, timeout) -> a socket-like object with sendall/makefile/close.
Opener = Callable[[str, int, float], Any]

QUEUE_WORD = "queue"


@dataclass(frozen=True)
class MetricsUrl:
    host: str
    port: int
    path: str
    text: str


def parse_metrics_url(text: str) -> MetricsUrl:
    parts = urlsplit(text)
    if parts.scheme != "http" or not parts.hostname:
        raise InputError(f"--metrics {text}: need an http://HOST[:PORT]/PATH URL (as seen from the host)")
    try:
        port = parts.port or 80
    except ValueError:
        raise InputError(f"--metrics {text}: bad port") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return MetricsUrl(parts.hostname, port, path, text)


# Bounds on a page we did not write. A real SGLang page is ~10-100 KB with a few dozen queue
# series; these leave room for large deployments while keeping a hostile page cheap.
MAX_PAGE_BYTES = 8 << 20  # the body; headers are bounded by http.client (100 lines of 64 KiB)
MAX_QUEUE_SERIES = 1000  # queue series kept per page
SHOWN_SERIES = 20  # gauge lines in the fleet summary per host; JSON holds every kept series
PAGE_TIMEOUT = 5.0  # the whole read of one page (connect, request, headers, body)


class PageError(OSError):
    """A page that could not be read whole: its gauges are unknown, not absent."""


@dataclass
class MetricsSample:
    url: str
    started: float = 0.0
    seconds: float = 0.0  # from the first to the last sample
    samples: int = 0
    gauges: dict[str, list[float]] = field(default_factory=dict)  # "name{labels}" -> one value per sample
    error: str | None = None

    def summary(self) -> list[str]:
        """One line per gauge: `name{labels} 1 for 3.0 s (4 samples)` or `... 3 -> 0 (4 samples)`;
        at most SHOWN_SERIES of them, then how many more. An error comes first, beside whatever
        was sampled before it."""
        lines = [f"metrics {self.url}: {self.error}"] if self.error else []
        if not self.gauges:
            if not self.error:
                lines.append(f"metrics {self.url}: no queue gauges on the page ({self.samples} samples)")
            return lines
        names = sorted(self.gauges)
        for name in names[:SHOWN_SERIES]:
            values = self.gauges[name]
            shown = [_num(v) for v in values[:SHOWN_SERIES]] + (["..."] if len(values) > SHOWN_SERIES else [])
            if len(set(values)) == 1:
                lines.append(f"{name} {shown[0]} for {self.seconds:.1f} s ({self.samples} samples)")
            else:
                lines.append(f"{name} {' -> '.join(shown)} over {self.seconds:.1f} s")
        if len(names) > SHOWN_SERIES:
            lines.append(f"... and {len(names) - SHOWN_SERIES} more queue series (all in --format json)")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "seconds": round(self.seconds, 3), "samples": self.samples,
                "gauges": self.gauges, "error": self.error}


def _num(value: float) -> str:
    try:
        return str(int(value)) if value == int(value) else f"{value:g}"
    except (OverflowError, ValueError, TypeError):  # inf, nan, or a non-number from a merged JSON file
        return str(value)


def _label_value(value: str) -> str:
    """A label value written back as the exposition format writes it (\\, \", \n escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _queue_lines(text: str, limit: int) -> tuple[str, int]:
    """The lines of queue families (their first `limit` samples and HELP/TYPE comments), and how
    many queue samples the page has in all: the parser never holds more than that, however
    large the page."""
    kept: list[str] = []
    samples = comments = 0
    for line in io.StringIO(text):  # lazily: a page of short lines is millions of them
        words = line.split(None, 3)
        if not words:
            continue
        comment = words[0] == "#"
        if comment:
            name = words[2] if len(words) > 2 and words[1] in ("HELP", "TYPE") else ""
        else:
            name = words[0].split("{", 1)[0]
        if QUEUE_WORD not in name:
            continue
        if comment:
            comments += 1
            if comments <= 2 * limit:
                kept.append(line.rstrip("\n"))
            continue
        samples += 1
        if samples <= limit:
            kept.append(line.rstrip("\n"))
    return "\n".join(kept) + "\n", samples


def queue_series(text: str, limit: int = MAX_QUEUE_SERIES) -> tuple[dict[str, float], int]:
    """The samples of every metric family whose name mentions a queue, keyed `name{labels}`
    (the page's first `limit` of them), and how many queue samples the page has in all."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    kept, total = _queue_lines(text, limit)
    for family in text_string_to_metric_families(kept):
        if QUEUE_WORD not in family.name:
            continue
        for sample in family.samples:
            labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return found, total


def queue_gauges(text: str) -> dict[str, float]:
    """`queue_series` without the count."""
    return queue_series(text)[0]


class _BoundedReader(io.RawIOBase):
    """The connection as a file for http.client, within one deadline and a byte cap: each wait
    is what is left of the deadline, so a page that drips a byte every few seconds ends too."""

    def __init__(self, connection: Any, deadline: float, seconds: float, cap: int) -> None:
        self.connection, self.deadline, self.seconds, self.cap = connection, deadline, seconds, cap
        self.received = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise PageError(f"page cut off: not read within {self.seconds:.1f} s ({self.received} bytes read); "
                            "gauges unknown")
        self.connection.settimeout(left)
        try:
            data = self.connection.recv(min(len(buffer), 1 << 16))
        except (TimeoutError, socket.timeout):
            raise PageError(f"page cut off: not read within {self.seconds:.1f} s ({self.received} bytes read); "
                            "gauges unknown") from None
        self.received += len(data)
        if self.received > self.cap:
            raise PageError(f"page larger than {self.cap >> 20} MiB; not read (gauges unknown)")
        buffer[: len(data)] = data
        return len(data)


class _Response:
    """What http.client.HTTPResponse needs of a socket: makefile()."""

    def __init__(self, reader: _BoundedReader) -> None:
        self.reader = reader

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self.reader)


def read_page(opener: Opener, url: MetricsUrl, timeout: float = PAGE_TIMEOUT, max_bytes: int = MAX_PAGE_BYTES) -> str:
    """GET the page over a connection from `opener` within `timeout` seconds in all and at most
    `max_bytes` of body; http.client parses the response. (Not HTTPConnection: it closes the
    connection as soon as the headers say `close`, which a paramiko channel, unlike a socket,
    honours before the body is read.) A page cut short (deadline, size, a connection lost
    before the length it declared, or an SSH connection closed under it) raises PageError."""
    deadline = time.monotonic() + timeout
    connection = opener(url.host, url.port, timeout)
    reader = _BoundedReader(connection, deadline, timeout, max_bytes + (1 << 20))
    try:
        host = f"[{url.host}]" if ":" in url.host else url.host
        connection.sendall(f"GET {url.path} HTTP/1.1\r\nHost: {host}:{url.port}\r\nAccept: text/plain\r\n"
                           "Connection: close\r\n\r\n".encode("ascii"))
        response = http.client.HTTPResponse(_Response(reader))  # type: ignore[arg-type]
        response.begin()
        if response.status != 200:
            raise OSError(f"HTTP {response.status} {response.reason}")
        try:
            body = response.read(max_bytes + 1)
        except http.client.IncompleteRead as exc:
            raise PageError(f"page cut off: the connection closed after {len(exc.partial)} bytes of the page; "
                            "gauges unknown") from None
        if len(body) > max_bytes:
            raise PageError(f"page larger than {max_bytes >> 20} MiB; not read (gauges unknown)")
        if getattr(connection, "lost", lambda: False)():
            raise PageError("page cut off: the SSH connection closed while it was read; gauges unknown")
        return body.decode("utf-8", "replace")
    finally:
        connection.close()


def tcp_opener(host: str, port: int, timeout: float) -> socket.socket:
    return socket.create_connection((host, port), timeout=timeout)


class _TunnelledConnection:
    """A direct-tcpip channel that can tell an end of page from the SSH connection closing
    under it (the fetch's deadline closes the whole connection; the channel then reads as EOF)."""

    def __init__(self, channel: Any, transport: Any) -> None:
        self.channel, self.transport = channel, transport

    def sendall(self, data: bytes) -> None:
        self.channel.sendall(data)

    def recv(self, size: int) -> bytes:
        return self.channel.recv(size)

    def settimeout(self, seconds: float) -> None:
        self.channel.settimeout(seconds)

    def lost(self) -> bool:
        return not self.transport.is_active()

    def close(self) -> None:
        self.channel.close()


def ssh_opener(client: Any) -> Opener:
    """Connections made by the remote sshd (direct-tcpip), through an open paramiko client."""

    def open_channel(host: str, port: int, timeout: float) -> Any:
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise OSError("the SSH connection is closed")
        channel = transport.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)
        channel.settimeout(timeout)
        return _TunnelledConnection(channel, transport)

    return open_channel


def sample(opener: Opener, url: MetricsUrl, seconds: float = 3.0, interval: float = 1.0,
           timeout: float = PAGE_TIMEOUT) -> MetricsSample:
    """Read the page every `interval` s for `seconds` (at least once), each read within `timeout`
    s, the whole within `seconds + timeout`. Never raises: a page that cannot be read whole or
    parsed is reported in `error`, beside whatever samples were taken before."""
    result = MetricsSample(url.text, started=time.time())
    count = int(max(seconds, 0.0) / interval + 1e-9) + 1 if interval > 0 else 1
    first = time.monotonic()
    end = first + max(seconds, 0.0) + timeout
    for k in range(count):
        time.sleep(max(0.0, first + k * interval - time.monotonic()))
        taken = time.monotonic()
        if taken >= end:  # earlier reads were slow: stop here, honestly short of the window asked
            break
        try:
            values, total = queue_series(read_page(opener, url, min(timeout, end - taken)))
        except Exception as exc:  # noqa: BLE001 -- the gauge is extra evidence, never a scan failure
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            result.error = why if isinstance(exc, PageError) else f"cannot read: {why}"
            return result
        if total > len(values) and result.error is None:
            result.error = f"the page has {total} queue series; the first {len(values)} are kept"
        result.samples += 1
        result.seconds = taken - first
        for name, value in values.items():
            if name in result.gauges or len(result.gauges) < MAX_QUEUE_SERIES:
                result.gauges.setdefault(name, []).append(value)
    return result
