"""A rescan served from the cache prints the same bytes as a cold scan, in every format, and the
finished rendering it keeps is reused only while everything it was made from is unchanged:
the reports, the options, where it runs from, and a module read from outside the scanned files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvtrace.cache import MAGIC, SUFFIX

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "nixl-pin"
FORMATS = ("text", "json", "sarif", "markdown", "github", "concise", "html")


def kvtrace(cache: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "KVTRACE_CACHE_DIR": str(cache), "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], capture_output=True, timeout=600, cwd=cwd,
                          env=env)


def renderings(cache: Path) -> list[Path]:
    """The cache's rendering entries (a scan's entry holds a report, not a text)."""
    return [p for p in cache.glob(f"*{SUFFIX}") if b'"outside": ' in p.read_bytes()[:300]]


def imported(cache: Path, cwd: Path, *args: str) -> set[str]:
    env = {**os.environ, "KVTRACE_CACHE_DIR": str(cache), "COLUMNS": "120"}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "kvtrace", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env=env)
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("where", ["repository", "elsewhere"])
def test_every_format_prints_the_same_bytes_cold_warm_and_from_the_kept_rendering(tmp_path: Path, where: str) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(EXAMPLE, tree)
    cwd = ROOT if where == "repository" else tmp_path  # paths are shown as they open from there
    cache = tmp_path / "cache"
    for fmt in FORMATS:
        # Cold: a cache of its own, empty (markdown names the command line, so --no-cache would differ).
        cold = kvtrace(tmp_path / f"cold-{fmt}", cwd, "scan", str(tree), "--format", fmt)
        runs = [kvtrace(cache, cwd, "scan", str(tree), "--format", fmt) for _ in range(3)]
        assert cold.returncode == 1, cold.stderr[-2000:]
        for run in runs:
            assert (run.returncode, run.stdout, run.stderr) == (cold.returncode, cold.stdout, cold.stderr), fmt
        if fmt != "markdown":
            assert kvtrace(cache, cwd, "scan", str(tree), "--format", fmt, "--no-cache").stdout == cold.stdout, fmt
        written = [tmp_path / f"{fmt}-{i}.out" for i in range(3)]
        kvtrace(tmp_path / f"cold-{fmt}-file", cwd, "scan", str(tree), "--format", fmt, "-o", str(written[0]))
        for out in written[1:]:
            kvtrace(cache, cwd, "scan", str(tree), "--format", fmt, "-o", str(out))
        shown = [out.read_bytes().replace(str(out).encode(), b"OUT") for out in written]  # markdown's command line
        assert shown[0] == shown[1] == shown[2], fmt
    # text (stdout and a file alike at COLUMNS), json and sarif keep their rendering; the others render anew
    assert len(renderings(cache)) == 3


def test_a_kept_rendering_is_written_without_rendering_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    argv = ("scan", str(EXAMPLE), "--format", "text", "-o", str(tmp_path / "report.txt"))
    first = imported(cache, ROOT, *argv)
    again = imported(cache, ROOT, *argv)
    assert "kvtrace.report.text" in first and "kvtrace.cache" in again  # the measurement saw the imports
    assert not {"kvtrace.report.text", "kvtrace.freeing", "rich.syntax", "pygments"} & again


@pytest.mark.parametrize("damage", ["not json", "another key", "no text"])
def test_a_damaged_rendering_is_a_miss_and_is_made_again(tmp_path: Path, damage: str) -> None:
    import hashlib
    import json

    cache = tmp_path / "cache"
    argv = ("scan", str(EXAMPLE), "--format", "sarif")
    cold = kvtrace(cache, ROOT, *argv, "--no-cache")
    kvtrace(cache, ROOT, *argv)
    [entry] = renderings(cache)
    kept = json.loads(entry.read_bytes()[len(MAGIC) + 65:])
    payload = {"not json": b"{not json",
               "another key": json.dumps({**kept, "key": "0" * 64, "text": "forged"}).encode(),
               "no text": json.dumps({"key": kept["key"], "outside": []}).encode()}[damage]
    entry.write_bytes(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    warm = kvtrace(cache, ROOT, *argv)
    assert warm.stdout == cold.stdout and warm.returncode == cold.returncode
    assert len(renderings(cache)) == 1 and b"forged" not in b"".join(p.read_bytes() for p in renderings(cache))


def test_a_module_read_from_outside_the_tree_is_read_again(tmp_path: Path) -> None:
    """SGLang 0.5.23 declares its timeouts' defaults in srt/environ.py, beside the disaggregation
    folder: the text report shows the default read there. The scan's entry does not depend on that
    file (it is not scanned), so a kept rendering must be made again when it changes."""
    from tests.sglang_wheels import sglang_tree

    package = tmp_path / "sglang" / "srt"
    shutil.copytree(sglang_tree("0.5.23") / "sglang" / "srt" / "disaggregation", package / "disaggregation")
    environ = package / "environ.py"
    environ.write_text("class EnvInt:\n    def __init__(self, default):\n        self.default = default\n\n\n"
                       "class Envs:\n    SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT = EnvInt(300)\n")
    cache = tmp_path / "cache"
    argv = ("scan", str(package / "disaggregation"), "--format", "text")
    first = kvtrace(cache, tmp_path, *argv)
    assert first.returncode == 3, first.stderr[-2000:]  # INCOMPLETE: the folder alone has callers unseen
    assert b"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default 300" in first.stdout
    environ.write_text(environ.read_text().replace("EnvInt(300)", "EnvInt(450)"))
    changed = kvtrace(cache, tmp_path, *argv)
    assert b"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default 450" in changed.stdout
    assert b"default 300" not in changed.stdout
    # Checked again without importing what wrote the report.
    assert not {"kvtrace.freeing", "kvtrace.gitfiles", "kvtrace.report.text"} & imported(cache, tmp_path, *argv)
    environ.unlink()
    gone = kvtrace(cache, tmp_path, *argv)
    cold = kvtrace(cache, tmp_path, *argv, "--no-cache")
    assert gone.stdout == cold.stdout and b"default unknown: it is declared in sglang/srt/environ.py" in gone.stdout


def test_a_real_tree_prints_the_same_bytes_cold_and_warm(tmp_path: Path) -> None:
    from tests.sglang_wheels import sglang_tree

    tree = sglang_tree("0.5.23") / "sglang" / "srt" / "disaggregation"
    cache = tmp_path / "cache"
    for fmt in ("text", "json", "sarif"):
        cold = kvtrace(cache, ROOT, "scan", str(tree), "--format", fmt, "--no-cache")
        assert cold.returncode == 3, cold.stderr[-2000:]
        for _ in range(2):
            warm = kvtrace(cache, ROOT, "scan", str(tree), "--format", fmt)
            assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr), fmt
