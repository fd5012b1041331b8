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


@dataclass
class MetricsSample:
    url: str
    started: float = 0.0
    seconds: float = 0.0  # from the first to the last sample
    samples: int = 0
    gauges: dict[str, list[float]] = field(default_factory=dict)  # "name{labels}" -> one value per sample
    error: str | None = None

    def summary(self) -> list[str]:
        """One line per gauge: `name{labels} 1 for 3.0 s (4 samples)` or `... 3 -> 0 (4 samples)`."""
        if self.error:
            return [f"metrics {self.url}: {self.error}"]
        if not self.gauges:
            return [f"metrics {self.url}: no queue gauges on the page ({self.samples} samples)"]
        lines = []
        for name, values in sorted(self.gauges.items()):
            shown = [_num(v) for v in values]
            if len(set(values)) == 1:
                lines.append(f"{name} {shown[0]} for {self.seconds:.1f} s ({self.samples} samples)")
            else:
                lines.append(f"{name} {' -> '.join(shown)} over {self.seconds:.1f} s")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "seconds": round(self.seconds, 3), "samples": self.samples,
                "gauges": self.gauges, "error": self.error}


def _num(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def queue_gauges(text: str) -> dict[str, float]:
    """The samples of every metric family whose name mentions a queue, keyed `name{labels}`."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if QUEUE_WORD not in family.name:
            continue
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return found


def read_page(opener: Opener, url: MetricsUrl, timeout: float) -> str:
    """GET the page over a connection from `opener`; http.client parses the response. (Not
    HTTPConnection: it closes the connection as soon as the headers say `close`, which a
    paramiko channel, unlike a socket, honours before the body is read.)"""
    connection = opener(url.host, url.port, timeout)
    try:
        host = f"[{url.host}]" if ":" in url.host else url.host
        connection.sendall(f"GET {url.path} HTTP/1.1\r\nHost: {host}:{url.port}\r\nAccept: text/plain\r\n"
                           "Connection: close\r\n\r\n".encode("ascii"))
        response = http.client.HTTPResponse(connection)  # type: ignore[arg-type]
        response.begin()
        body = response.read()
        if response.status != 200:
            raise OSError(f"HTTP {response.status} {response.reason}")
        return body.decode("utf-8", "replace")
    finally:
        connection.close()


def tcp_opener(host: str, port: int, timeout: float) -> socket.socket:
    return socket.create_connection((host, port), timeout=timeout)


def ssh_opener(client: Any) -> Opener:
    """Connections made by the remote sshd (direct-tcpip), through an open paramiko client."""

    def open_channel(host: str, port: int, timeout: float) -> Any:
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise OSError("the SSH connection is closed")
        channel = transport.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)
        channel.settimeout(timeout)
        return channel

    return open_channel


def sample(opener: Opener, url: MetricsUrl, seconds: float = 3.0, interval: float = 1.0,
           timeout: float = 5.0) -> MetricsSample:
    """Read the page every `interval` s for `seconds` (at least once). Never raises: a page that
    cannot be read or parsed is reported in `error`, beside whatever samples were taken."""
    result = MetricsSample(url.text, started=time.time())
    count = int(max(seconds, 0.0) / interval + 1e-9) + 1 if interval > 0 else 1
    first = time.monotonic()
    for k in range(count):
        time.sleep(max(0.0, first + k * interval - time.monotonic()))
        taken = time.monotonic()
        try:
            values = queue_gauges(read_page(opener, url, timeout))
        except Exception as exc:  # noqa: BLE001 -- the gauge is extra evidence, never a scan failure
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            result.error = f"cannot read: {why}"
            return result
        result.samples += 1
        result.seconds = taken - first
        for name, value in values.items():
            result.gauges.setdefault(name, []).append(value)
    return result
