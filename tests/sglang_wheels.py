"""Real SGLang for tests: released wheels from PyPI, downloaded at test time into a cache
outside the repository (never committed), unpacked down to what kvtrace scans."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

QUEUE = "disagg_prefill_inflight_queue"
CACHE = Path(os.environ.get("KVTRACE_WHEEL_CACHE", Path.home() / ".cache" / "kvtrace-tests"))


def wheel(version: str) -> Path:
    folder = CACHE / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if not found:
        # Download beside the cache and rename into it, so that concurrent test runs never see
        # a half-written wheel.
        with tempfile.TemporaryDirectory(dir=folder) as staging:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
                 f"sglang=={version}", "-d", staging],
                check=True, timeout=900,
            )
            for downloaded in Path(staging).glob(f"sglang-{version}-*.whl"):
                os.replace(downloaded, folder / downloaded.name)
        found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    assert found, f"pip download sglang=={version} produced no wheel"
    return found[0]


def sglang_tree(version: str) -> Path:
    """`<cache>/trees/<version>/sglang/srt/...`: the disaggregation package plus every other srt
    file that mentions the queue (scheduler loops, metrics), as in an installed package."""
    root = CACHE / "trees" / version
    marker = root / ".complete"
    if marker.exists():
        return root
    with zipfile.ZipFile(wheel(version)) as archive:
        for info in archive.infolist():
            name = info.filename
            if not name.startswith("sglang/srt/") or not name.endswith(".py"):
                continue
            data = archive.read(info)
            if name.startswith("sglang/srt/disaggregation/") or QUEUE.encode() in data:
                target = root / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
    marker.write_text("ok")
    return root


def sglang_package(version: str) -> Path:
    """`<cache>/packages/<version>/sglang/...`: every .py file of the released package, as pip installs
    it (the thin `sglang_tree` keeps only what mentions the queue)."""
    root = CACHE / "packages" / version
    marker = root / ".complete"
    if not marker.exists():
        # Unpacked beside the cache and renamed into it, so a concurrent run never sees half a package.
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent) as staging, zipfile.ZipFile(wheel(version)) as archive:
            for info in archive.infolist():
                if info.filename.startswith("sglang/") and info.filename.endswith(".py"):
                    target = Path(staging) / "tree" / info.filename
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(info))
            (Path(staging) / "tree" / ".complete").write_text("ok")
            try:
                os.replace(Path(staging) / "tree", root)
            except OSError:  # another run put it there first
                if not marker.exists():
                    raise
    return root / "sglang"
