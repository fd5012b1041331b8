"""Bounded fuzzing of scan_path: arbitrary bytes, Python-like token soup and mutated generated
files, written into an otherwise valid fixture tree.

scan_path may refuse a tree with a kvtrace.errors.KvtraceError (no drain loop, no enum, ...),
but must never raise anything else; when it returns a report, every .py file of the tree is in
report.files, and a file CPython cannot parse (ast.parse after UTF-8/BOM decoding) must not have
status "ok". A few CLI runs check the exit codes on top.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from . import _support, gen

scan_path = _support.kvtrace_scan()
# Token soup makes CPython (and kvtrace's parse of the same text) warn about odd literals.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

from kvtrace.errors import KvtraceError  # noqa: E402

FILE_STATUSES = {"ok", "syntax-error", "not-utf8", "too-large", "skipped", "unreadable"}
TARGETS = (
    "disaggregation/prefill.py",
    "disaggregation/base/conn.py",
    "disaggregation/utils.py",
    "disaggregation/mooncake/conn.py",
    "disaggregation/common/conn.py",
)


def cpython_parses(data: bytes) -> bool | None:
    """True/False; None when CPython itself cannot say (recursion or memory limits)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(text)
    except (SyntaxError, ValueError):  # ValueError: NUL bytes (3.11)
        return False
    except (RecursionError, MemoryError):
        return None
    return True


def base_files() -> dict[str, str | bytes]:
    return dict(gen.render_tree(gen.SHAPE_PENDING, gen.SHAPE_SENDERS))


def check_scan(files: dict[str, str | bytes], fuzzed: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = gen.write_files(Path(d), files)
        try:
            report = scan_path(root)
        except KvtraceError:
            return
        except Exception:
            data = files[fuzzed]
            pytest.fail(
                f"scan_path raised a non-kvtrace error for {fuzzed} = {data!r:.2000}\n{traceback.format_exc()}",
                pytrace=False,
            )
        statuses = {f.path: f.status for f in report.files}
        for path, status in statuses.items():
            assert status in FILE_STATUSES, f"{path}: unknown status {status!r}"
        # Every file of the package is reported; a file beside it is in scope only while it names the
        # queue (a mutation can take the name out of the scheduler's gauge file).
        missing = sorted(p for p in files if p.endswith(".py") and p not in statuses
                         and (p.startswith("disaggregation/") or gen.QUEUE_ATTR.encode() in _as_bytes(files[p])))
        assert not missing, f"files left out of report.files: {missing} (reported: {sorted(statuses)})"
        data = files[fuzzed]
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
        # (A file the mutation took out of scope, above, is not read at all: nothing to report.)
        if cpython_parses(raw) is False and fuzzed in statuses:
            assert statuses[fuzzed] != "ok", f"{fuzzed} does not parse but is reported ok: {raw!r:.2000}"


# ---------------------------------------------------------------------------------------------
# Arbitrary bytes


@gen.budget(ci=30, slow=1000)
@given(st.sampled_from(TARGETS), st.binary(max_size=2048))
def test_arbitrary_bytes(target, data):
    files = base_files()
    files[target] = data
    check_scan(files, target)


# ---------------------------------------------------------------------------------------------
# Python-like token soup

TOKENS = [
    "\n", "\n", "\n", "    ", "    ", "\t", " ", "\r\n", "\r", "\\\n", "\x00", "\ufeff", "\x0c",
    "def ", "class ", "if ", "elif ", "else", "for ", "while ", "in ", "not ", "is ", "and ", "or ",
    "return ", "raise ", "assert ", "continue", "break", "pass", "try:", "except Exception:", "finally:",
    "lambda ", "yield ", "await ", "async ", "with ", "match ", "case ", "global ", "nonlocal ", "del ",
    "poll", "polls", "req", "self", "KVPoll", "KVPoll.Success", "KVPoll.Failed", "KVPoll.Bootstrapping",
    "KVPoll.WaitingForInput", "KVPoll.Transferring", "undone_reqs", "done_reqs",
    "self.disagg_prefill_inflight_queue", "process_disagg_prefill_inflight_queue",
    "poll_and_all_reduce", "release_kv_cache", "prepare_abort", "BaseKVSender", "conclude_state",
    "abort", "timeout", "deadline", "time.time()", "super().poll()",
    "(", ")", "[", "]", "{", "}", ":", ",", ".", "=", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*",
    "**", "/", "//", "%", "@", "->", ":=", "...", ";", "#", "'", '"', '"""', "f'", "b'", "r'", "0", "1",
    "1e9", "0x", "None", "True", "False", "é", "\u2028", "\ud7ff", "💥",
]


@gen.budget(ci=30, slow=1000)
@given(st.sampled_from(TARGETS), st.lists(st.sampled_from(TOKENS), max_size=120).map("".join))
def test_token_soup(target, text):
    files = base_files()
    files[target] = text
    check_scan(files, target)


# ---------------------------------------------------------------------------------------------
# Mutated generated files


@st.composite
def mutated_trees(draw):
    drain = draw(gen.drain_programs(gen.ALL_FEATURES | gen.OPTIONAL_FEATURES))
    senders = draw(gen.sender_trees(gen.SENDER_FEATURES | gen.SENDER_OPTIONAL_FEATURES))
    files: dict[str, str | bytes] = dict(gen.render_tree(drain, senders))
    target = draw(st.sampled_from(sorted(p for p in files if p.endswith(".py") and files[p])))
    data = files[target].encode("utf-8")
    for _ in range(draw(st.integers(1, 3))):
        data = draw(mutation(data))
    files[target] = data
    return files, target


@st.composite
def mutation(draw, data: bytes) -> bytes:
    lines = data.split(b"\n")
    n = len(lines)
    op = draw(
        st.sampled_from(
            ("delete_line", "duplicate_line", "swap_lines", "indent", "dedent", "insert", "delete_span", "truncate",
             "bad_utf8", "crlf", "tabs", "bom", "nul")
        )
    )
    i = draw(st.integers(0, max(n - 1, 0)))
    j = draw(st.integers(0, max(n - 1, 0)))
    pos = draw(st.integers(0, len(data)))
    if op == "delete_line" and n > 1:
        del lines[i]
    elif op == "duplicate_line":
        lines.insert(i, lines[i])
    elif op == "swap_lines":
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "indent":
        lines[i] = b"    " + lines[i]
    elif op == "dedent":
        lines[i] = lines[i][4:] if lines[i].startswith(b"    ") else lines[i].lstrip()
    elif op == "insert":
        token = draw(st.sampled_from(TOKENS)).encode("utf-8", "surrogatepass")
        return data[:pos] + token + data[pos:]
    elif op == "delete_span":
        return data[:pos] + data[pos + draw(st.integers(1, 40)) :]
    elif op == "truncate":
        return data[:pos]
    elif op == "bad_utf8":
        return data[:pos] + draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"))) + data[pos:]
    elif op == "crlf":
        return data.replace(b"\n", b"\r\n")
    elif op == "tabs":
        return data.replace(b"    ", b"\t")
    elif op == "bom":
        return b"\xef\xbb\xbf" + data
    elif op == "nul":
        return data[:pos] + b"\x00" + data[pos:]
    return b"\n".join(lines)


@gen.budget(ci=40, slow=1500)
@given(mutated_trees())
def test_mutated_files(case):
    files, target = case
    check_scan(files, target)


# ---------------------------------------------------------------------------------------------
# The CLI's exit codes on a few trees


@pytest.mark.parametrize("case", ["clean", "unparsable", "missing"])
def test_cli_exit_codes(case, tmp_path):
    # The default tree has no error-level finding but one (its one backend reads its abort state;
    # the link rules give notes and warnings on it; its drain raises on Bootstrapping, which the
    # backend returns: state-crash, left out here), so with --fail-on error the only reason for a
    # non-zero exit is the broken file, which the analysis itself does not need.
    files: dict[str, str | bytes] = dict(gen.render_tree())
    if case == "unparsable":
        files["disaggregation/broken.py"] = "def poll(:\n"
        files["disaggregation/latin1.py"] = b"x = '\xff'\n"
    target = tmp_path / "tree"
    if case != "missing":
        gen.write_files(target, files)
    proc = subprocess.run(
        [sys.executable, "-m", "kvtrace", "scan", str(target), "--format", "json", "--fail-on", "error",
         "--ignore", "state-crash"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    if case == "missing":
        assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
        return
    expected = {"clean": (0,), "unparsable": (3,)}[case]
    assert proc.returncode in expected, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    doc = json.loads(proc.stdout)
    assert doc.get("schema") == "kvtrace/2"


def _as_bytes(content: str | bytes) -> bytes:
    return content if isinstance(content, bytes) else content.encode("utf-8", "surrogateescape")
