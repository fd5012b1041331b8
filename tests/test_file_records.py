"""What a scan learns about files is data, never a change made where it was learned. Reading a
file's text changes nothing; the parse stage records bytes that do not decode. What the forked
child hands back is data: a SendersResult as JSON (kvtrace.cachecodec), never a
pickle, and what it learned about files comes back as FileMark records that the pipeline applies
once, so a file the child could not analyse is reported exactly as one process reports it.

The scans run in fresh interpreters: a fork is only taken in a process without other threads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvtrace.cachecodec import CacheFormatError, decode_record, encode_record
from kvtrace.model import FileMark, SenderRecord, SendersResult, with_marks
from kvtrace.pipeline import _senders_out
from kvtrace.scan import scan_path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "nixl-pin"

SCAN = """
import json, pathlib, sys
import kvtrace.scan as scan
from kvtrace.beside import Beside
forked = []
class ChildFirst(Beside):
    # The child runs to its end before the parent goes on: it claims every sender, so what the
    # report says about them comes only from the child's result.
    def __enter__(self):
        super().__enter__()
        self._early = super().result()
        return self
    @property
    def forked(self):
        return self._early is not None
    def result(self):
        forked.append(self._early is not None)
        return self._early
scan.Beside = ChildFirst
scan.PARALLEL_MIN_BYTES = 0
report = scan.scan_path(pathlib.Path(sys.argv[1]))
loaded_pickle = "pickle" in sys.modules  # before the writers (rich imports it for its own use)
from kvtrace.report.json import to_document
doc = to_document([report])
doc.pop("generated", None)
for r in doc["reports"]:
    r.pop("duration_seconds", None)
print(json.dumps({"forked": forked, "report": doc, "pickle": loaded_pickle}))
"""


def scan_in_a_fresh_process(tree: Path, fork: bool) -> dict:
    env = {**os.environ, **({} if fork else {"KVTRACE_NO_FORK": "1"})}
    done = subprocess.run([sys.executable, "-c", SCAN, str(tree)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def nest_too_deep(path: Path, anchor: str, indent: str) -> None:
    """Put a condition libcst is not handed (a 300-operand `and` chain) right after `anchor`."""
    text = path.read_text()
    assert anchor in text
    end = text.index("\n", text.index(anchor)) + 1
    chain = " and ".join(f"self.f{i}" if "self" in anchor else f"req.f{i}" for i in range(300))
    path.write_text(text[:end] + f"{indent}if {chain}:\n{indent}    pass\n" + text[end:])


@pytest.fixture
def deep_tree(tmp_path: Path) -> Path:
    """The example with a sender's poll() (analysed beside the queue) and the drain loop (analysed
    by the parent) both nested too deeply for libcst."""
    tree = tmp_path / "nixl-pin"
    shutil.copytree(EXAMPLE, tree)
    nest_too_deep(tree / "disaggregation" / "nixl" / "conn.py", "    def poll(self) -> KVPoll:  # expect: pinned", " " * 8)
    nest_too_deep(tree / "disaggregation" / "prefill.py",
                  "        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):", " " * 12)
    return tree


def test_files_the_child_could_not_analyse_are_reported_as_in_one_process(deep_tree: Path) -> None:
    together = scan_in_a_fresh_process(deep_tree, fork=True)
    alone = scan_in_a_fresh_process(deep_tree, fork=False)
    assert together["forked"] == [True] and alone["forked"] == [False]
    assert together["report"] == alone["report"]
    files = {f["path"]: f for f in together["report"]["reports"][0]["files"]}
    for path in ("disaggregation/nixl/conn.py", "disaggregation/prefill.py"):
        assert files[path]["status"] == "skipped" and "levels deep" in files[path]["error"], files[path]
    assert files["disaggregation/mooncake/conn.py"]["status"] == "ok"


def test_a_forked_scan_loads_no_pickle() -> None:
    together = scan_in_a_fresh_process(EXAMPLE, fork=True)
    assert together["forked"] == [True]
    assert together["pickle"] is False


def test_the_fetched_files_keep_the_status_they_were_read_with(deep_tree: Path) -> None:
    """A mark makes a new record in the report; the fetched SourceFile is not changed (a second
    package scanned from the same fetch sees the file as it was read)."""
    from kvtrace.fetch.local import fetch_local
    from kvtrace.scan import scan_fetched

    fetched = fetch_local(deep_tree)
    report = scan_fetched(fetched)
    reported = {f.path: f.status for f in report.files}
    assert reported["disaggregation/prefill.py"] == "skipped"
    assert {f.path: f.status for f in fetched.files}["disaggregation/prefill.py"] == "ok"


def test_the_child_result_round_trips_as_json_and_refuses_anything_else() -> None:
    from kvtrace.fetch.local import fetch_local
    from kvtrace.packs import load_pack
    from kvtrace.pipeline import index, parse

    pack = load_pack()
    fetched = fetch_local(EXAMPLE)
    parsed = parse(fetched, pack, None)
    indexed = index(parsed, pack, fetched.target)
    payload = _senders_out(indexed.index, pack, indexed.domain, parsed.root, lambda position: True, lambda position: True)
    result = decode_record(payload, SendersResult)
    assert [r.backend.name for r in result.senders] == ["mooncake", "nixl"]
    assert encode_record(result) == payload
    # The queue the child explored, assembled here, is the queue analysed here.
    from kvtrace.graph import analyse_queue
    from kvtrace.pipeline import _explored

    assert [r.position for r in result.queues] == [0]
    here = analyse_queue(indexed.index, pack, indexed.domain)
    there = analyse_queue(indexed.index, pack, indexed.domain, _explored(result.queues[0]))
    assert here.mode_paths and there.mode_paths == here.mode_paths and there.paths == here.paths
    assert (there.truncated, there.unparsed, there.static_sites) == (here.truncated, here.unparsed, here.static_sites)
    assert (there.graph.nodes, there.graph.edges) == (here.graph.nodes, here.graph.edges)
    data = json.loads(payload)
    data["queues"][0]["modes"][0]["Failed"][0]["outcome"] = "vanished"  # not an outcome
    with pytest.raises(ValueError):
        decode_record(json.dumps(data).encode(), SendersResult)
    data = json.loads(payload)
    data["senders"][0]["cls"] = ["disaggregation/nixl/conn.py", "80"]  # a line that is not a number
    with pytest.raises(CacheFormatError):
        decode_record(json.dumps(data).encode(), SendersResult)
    data = json.loads(payload)
    data["marks"] = [{"path": "a.py", "status": "gone", "error": "x"}]  # not a file status
    with pytest.raises(CacheFormatError):
        decode_record(json.dumps(data).encode(), SendersResult)
    assert isinstance(result.senders[0], SenderRecord)


def test_marks_give_every_reason_in_any_order_and_unmarked_files_are_the_same_objects() -> None:
    """Before: a later mark won, and the child's marks were put first, so a file with two functions
    too deep for libcst (one reached in each process) named another function than one process did."""
    report = scan_path(EXAMPLE)
    files = report.files[:3]
    marks = [FileMark(files[0].path, "skipped", "g() at line 9"), FileMark(files[0].path, "skipped", "f() at line 30")]
    marked = with_marks(files, marks)
    assert marked == with_marks(files, marks[::-1]) == with_marks(files, marks + marks)
    assert marked[0].status == "skipped" and marked[0].error == "f() at line 30; g() at line 9" and files[0].status == "ok"
    assert marked[1:] == files[1:] and all(a is b for a, b in zip(marked[1:], files[1:]))


def test_reading_the_text_changes_no_status_and_parsing_records_it() -> None:
    import hashlib

    from kvtrace.model import SourceFile
    from kvtrace.parse import parse_modules

    data = b"# caf\xe9\nx = 1\n"
    latin = SourceFile("latin.py", data, hashlib.sha256(data).hexdigest())
    assert latin.text is None and latin.status == "ok" and latin.error is None
    assert latin.undecodable is not None and latin.undecodable.startswith("not UTF-8")
    assert latin.as_read == ("not-utf8", latin.undecodable)
    parsing = parse_modules([latin])
    assert parsing.modules == [] and [(m.path, m.status, m.error) for m in parsing.marks] == [
        ("latin.py", "not-utf8", latin.undecodable)]
    assert (latin.status, latin.error) == ("ok", None)  # parsing returns what it found; the file stays as read


def test_a_source_file_is_frozen_and_decoded_when_made() -> None:
    import dataclasses
    import hashlib

    from kvtrace.model import SourceFile

    data = "# coding: latin-1\nNAME = 'caf\xe9'\n".encode("latin-1")
    source = SourceFile("m.py", data, hashlib.sha256(data).hexdigest())
    assert source.text == "# coding: latin-1\nNAME = 'caf\xe9'\n" and source.undecodable is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        source.status = "syntax-error"  # type: ignore[misc]
    marked = dataclasses.replace(source, status="syntax-error", error="line 1: x")
    assert (marked.text, source.status) == (source.text, "ok")


def test_a_package_whose_enum_file_does_not_decode_says_so(tmp_path: Path) -> None:
    """The no-package message counts a file whose bytes do not decode as not-utf8, though
    nothing has parsed it yet."""
    from kvtrace.errors import InputError

    tree = tmp_path / "nixl-pin"
    shutil.copytree(EXAMPLE, tree)
    base = tree / "disaggregation" / "base" / "conn.py"
    base.write_bytes(b"# caf\xe9\n" + base.read_bytes())
    with pytest.raises(InputError) as raised:
        scan_path(tree)
    message = str(raised.value)
    assert "1 not-utf8" in message and "not UTF-8 and no usable coding cookie" in message, message


def test_a_file_with_a_function_too_deep_in_each_process_names_both_as_one_process(tmp_path: Path) -> None:
    """nixl/conn.py holds two functions libcst is not handed: poll(), which the child meets (the
    senders), and a helper the drain loop calls on Failed, which the parent meets (the queue).
    Before, the later mark won and the child's came first: the forked report named the helper
    where one process named poll()."""
    deep_tree = tmp_path / "nixl-pin"
    shutil.copytree(EXAMPLE, deep_tree)
    conn = deep_tree / "disaggregation" / "nixl" / "conn.py"
    nest_too_deep(conn, "    def poll(self) -> KVPoll:  # expect: pinned", " " * 8)
    conn.write_text(conn.read_text() + "\n\ndef note_failure(req):\n    return None\n")
    nest_too_deep(conn, "def note_failure(req):", " " * 4)
    prefill = deep_tree / "disaggregation" / "prefill.py"
    text = prefill.read_text()
    anchor = "                logger.warning(reason)\n"
    assert anchor in text
    prefill.write_text(text.replace(anchor, "                note_failure(req)\n" + anchor, 1)
                       .replace("import logging\n", "import logging\n\nfrom .nixl.conn import note_failure\n", 1))
    together = scan_in_a_fresh_process(deep_tree, fork=True)
    alone = scan_in_a_fresh_process(deep_tree, fork=False)
    assert together["forked"] == [True] and alone["forked"] == [False]
    assert together["report"] == alone["report"]
    files = {f["path"]: f for f in together["report"]["reports"][0]["files"]}
    error = files["disaggregation/nixl/conn.py"]["error"]
    assert "note_failure() at line" in error and "poll() at line" in error, error
