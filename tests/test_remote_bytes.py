"""A remote scan moves what the analysis reads, and still reports what a local scan reports.

Against a real private sshd (tests/sshd_server.py) with a TCP relay in front of it that counts
the bytes the server sends (tests/byte_relay.py): bytes, unlike times, are the same on a busy
machine. Each remote report is compared with a local scan of the whole tree (nothing left out).
"""

from __future__ import annotations

import shutil
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ is not a package

from byte_relay import ByteRelay  # noqa: E402
from sshd_server import SshdServer, require_sshd  # noqa: E402

from kvtrace.fetch import fetch_target  # noqa: E402
from kvtrace.fetch.local import fetch_local  # noqa: E402
from kvtrace.fetch.ssh.script import stdin_payload  # noqa: E402
from kvtrace.model import FetchLimits, Report  # noqa: E402
from kvtrace.packs import load_pack  # noqa: E402
from kvtrace.report.json import to_json_dict  # noqa: E402
from kvtrace.scan import scan_fetched  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def sshd() -> Iterator[SshdServer]:
    require_sshd()
    with SshdServer.start() as server:
        yield server


@pytest.fixture(scope="module")
def sftp_only_sshd() -> Iterator[SshdServer]:
    require_sshd()
    with SshdServer.start(extra_config=["ForceCommand internal-sftp"]) as server:
        yield server


def remote_scan(server: SshdServer, path: Path, log: list[str] | None = None) -> tuple[Report, int]:
    """The scan the CLI runs (fetch_target with the pack, then scan_fetched) through a relay;
    the report and the bytes the server sent."""
    pack = load_pack()
    with ByteRelay(server.port) as relay:
        known_hosts = server.dir / f"known_hosts.relay{relay.port}"
        known_hosts.write_text(f"[{server.host}]:{relay.port} {server.host_key_line}\n")
        ssh = dict(identity_files=[str(server.client_key)], ssh_config=str(server.ssh_config),
                   known_hosts=str(known_hosts), connect_timeout=10.0, read_timeout=60.0)
        fetched = fetch_target(f"{server.user}@{server.host}:{relay.port}:{path}", FetchLimits(), ssh,
                               log.append if log is not None else None, pack=pack)
        relay.wait_idle()
        sent = relay.server_to_client
    return scan_fetched(fetched, pack), sent


def local_json(path: Path) -> dict:
    """A local scan of every file of the tree: the reference a remote scan must equal."""
    data = to_json_dict(scan_fetched(fetch_local(path), load_pack()))
    data.pop("target")
    return data


def as_json(report: Report) -> dict:
    data = to_json_dict(report)
    data.pop("target")
    return data


def analysed_bytes(report: Report) -> int:
    return sum(len(f.data) for f in report.files)


@pytest.fixture(scope="module")
def installed_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SGLang 0.5.23 as pip installs it: the wheel's whole sglang/ package (4,700 .py files,
    most of them nothing the analysis reads) and its dist-info."""
    from tests.sglang_wheels import wheel

    site = tmp_path_factory.mktemp("site-packages")
    with zipfile.ZipFile(wheel("0.5.23")) as archive:
        members = [n for n in archive.namelist() if n.startswith("sglang/") and n.endswith(".py")
                   or n.endswith(".dist-info/METADATA")]
        archive.extractall(site, members)
    return site / "sglang"


def test_installed_package_moves_at_most_three_times_what_is_analysed(sshd: SshdServer, installed_package: Path) -> None:
    """Before: 72 MB sent for 1.9 MB analysed (38x): every .py file of the package was moved."""
    log: list[str] = []
    report, sent = remote_scan(sshd, installed_package, log)
    assert as_json(report) == local_json(installed_package)
    whole = sum(p.stat().st_size for p in installed_package.rglob("*.py"))
    assert analysed_bytes(report) > 1_000_000 and whole > 30 * analysed_bytes(report)
    assert sent <= 3 * analysed_bytes(report), (sent, analysed_bytes(report), log)
    # -v shows what the wire carried (the client's own count: at most what the relay saw).
    counted = [line for line in log if "bytes received from the server" in line]
    assert counted and int(counted[0].split("ssh: ")[1].split()[0]) <= sent, log


def shaped_tree(root: Path) -> Path:
    """An installed-package shape in our own words: the example package inside sglang/srt, a
    scheduler file naming the queue, a version.py, 300 files that name nothing the scan looks
    for, a decoy folder named like the package without the enum, and a file that names the enum
    only in a comment."""
    package = root / "sglang"
    shutil.copytree(EXAMPLES / "nixl-pin", package / "srt")
    (package / "version.py").write_text('__version__ = "9.9.9"\n')
    for i in range(300):
        folder = package / "srt" / "layers" / f"group{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 400)
    (package / "lang" / "disaggregation").mkdir(parents=True)
    (package / "lang" / "disaggregation" / "notes.py").write_text("NOTE = 'no enum here'\n")
    (package / "srt" / "docs.py").write_text("# KVPoll is defined in srt/disaggregation/base/conn.py\n")
    return package


@pytest.mark.parametrize("server_name", ["sshd", "sftp_only_sshd"])
def test_shaped_package_remote_equals_local(server_name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Exec and SFTP make the same choice of files as a local scan; exec moves only those."""
    server: SshdServer = request.getfixturevalue(server_name)
    package = shaped_tree(tmp_path)
    report, sent = remote_scan(server, package)
    assert as_json(report) == local_json(package)
    assert report.version is not None and report.version.version == "9.9.9"
    if server_name == "sshd":
        assert sent <= 3 * analysed_bytes(report), (sent, analysed_bytes(report))


def test_renamed_package_folder_is_fetched_whole(sshd: SshdServer, tmp_path: Path) -> None:
    """A fork that renamed the package folder makes the whole target the package; a folder
    named like the package that only mentions the enum makes the first choice wrong, and the
    fetch falls back to every file. Either way: the same report as a local scan."""
    for decoy in (False, True):
        tree = tmp_path / f"decoy{decoy}"
        shutil.copytree(EXAMPLES / "nixl-pin" / "disaggregation", tree / "kv_transfer")
        (tree / "other.py").write_text("def g():\n    return 1\n")
        if decoy:
            (tree / "x" / "disaggregation").mkdir(parents=True)
            (tree / "x" / "disaggregation" / "a.py").write_text("# mentions KVPoll, defines nothing\n")
        log: list[str] = []
        report, _ = remote_scan(sshd, tree, log)
        assert as_json(report) == local_json(tree), decoy
        assert report.root == ""
        assert any("fetching the whole tree" in line for line in log) == decoy, log


def test_target_named_like_the_package_is_fetched_whole(sshd: SshdServer, tmp_path: Path) -> None:
    """The disaggregation folder itself: the scan reads all of it, so every file is fetched (in
    one round: nothing is searched for) and the report is a local scan's."""
    package = shaped_tree(tmp_path) / "srt" / "disaggregation"
    log: list[str] = []
    report, _ = remote_scan(sshd, package, log)
    assert as_json(report) == local_json(package)
    fetch = [line for line in log if "exec fetch:" in line]
    listed = int(fetch[0].split("exec fetch: ")[1].split()[0])
    assert fetch and f"{listed} fetched" in fetch[0] and listed == len(list(package.rglob("*.py"))), log


def test_round_one_leaves_the_remote_in_blocks_whatever_the_timing(tmp_path: Path) -> None:
    """The fixed command run here with `sh`, read by a reader that is always waiting: round 1's
    records (one printf each, 300+ of them) reach the channel in a few large writes. Before, each
    record was its own write, and sshd sent each one it read as its own SSH packet when it woke
    fast enough: the same fetch sent 43,800 or 57,500 bytes depending on the load."""
    import os
    import subprocess

    from kvtrace.fetch.select import Wanted
    from kvtrace.fetch.ssh.script import SCRIPT, request_some

    package = shaped_tree(tmp_path)
    wanted = Wanted.from_pack(load_pack())
    remote = subprocess.Popen(["sh", "-c", SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, cwd=tmp_path)
    assert remote.stdin is not None and remote.stdout is not None
    try:
        remote.stdin.write(stdin_payload(str(package), FetchLimits().max_file_bytes, wanted.enum, wanted.queues))
        remote.stdin.flush()
        chunks: list[bytes] = []
        while not b"".join(chunks).endswith(b"\0E\0"):
            chunk = os.read(remote.stdout.fileno(), 1 << 20)
            assert chunk, b"".join(chunks)[-200:]
            chunks.append(chunk)
        remote.stdin.write(request_some([]))
        remote.stdin.close()
        remote.stdout.read()
    finally:
        remote.kill()
        remote.wait()
    listing = b"".join(chunks)
    assert listing.count(b"\0R\0") >= 300 and len(listing) < 1 << 16
    # The marker line, then the records in one 64 KiB block (a pipe may hand a block over in parts).
    assert len(chunks) <= 4, [len(c) for c in chunks]
