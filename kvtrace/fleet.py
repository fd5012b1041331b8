"""Several targets at once: bounded concurrent fetches, one analysis per distinct tree, a fleet
summary (per host: SGLang version, tree digest, verdicts, the queue gauges), hosts grouped by
identical trees, and the exit code of the worst host. `kvtrace merge` builds the same summary
from JSON reports made elsewhere (Ansible, a job scheduler).

Fetches run in a thread pool (`--jobs`): they wait on the network. Analysis holds the GIL, so it
runs one at a time under a lock, which also makes a second host with the same tree a memo hit.
Each host is bounded by the SSH connect and read timeouts; a failing host is reported as one line
and the others are still scanned.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtrace.errors import (EXIT_CLEAN, EXIT_FINDINGS, EXIT_INCOMPLETE, EXIT_INPUT, EXIT_INTERNAL, AmbiguousTarget,
                            InputError, KvtraceError)
from kvtrace.gate import DEFAULT_FAIL_ON, fails_on
from kvtrace.model import Consequence, FetchLimits, FetchResult, Report
from kvtrace.safe_text import plain

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

# Worst first: nothing analysed, then analysed but incomplete, then findings, then clean.
EXIT_BADNESS = {EXIT_INTERNAL: 4, EXIT_INPUT: 3, EXIT_INCOMPLETE: 2, EXIT_FINDINGS: 1, EXIT_CLEAN: 0}

Log = Callable[[str], None]


@dataclass
class HostResult:
    """One target's outcome: its report(s), or the error that stopped it, and the exit code."""

    target: str
    report: Report | None = None
    error: str | None = None
    exit_code: int = EXIT_INPUT
    sglang_version: str | None = None
    metrics: Any = None  # kvtrace.metrics.MetricsSample
    cached: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    extra_reports: list[Report] = field(default_factory=list)  # --all: the other packages under the target
    exception: BaseException | None = None  # an internal error (a bug in kvtrace), for -v

    @property
    def reports(self) -> list[Report]:
        return ([self.report] if self.report is not None else []) + self.extra_reports

    @property
    def tree(self) -> str | None:
        return tree_digest_of(self.report) if self.report is not None else None


def tree_digest_of(report: Report) -> str:
    """sha256 of the analysed files' (path, sha256) pairs: equal digests, equal trees."""
    digest = hashlib.sha256()
    for f in sorted(report.files, key=lambda f: f.path):
        digest.update(f"{f.path}\0{f.sha256}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def exit_code_for(report: Report, fail_on: str) -> int:
    if report.incomplete:
        return EXIT_INCOMPLETE
    from kvtrace.gate import failing

    return EXIT_FINDINGS if failing(report.findings, fail_on) else EXIT_CLEAN


def worst_exit(codes: Iterable[int]) -> int:
    return max(codes, key=lambda c: EXIT_BADNESS.get(c, 3), default=EXIT_CLEAN)


def read_hosts_file(path: Path) -> list[str]:
    """One target per line; blank lines and `#` comments (whole-line or after a space) ignored."""
    from kvtrace.userfiles import TEXT_CAP, read_text

    text = read_text(path, "--hosts", TEXT_CAP)  # bounded: a FIFO or /dev/zero is one line, not a hang
    targets = []
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            targets.append(line)
    if not targets:
        raise InputError(f"--hosts {path}: no targets in the file")
    return targets


# --- SGLang version from installed package metadata ------------------------------------------

_DIST_INFO = re.compile(r"^sglang-[^/]*\.dist-info$", re.IGNORECASE)


def version_from_metadata(text: str) -> str | None:
    """`Version:` of a dist-info METADATA file whose `Name:` is sglang."""
    name = re.search(r"^Name:\s*(\S+)\s*$", text, re.MULTILINE)
    version = re.search(r"^Version:\s*(\S+)\s*$", text, re.MULTILINE)
    if name and version and name.group(1).lower().replace("_", "-") == "sglang":
        return version.group(1)
    return None


def metadata_dirs(target_path: str, root: str) -> list[str]:
    """Folders that would hold `sglang-*.dist-info` if the target is inside a site-packages
    install: the parents of the `sglang` package folder that contains the located root."""
    full = f"{target_path.rstrip('/')}/{root}" if root else target_path.rstrip("/")
    parts = full.split("/")
    dirs = []
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] == "sglang":
            dirs.append("/".join(parts[:i]) or "/")
    if target_path.rstrip("/"):
        dirs.append(target_path.rstrip("/"))  # the target is site-packages itself
    return list(dict.fromkeys(dirs))


def local_sglang_version(target_path: str, root: str) -> str | None:
    from kvtrace.userfiles import read_bytes

    for folder in metadata_dirs(str(Path(target_path).resolve()), root):
        try:
            candidates = sorted(p for p in Path(folder).iterdir() if _DIST_INFO.match(p.name))
        except OSError:
            continue
        for dist in candidates:
            try:  # the scanned tree's file: bounded, and a FIFO or a link to /dev/zero is skipped
                data = read_bytes(dist / "METADATA", "METADATA", 4 * 1024 * 1024)
            except KvtraceError:
                continue
            found = version_from_metadata(data.decode("utf-8", errors="replace"))
            if found:
                return found
    return None


MAX_LISTED = 20_000  # entries read from one remote folder looking for the dist-info (site-packages: hundreds)
MAX_METADATA = 1 << 20


def remote_sglang_version(client: Any, target_path: str, root: str, read_timeout: float = 60.0) -> str | None:
    """The same look-up over SFTP reads (READDIR + one small file): read-only, no command. The
    whole look-up ends within `read_timeout` (it is extra information, never worth a wait) and
    reads at most MAX_LISTED entries of a folder."""
    import paramiko

    end = time.monotonic() + read_timeout

    def left() -> float:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("version look-up")
        return remaining

    try:
        transport = client.get_transport()
        channel = transport.open_session(timeout=left())
        channel.settimeout(left())  # before the SFTP version exchange, which paramiko waits on unbounded
        channel.invoke_subsystem("sftp")
        sftp = paramiko.SFTPClient(channel)
    except Exception:  # noqa: BLE001 -- no SFTP subsystem, or too slow: the version is simply unknown
        return None
    try:
        for folder in metadata_dirs(target_path, root):
            try:
                names = _dist_info_names(sftp, folder, left)
            except TimeoutError:
                return None
            except Exception:  # noqa: BLE001
                continue
            for name in names:
                try:
                    channel.settimeout(left())
                    with sftp.open(f"{folder.rstrip('/')}/{name}/METADATA", "rb") as handle:
                        found = version_from_metadata(handle.read(MAX_METADATA).decode("utf-8", "replace"))
                except TimeoutError:
                    return None
                except Exception:  # noqa: BLE001
                    continue
                if found:
                    return found
    finally:
        sftp.close()
    return None


def _dist_info_names(sftp: Any, folder: str, left: Callable[[], float]) -> list[str]:
    """`sglang-*.dist-info` names in `folder`, from at most MAX_LISTED entries (paramiko's
    listdir keeps every entry of a folder, however many the server sends). paramiko's READDIR
    loop, as sftp_fetch runs it, with a bound and a clock."""
    import paramiko
    from paramiko.sftp import CMD_CLOSE, CMD_HANDLE, CMD_NAME, CMD_OPENDIR, CMD_READDIR

    channel = sftp.get_channel()
    channel.settimeout(left())
    kind, msg = sftp._request(CMD_OPENDIR, folder)
    if kind != CMD_HANDLE:
        return []
    handle = msg.get_binary()
    names: list[str] = []
    seen = 0
    try:
        while seen < MAX_LISTED:
            channel.settimeout(left())
            try:
                kind, msg = sftp._request(CMD_READDIR, handle)
            except EOFError:  # end of the folder
                break
            if kind != CMD_NAME:
                break
            for _ in range(msg.get_int()):
                name = msg.get_string().decode("utf-8", "surrogateescape")
                msg.get_string()  # the ls -l style "longname"
                paramiko.SFTPAttributes._from_msg(msg)
                seen += 1
                if _DIST_INFO.match(name):
                    names.append(name)
                if seen >= MAX_LISTED:
                    break
    finally:
        try:
            channel.settimeout(min(1.0, max(0.1, left())))
            sftp._request(CMD_CLOSE, handle)
        except Exception:  # noqa: BLE001 -- the connection is gone or the clock ran out: nothing more to do
            pass
    return sorted(names)


# --- running ---------------------------------------------------------------------------------


class Progress:
    """Per-host status lines on a terminal (rich), nothing otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import Progress as RichProgress, SpinnerColumn, TextColumn, TimeElapsedColumn

            # A target's text is the user's or a hosts file's: shown as written, never as markup.
            self._progress = RichProgress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                                          TimeElapsedColumn(), console=Console(stderr=True, markup=False, emoji=False),
                                          transient=True)
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)

    def update(self, target: str, stage: str) -> None:
        if self._progress is None:
            return
        description = plain(f"{target}: {stage}")
        with self._lock:
            if target not in self._tasks:
                self._tasks[target] = self._progress.add_task(description, total=None)
            else:
                self._progress.update(self._tasks[target], description=description)


@dataclass
class FleetOptions:
    """What every target of a run is scanned with: packs and settings per target, limits, the cache."""

    packs: dict[str, Any]  # target -> rules pack, or a tuple of packs (--role all: a report each)
    settings: dict[str, Any]  # target -> kvtrace.config.Settings (select/ignore, fail_on, baseline)
    limits: FetchLimits = FetchLimits()
    ssh: dict[str, Any] = field(default_factory=dict)
    jobs: int = 8
    cache: Any = None  # kvtrace.cache.Cache or None (--no-cache)
    metrics_url: str | None = None
    metrics_seconds: float = 3.0
    metrics_interval: float = 1.0
    after_scan: Callable[[str, Report], None] | None = None  # e.g. marking findings against a baseline
    scan_all: bool = False  # several packages under one target: scan each (else an error listing them)


def _packs_of(options: FleetOptions, target: str) -> tuple:
    """The packs a target is scanned with: one, or each role's (`--role all`: one report each)."""
    packs = options.packs[target]
    return packs if isinstance(packs, tuple) else (packs,)


def _fetch_pack(packs: tuple) -> Any:
    """What the fetch keeps files for: the pack, or for several packs that share the enum and the
    package folder, the union of their queues (else everything: None)."""
    if len(packs) == 1:
        return packs[0]
    if len({(p.enum, p.package_dir) for p in packs}) != 1:
        return None
    return SimpleNamespace(enum=packs[0].enum, package_dir=packs[0].package_dir, queue=packs[0].queue,
                           queues=tuple(q for p in packs for q in (p.queues or (p.queue,))))


def run_fleet(targets: list[str], options: FleetOptions, log: Log | None = None,
              progress: Progress | None = None) -> list[HostResult]:
    """Scan every target; results come back in the order of `targets`. `progress` is shown from
    here (not yet entered: its thread must not exist when the analysis server is forked)."""
    url = None
    if options.metrics_url:
        from kvtrace.metrics import parse_metrics_url

        url = parse_metrics_url(options.metrics_url)
    progress = progress or Progress(False)
    fleet = _Fleet(options, log or (lambda _m: None), progress, url)
    if len(targets) == 1:
        with progress:
            return [fleet.one(targets[0])]
    from concurrent.futures import Future, ThreadPoolExecutor  # here: a one-target run (the warm rescan) never needs it

    from kvtrace.beside import Server
    from kvtrace.parse import shared_parses

    # Identical trees are analysed once (_Fleet.memo); files identical across different trees are
    # parsed once. The trees are analysed in a forked server while the threads fetch the next hosts
    # (forked first, while this process has one thread: paramiko's and rich's come after).
    with shared_parses(), Server(fleet.analyse_request) as server, progress, \
            ThreadPoolExecutor(max_workers=1) as analysis, ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        fleet.server = server
        done = list(pool.map(lambda target: fleet.start(target, analysis), targets))
        return [d.result() if isinstance(d, Future) else d for d in done]


def _fetched_request(fetched: FetchResult, target: str, position: int, root: str | None, key: str) -> bytes:
    """A tree and what to scan it with, for the analysis server: a JSON head (the pack and
    settings are named by the target and the pack's position, as the server holds the same
    options), then the files' bytes back to back."""
    import json

    head = json.dumps({"target": target, "position": position, "root": root, "key": key, "label": fetched.target,
                       "notes": fetched.notes,
                       "files": [[f.path, f.sha256, f.status, f.error, len(f.data)] for f in fetched.files]}).encode()
    return len(head).to_bytes(8, "big") + head + b"".join(f.data for f in fetched.files)


def _request_fetched(request: bytes) -> tuple[FetchResult, dict[str, Any]]:
    import json

    from kvtrace.model import SourceFile

    size = int.from_bytes(request[:8], "big")
    head = json.loads(request[8: 8 + size])
    at, files = 8 + size, []
    for path, sha256, status, error, length in head["files"]:
        files.append(SourceFile(path, request[at: at + length], sha256, status, error))
        at += length
    return FetchResult(head["label"], files, head["notes"]), head


@dataclass
class _Fleet:
    """What the hosts of one run share: the options, the metrics page asked for, the reports of
    trees already analysed (by content) and the lock that lets one analysis run at a time."""

    options: FleetOptions
    say: Log
    show: Progress
    url: Any  # kvtrace.metrics' parsed --metrics URL, or None
    memo: dict[str, bytes] = field(default_factory=dict)
    analysis_lock: threading.Lock = field(default_factory=threading.Lock)
    server: Any = None  # kvtrace.beside.Server analysing trees beside the fetches, or None

    def analyse_request(self, request: bytes) -> bytes:
        """In the analysis server: one tree scanned, answered as the cache keeps a report."""
        from kvtrace.cache import frozen_scan

        fetched, head = _request_fetched(request)
        pack = _packs_of(self.options, head["target"])[head["position"]]
        return frozen_scan(fetched, pack, self.options.settings.get(head["target"]), head["root"], head["key"])

    def _elsewhere(self, target: str, position: int, root: str | None) -> Callable[[FetchResult, str], bytes | None] | None:
        server = self.server
        if server is None:
            return None
        return lambda fetched, key: server.call(_fetched_request(fetched, target, position, root, key))

    def one(self, target: str) -> HostResult:
        """One host: fetched, analysed with each of its packs, its facts stamped on its reports;
        a failure is this host's error line, never the run's."""
        result = self.start(target, None)
        assert isinstance(result, HostResult)  # nothing was handed on
        return result

    def start(self, target: str, analysis: Executor | None) -> HostResult | Future[HostResult]:
        """`one`; with `analysis` (one thread), what follows the fetch is left to it once the tree
        is here: this thread is free to fetch the next host while trees are analysed in turn."""
        result = HostResult(target)
        started = time.perf_counter()
        found: dict[str, Any] = {}  # what the open connection told: client, version, metrics
        with self._failures(target, result, started):
            fetched = self._fetch(target, found)
            result.timings["fetch"] = time.perf_counter() - started
        if result.error is not None:
            return result
        if analysis is not None:
            return analysis.submit(self._rest, target, result, fetched, found, started)
        return self._rest(target, result, fetched, found, started)

    def _rest(self, target: str, result: HostResult, fetched: FetchResult, found: dict[str, Any],
              started: float) -> HostResult:
        with self._failures(target, result, started):
            analysed = time.perf_counter()
            packs, roots = self._analyse(target, fetched, result)
            result.timings["analyse"] = time.perf_counter() - analysed
            result.sglang_version = found.get("version")
            if "client" not in found:  # a local target
                self._local_facts(target, result, found)
            result.metrics = found.get("metrics")
            self._stamp(target, result, packs, roots)
        return result

    @contextmanager
    def _failures(self, target: str, result: HostResult, started: float) -> Iterator[None]:
        """A failure in the block is the host's error line; the host is done when it fails or
        leaves the block with its report (the fetch's block, when it succeeds, is not the end)."""
        try:
            yield
        except KvtraceError as exc:
            result.error = str(exc)
        except Exception as exc:  # noqa: BLE001 -- a bug in kvtrace: one line for this host only
            result.error = f"internal error on {target}: {type(exc).__name__}: {exc}"
            result.exit_code, result.exception = EXIT_INTERNAL, exc
        if result.error is not None or result.report is not None:
            result.timings["total"] = time.perf_counter() - started
            self.show.update(target, "done" if result.error is None else "failed")

    def _fetch(self, target: str, found: dict[str, Any]) -> FetchResult:
        options, url = self.options, self.url

        def after_fetch(client: Any, fetched: FetchResult) -> None:
            # On the open, verified connection: the page behind it and the installed version.
            if url is not None:
                from kvtrace.metrics import sample, ssh_opener

                self.show.update(target, "sampling metrics")
                found["metrics"] = sample(ssh_opener(client), url, options.metrics_seconds, options.metrics_interval)
            found["client"] = client

        self.show.update(target, "connecting and fetching")
        from kvtrace.fetch import fetch_target

        return fetch_target(target, options.limits, options.ssh, lambda m: self.say(f"{target}: {m}"),
                            after_fetch=_remember(found, after_fetch, float(options.ssh.get("read_timeout", 60.0))),
                            pack=_fetch_pack(_packs_of(options, target)))

    def _analyse(self, target: str, fetched: FetchResult, result: HostResult) -> tuple[tuple, list[str]]:
        """Each pack on each package found (one, unless --all); the reports and the exit code go
        on `result`. Returns the packs and package roots, in the reports' order."""
        options = self.options
        self.show.update(target, "analysing")
        from kvtrace.cache import scan_cached

        from kvtrace.scan import locate_packages

        settings = options.settings.get(target)
        packs = _packs_of(options, target)
        roots = locate_packages(fetched.files, packs[0], fetched.target)
        if len(roots) > 1 and not options.scan_all:
            raise AmbiguousTarget(fetched.target, roots)
        with self.analysis_lock:
            # One package: scan_fetched finds it again (and the cache key stays the one-package key).
            scanned = [scan_cached(fetched, pack, options.cache, self.memo, settings=settings, root=scan_root,
                                   elsewhere=self._elsewhere(target, position, scan_root))
                       for position, pack in enumerate(packs) for root in roots
                       for scan_root in [root if len(roots) > 1 else None]]
        result.report, result.cached = scanned[0]
        result.extra_reports = [report for report, _ in scanned[1:]]
        for report in result.reports:
            if options.after_scan is not None:
                options.after_scan(target, report)
        fail_on = getattr(settings, "fail_on", None) or DEFAULT_FAIL_ON
        result.exit_code = worst_exit(exit_code_for(report, fail_on) for report in result.reports)
        return packs, roots

    def _local_facts(self, target: str, result: HostResult, found: dict[str, Any]) -> None:
        """A local target: the installed version read beside the package, the metrics page over TCP."""
        from kvtrace.target import SshTarget, parse_target

        if result.report is not None and not isinstance(parse_target(target), SshTarget):  # (set by _analyse)
            result.sglang_version = local_sglang_version(target, result.report.root)
        if self.url is not None:
            from kvtrace.metrics import sample, tcp_opener

            self.show.update(target, "sampling metrics")
            found["metrics"] = sample(tcp_opener, self.url, self.options.metrics_seconds, self.options.metrics_interval)

    def _stamp(self, target: str, result: HostResult, packs: tuple, roots: list[str]) -> None:
        """What the cache cannot know, written on each report: the filters' source and the host's facts."""
        settings = self.options.settings.get(target)
        # Each report names the role whose pack judged it (in _analyse's order): --role all's
        # reports, and a scan of the decode side alone (its header says so); the default
        # (prefill) scan and a pack of one's own, alone, none.
        roles = [_role_of(pack) if len(packs) > 1 or _other_role(pack) else None for pack in packs for _ in roots]
        for report, role in zip(result.reports, roles):
            # The cache keys on what is selected, not on which file said so: stamp it per run.
            report.filters = replace(report.filters, config=getattr(settings, "source", None))
            report.host_facts = {
                "host": _host_label(target),
                "sglang_version": result.sglang_version,
                **({"metrics": result.metrics.to_dict()} if result.metrics is not None else {}),
                **({"role": role} if role else {}),
            }


def _host_label(target: str) -> str:
    from kvtrace.target import SshTarget, parse_target

    parsed = parse_target(target)
    if isinstance(parsed, SshTarget):
        return parsed.label
    # The name gethostname() returns, without importing socket on a local (often cached) scan.
    return os.uname().nodename


def _remember(found: dict[str, Any], then: Callable[[Any, FetchResult], None],
              read_timeout: float = 60.0) -> Callable[[Any, FetchResult], None]:
    """Also read the installed SGLang version while the connection is open."""

    def hook(client: Any, fetched: FetchResult) -> None:
        then(client, fetched)
        from kvtrace.target import parse_target

        target = parse_target(fetched.target)
        root = _root_guess(fetched)
        found["version"] = remote_sglang_version(client, getattr(target, "path", ""), root, read_timeout)

    return hook


def _root_guess(fetched: FetchResult) -> str:
    """Where the disaggregation folder is, before analysis: enough to find the dist-info."""
    for f in fetched.files:
        parts = f.path.split("/")
        if "sglang" in parts[:-1]:
            return "/".join(parts[: parts.index("sglang") + 1])
    return ""


# --- the summary -------------------------------------------------------------------------------


@dataclass
class HostSummary:
    """What the fleet summary shows for one host: built from a live result or a JSON report."""

    target: str
    exit_code: int
    error: str | None = None
    sglang_version: str | None = None
    tree: str | None = None
    verdicts: list[str] = field(default_factory=list)
    gauges: list[str] = field(default_factory=list)


def verdicts_of(findings: Iterable[dict[str, Any]]) -> list[str]:
    from kvtrace.rulemeta import consequence_of  # the rule table: only a fleet summary reads it, not a scan

    lines = []
    for f in findings:
        # The rule is in the brackets; what follows names what the finding is about (the backend,
        # else the queue, else the function it is in; never a made-up "queue") and the state.
        subject = f.get("backend") or f.get("queue") or (f"{f['function']}()" if f.get("function") else "")
        pins = consequence_of(str(f.get("rule"))) is Consequence.PINNED
        what = f"{subject} can pin {f.get('state')}" if pins and f.get("backend") \
            else " ".join(p for p in (subject, f.get("state")) if p)
        if f.get("premise"):  # a finding that holds only under a premise says which, as the report does
            what += f" only if {f.get('premise')}"
        line = f"{f.get('severity')}[{f.get('rule')}] {what} ({f.get('path')}:{f.get('line')})"
        if line not in lines:
            lines.append(line)
    return lines


def _other_role(pack: Any) -> bool:
    """A bundled role pack other than the default one (the decode side)."""
    from kvtrace.packs import DEFAULT_PACK, ROLE_PACKS

    return pack.name in ROLE_PACKS.values() and pack.name != DEFAULT_PACK and pack.path is None


def _role_of(pack: Any) -> str:
    """The role a bundled role pack judges (`sglang-decode` -> decode); else the pack's name."""
    from kvtrace.packs import ROLE_PACKS

    return next((role for role, name in ROLE_PACKS.items() if name == pack.name), pack.name)


def report_label(report: Report, reports: Iterable[Report]) -> str:
    """The target, and the package when the run has several reports of that target (--all): each
    line about a report says which one it is."""
    twins = [other for other in reports if other.target == report.target]
    if len(twins) < 2:
        return report.target
    role = (report.host_facts or {}).get("role")
    if role and len({other.root for other in twins}) == 1:  # --role all: one package, a report per role
        return f"{report.target} ({role})"
    return f"{report.target} (package {report.root or '.'}{', ' + str(role) if role else ''})"


def summarise(result: HostResult) -> HostSummary:
    return summaries(result)[0]


def summaries(result: HostResult, fail_on: str = DEFAULT_FAIL_ON) -> list[HostSummary]:
    """One summary per report of the target: --all scans several packages under it, each named,
    each with its own exit code at `fail_on`."""
    if result.report is None:
        return [HostSummary(result.target, result.exit_code, error=result.error)]
    out = []
    gauges = result.metrics.summary() if result.metrics is not None else []
    from kvtrace.report.places import Places

    for report in result.reports:
        shown = Places(report)  # a summary line's path:line opens from where the user stands
        findings = [{"rule": f.rule, "severity": f.severity, "backend": f.backend, "state": f.state,
                     "path": shown.path(f.path), "line": f.line, "premise": f.premise, "queue": f.queue,
                     "function": f.function} for f in report.findings]
        version = result.sglang_version if report is result.report else \
            (report.version.version if report.version else None)
        code = result.exit_code if len(result.reports) == 1 else exit_code_for(report, fail_on)
        out.append(HostSummary(report_label(report, result.reports), code, None, version,
                               tree_digest_of(report), verdicts_of(findings), gauges if report is result.report else []))
    return out


def render_summary(hosts: list[HostSummary], width: int = 1000) -> str:
    """Plain text, one block per host then the groups of identical trees; greppable when piped
    to a file (the default width folds nothing), folded at spaces to a terminal's `width`."""
    from kvtrace.diff import fold

    count = f"{len(hosts)} host" + ("s" if len(hosts) != 1 else "")
    lines = [f"Fleet: {count}, exit {worst_exit(h.exit_code for h in hosts)} (worst host)"]
    for h in hosts:
        if h.error is not None:
            lines.append(f"  {h.target}  FAILED (exit {h.exit_code}): {h.error}")
            continue
        version = h.sglang_version or "version unknown"
        verdict = "clean" if not h.verdicts else f"{len(h.verdicts)} findings"
        lines.append(f"  {h.target}  sglang {version}  tree {(h.tree or '?')[:12]}  exit {h.exit_code}  {verdict}")
        lines.extend(f"    gauge: {g}" for g in h.gauges)
        lines.extend(f"    {v}" for v in h.verdicts)
    groups: dict[str, list[str]] = {}
    for h in hosts:
        if h.tree is not None:
            groups.setdefault(h.tree, []).append(h.target)
    if groups:
        lines.append(f"Identical trees: {len(groups)} distinct")
        for tree, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            count = f"{len(members)} host" + ("s" if len(members) > 1 else "")
            lines.append(f"  tree {tree[:12]} ({count}): {', '.join(members)}")
    # Host names, paths, versions and gauge labels come from targets, trees, pages and JSON files
    # made elsewhere: each line is one line, with no control character reaching the terminal.
    return "".join(fold(plain(line), width) + "\n" for line in lines)


def summary_json(hosts: list[HostSummary]) -> dict[str, Any]:
    return {
        "exit_code": worst_exit(h.exit_code for h in hosts),
        "hosts": [h.__dict__ for h in hosts],
    }


# --- merge -------------------------------------------------------------------------------------


def summaries_from_json(data: Any, source: str, fail_on: str = DEFAULT_FAIL_ON) -> list[HostSummary]:
    """Host summaries from one JSON file: a kvtrace/1 report, a list of them, or kvtrace/2's
    {"schema": "kvtrace/2", "reports": [...]}. Every report is checked against the schema of its
    version first (kvtrace.report.schema for kvtrace/2): `"complete": 0` or `"false"` is an
    error, never a host that passed."""
    reports = _merge_reports(data, source)
    hosts = []
    for report in reports:
        files = report["files"]
        digest = hashlib.sha256()
        for f in sorted(files, key=lambda f: f["path"]):
            digest.update(f"{f['path']}\0{f['sha256']}\n".encode("utf-8", "surrogateescape"))
        findings = report.get("findings", [])
        incomplete = report["complete"] is False if "complete" in report else \
            any(f.get("status") != "ok" for f in files) or bool(report.get("problems"))
        code = EXIT_INCOMPLETE if incomplete else EXIT_FINDINGS if any(
            fails_on(f.get("severity", "note"), fail_on) for f in findings) else EXIT_CLEAN
        metrics = report.get("metrics")
        gauges = []
        if isinstance(metrics, dict):
            from kvtrace.metrics import MetricsSample

            gauges = MetricsSample(metrics.get("url", "?"), seconds=metrics.get("seconds", 0.0),
                                   samples=metrics.get("samples", 0), gauges=metrics.get("gauges") or {},
                                   error=metrics.get("error")).summary()
        on = _opened_on(report)  # the file on the host that made the report, not one here
        findings = [{**f, "path": on + str(f["path"])} if isinstance(f, dict) and f.get("path") else f for f in findings]
        hosts.append(HostSummary(str(report.get("host") or report["target"]), code, None,
                                 report.get("sglang_version"), digest.hexdigest(), verdicts_of(findings), gauges))
    return hosts


def _opened_on(report: dict[str, Any]) -> str:
    """What goes before a report's target-relative path so that it names the file on the machine
    it was read on: `user@host:/srv/sglang/` for a scan over SSH, `<host>:<target>/` for a local
    scan on a host that named itself (the target as given there: relative to where it ran when
    it was typed so), `<target>/` when no host is known."""
    from kvtrace.target import SshTarget, parse_target

    target = str(report["target"])
    try:
        parsed = parse_target(target)
    except Exception:  # noqa: BLE001 -- a label that is not a target: its paths as the report has them
        return ""
    if isinstance(parsed, SshTarget):
        host, folder = parsed.display, parsed.path
    else:
        host, folder = str(report.get("host") or ""), target
    if folder.endswith(".py"):  # a file scanned alone: its findings' paths are its name
        folder = folder.rpartition("/")[0]
    folder = "" if folder in ("", ".") else folder.rstrip("/") + "/"
    return f"{host}:{folder}" if host else folder


# A kvtrace/1 report (before kvtrace/2): the keys a merge reads.
_MERGE_V1_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["schema", "target", "files", "findings"],
    "properties": {
        "schema": {"const": "kvtrace/1"},
        "target": {"type": "string"},
        "host": {"type": "string"},
        "files": {"type": "array", "items": {"type": "object", "required": ["path", "sha256", "status"], "properties": {
            "path": {"type": "string"}, "sha256": {"type": "string"}, "status": {"type": "string"}}}},
        "findings": {"type": "array", "items": {"type": "object", "properties": {
            "severity": {"enum": ["error", "warning", "note"]}}}},
        "problems": {"type": "array", "items": {"type": "string"}},
        "complete": {"type": "boolean"},
    },
}


def _merge_reports(data: Any, source: str) -> list[dict[str, Any]]:
    """The reports in one merge input, each checked against the schema of its version: the JSON
    Schema kvtrace ships (kvtrace.report.schema) for kvtrace/2, the keys a merge reads for kvtrace/1."""
    from kvtrace.report.schema import JSON_SCHEMA, REPORT_SCHEMA
    from kvtrace.userfiles import checked

    reports = []
    for n, document in enumerate(data if isinstance(data, list) else [data]):
        where = f"{source}: item {n + 1}" if isinstance(data, list) else source
        if isinstance(document, dict) and "reports" in document:
            reports += checked(document, JSON_SCHEMA, f"{where}: not a kvtrace/2 document")["reports"]
            continue
        version = document.get("schema") if isinstance(document, dict) else None
        schema = {"kvtrace/1": _MERGE_V1_SCHEMA, "kvtrace/2": REPORT_SCHEMA}.get(version)  # type: ignore[arg-type]
        if schema is None:
            raise InputError(f"{where}: not a kvtrace JSON report (run `kvtrace scan --format json`)")
        reports.append(checked(document, schema, f"{where}: not a kvtrace JSON report"))
    return reports


def merge_files(paths: list[Path], fail_on: str = DEFAULT_FAIL_ON) -> list[HostSummary]:
    """Host summaries from JSON report files. A file holding no report is an error (a merge of
    nothing would be a gate that cannot fail); hosts that carry the same name (two reports made
    on one machine) are told apart by the file each came from."""
    from kvtrace.userfiles import load_json

    hosts: list[HostSummary] = []
    sources: list[tuple[str, int]] = []  # per host: the file it came from, its place in that file
    for path in paths:
        data = load_json(path, "")
        found = summaries_from_json(data, str(path), fail_on)
        if not found:
            raise InputError(f"{path}: holds no report (run `kvtrace scan --format json` on each host); "
                             "nothing to merge")
        hosts.extend(found)
        sources.extend((str(path), i) for i in range(len(found)))
    names = Counter(h.target for h in hosts)
    per_file = Counter((h.target, source) for h, (source, _) in zip(hosts, sources))
    for host, (source, index) in zip(hosts, sources):
        if names[host.target] > 1:
            part = f", report {index + 1}" if per_file[(host.target, source)] > 1 else ""
            host.target = f"{host.target} ({source}{part})"
    return hosts
