"""One run judges every queue of a host: the prefill pack's bootstrap and inflight queues by default,
a grid per queue, `--queue` and `--role` to choose, and every output naming the queue of each finding.

The tree is examples/nixl-pin (inflight queue only) plus a handshake wait list written here in our
own words: an object whose class keeps `self.queue`, bound on the scheduler as
`disagg_prefill_bootstrap_queue`, that keeps Bootstrapping, aborts Failed and lets the rest go."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from kvtrace import __version__
from kvtrace.errors import InputError
from kvtrace.packs import load_pack, pack_for, select_queues, validate
from kvtrace.report.schema import JSON_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP, INFLIGHT = "disagg_prefill_bootstrap_queue", "disagg_prefill_inflight_queue"
PREALLOC, TRANSFER = "disagg_decode_prealloc_queue", "disagg_decode_transfer_queue"

HANDSHAKE = '''\
from typing import List

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.utils import poll_and_all_reduce, prepare_abort


class HandshakeWaitList:
    def __init__(self, scheduler, group) -> None:
        self.scheduler = scheduler
        self.group = group
        self.queue: List = []

    def add(self, req) -> None:
        self.queue.append(req)

    def pop_ready(self) -> List:
        if not self.queue:
            return []
        polls = poll_and_all_reduce([req.disagg_kv_sender for req in self.queue], self.group)
        ready, waiting = [], []
        for req, poll in zip(self.queue, polls):
            if poll == KVPoll.Bootstrapping:
                waiting.append(req)
            elif poll == KVPoll.Failed:
                prepare_abort(req, "handshake with the decode server failed")
                self.scheduler.stream_output([req], False)
            else:
                ready.append(req)
        self.queue = waiting
        return ready


class SchedulerHandshakeMixin:
    def start_handshakes(self, group) -> None:
        self.disagg_prefill_bootstrap_queue = HandshakeWaitList(self, group)

    def admit(self, req) -> None:
        self.disagg_prefill_bootstrap_queue.add(req)

    def move_ready_requests(self) -> None:
        self.waiting_queue.extend(self.disagg_prefill_bootstrap_queue.pop_ready())
'''


ARRIVALS = '''\
from typing import List

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.utils import poll_and_all_reduce, prepare_abort


class ArrivingKV:
    def __init__(self, scheduler, group) -> None:
        self.scheduler = scheduler
        self.group = group
        self.queue: List = []

    def add(self, req) -> None:
        self.queue.append(req)

    def pop_arrived(self) -> List:
        if not self.queue:
            return []
        polls = poll_and_all_reduce([req.kv_receiver for req in self.queue], self.group)
        arrived, waiting = [], []
        for req, poll in zip(self.queue, polls):
            if poll == KVPoll.Success:
                arrived.append(req)
            elif poll == KVPoll.Failed:
                prepare_abort(req, "the KV did not arrive")
                self.scheduler.stream_output([req], False)
            else:
                waiting.append(req)
        self.queue = waiting
        return arrived


class SchedulerArrivalsMixin:
    def start_arrivals(self, group) -> None:
        self.disagg_decode_transfer_queue = ArrivingKV(self, group)

    def expect(self, req) -> None:
        self.disagg_decode_transfer_queue.add(req)

    def run_arrived(self) -> None:
        self.waiting_queue.extend(self.disagg_decode_transfer_queue.pop_arrived())
'''


def kvtrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", "scan", "--no-cache", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("prefill-host") / "tree"
    shutil.copytree(ROOT / "examples" / "nixl-pin", tree)
    (tree / "disaggregation" / "handshake.py").write_text(HANDSHAKE)
    return tree


@pytest.fixture(scope="module")
def default_json(host: Path) -> dict:
    result = kvtrace(str(host), "--format", "json")
    assert result.returncode in (0, 1), result.stderr
    document = json.loads(result.stdout)
    jsonschema.validate(document, JSON_SCHEMA)
    return document["reports"][0]


def test_default_judges_both_prefill_queues_each_with_its_grid(host: Path, default_json: dict) -> None:
    assert [q["name"] for q in default_json["queues"]] == [INFLIGHT, BOOTSTRAP]
    bootstrap = default_json["queues"][1]
    assert bootstrap["drain"]["path"] == "disaggregation/handshake.py"
    # Bootstrapping is appended back (kept), Failed is aborted and left out, the rest leave.
    assert bootstrap["states"]["Bootstrapping"]["fate"] == ["kept"]
    assert bootstrap["states"]["Failed"]["fate"] == ["leaves"]
    assert bootstrap["states"]["WaitingForInput"]["fate"] == ["leaves"]
    assert default_json["complete"] is True
    text = kvtrace(str(host), "--no-map").stdout
    assert text.index(f"Verdicts for {INFLIGHT}") < text.index(f"Verdicts for {BOOTSTRAP}")


def test_every_format_names_the_queue_of_each_finding(host: Path, default_json: dict) -> None:
    per_queue = [f for f in default_json["findings"] if f["queue"] is not None]
    assert {f["queue"] for f in per_queue} == {INFLIGHT, BOOTSTRAP}
    # Rules about the backends alone (abort-ignored, no-timeout...) are about no queue.
    assert all(f["queue"] is None for f in default_json["findings"] if f["rule"] in ("abort-ignored", "no-timeout"))
    assert all(f["fingerprint"].split("|")[1] == (f["queue"] or "-") for f in default_json["findings"])
    # Two queues judged: the summary line says which one the errors pin.
    assert default_json["summary"].startswith(f"2 errors: nixl pins WaitingForInput, Transferring in {INFLIGHT} · ")

    sarif = json.loads(kvtrace(str(host), "--format", "sarif").stdout)
    results = sarif["runs"][0]["results"]
    assert [r["properties"]["queue"] for r in results] == [f["queue"] for f in default_json["findings"]]

    # Folded to the terminal's width (a long path may wrap between its parts): compared without spaces.
    text = "".join(kvtrace(str(host)).stdout.split())
    pin = next(f for f in per_queue if f["rule"] == "pinned-state")
    assert re.search(rf"error\[pinned-state\]at\S*?{re.escape(pin['path'])}:{pin['line']}in{pin['queue']}", text)
    markdown = kvtrace(str(host), "--format", "markdown", "--detail", "full").stdout
    assert f"**pinned-state** (error) in `{pin['queue']}`" in markdown


def test_queue_flag_judges_only_the_named_queue_with_the_same_verdicts(host: Path, default_json: dict) -> None:
    result = kvtrace(str(host), "--queue", BOOTSTRAP, "--format", "json")
    only = json.loads(result.stdout)["reports"][0]
    assert [q["name"] for q in only["queues"]] == [BOOTSTRAP]
    assert only["queues"][0]["states"] == default_json["queues"][1]["states"]
    # The other queue is still analysed (what its drain does bears on this one), never reported.
    assert {f["queue"] for f in only["findings"]} <= {BOOTSTRAP, None}
    same = {(f["rule"], f["backend"], f["state"], f["severity"]) for f in default_json["findings"]
            if f["queue"] in (BOOTSTRAP, None)}
    assert {(f["rule"], f["backend"], f["state"], f["severity"]) for f in only["findings"]} == same
    text = kvtrace(str(host), "--queue", f"{BOOTSTRAP},{INFLIGHT}", "--no-map").stdout
    assert f"Verdicts for {INFLIGHT}" in text and f"Verdicts for {BOOTSTRAP}" in text


def test_a_tree_without_the_bootstrap_queue_keeps_its_report_unless_the_queue_is_named() -> None:
    """examples/nixl-pin reads the bootstrap gauge but neither fills nor drains that queue: the
    default run judges what is there (as before the pack named two queues); named, it must be found."""
    default = kvtrace("examples/nixl-pin", "--format", "json")
    report = json.loads(default.stdout)["reports"][0]
    assert default.returncode == 1 and report["complete"] is True
    assert [q["name"] for q in report["queues"]] == [INFLIGHT]
    named = kvtrace("examples/nixl-pin", "--queue", BOOTSTRAP, "--no-map")
    assert named.returncode == 3
    assert f"self.{BOOTSTRAP} is neither filled nor drained" in named.stderr


def test_unknown_or_conflicting_choices_are_one_line_errors(host: Path) -> None:
    for args, fragment in (
        # A name no role holds: every role's queues are listed (the user chose no pack).
        (["--queue", "disagg_prefill_waiting_queue"],
         f"not a queue of any role (the queues: {INFLIGHT}, {BOOTSTRAP}, {PREALLOC}, {TRANSFER})"),
        (["--queue", f"{TRANSFER},{BOOTSTRAP}"], f"{TRANSFER} is in the pack sglang-decode"),
        (["--role", "decode", "--rules", "sglang-prefill"], "give one of them"),
        (["--role", "both"], "--role"),
    ):
        result = kvtrace(str(host), *args)
        assert result.returncode == 2, (args, result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert fragment in lines[0], lines[0]


def test_role_and_a_decode_queue_pick_the_decode_pack() -> None:
    assert pack_for(None, "decode", []) == "sglang-decode"
    assert pack_for(None, "prefill", []) == "sglang-prefill"
    assert pack_for(None, None, [TRANSFER]) == "sglang-decode"
    assert pack_for(None, None, [BOOTSTRAP]) is None  # the default pack holds it
    assert pack_for("my-fork.toml", None, [TRANSFER]) == "my-fork.toml"  # a pack given is never replaced
    decode = load_pack("sglang-decode")
    assert decode.queues == (PREALLOC, TRANSFER)
    assert select_queues(decode, [TRANSFER]).only == (TRANSFER,)
    with pytest.raises(InputError, match="not a queue of the pack sglang-decode"):
        select_queues(decode, [BOOTSTRAP])
    result = kvtrace("examples/nixl-pin", "--queue", TRANSFER, "--format", "json")
    assert [q["name"] for q in json.loads(result.stdout)["reports"][0]["queues"]] == [TRANSFER]
    # The decode side alone says so in the header; the default (prefill) scan's header is as before.
    assert kvtrace("examples/nixl-pin", "--role", "decode").stdout.splitlines()[0].endswith(" · role decode")
    assert " · role " not in kvtrace("examples/nixl-pin").stdout.splitlines()[0]


def test_role_all_judges_every_queue_of_either_role_in_one_run(host: Path, default_json: dict,
                                                               tmp_path: Path) -> None:
    """`--role all`: one run, one report per role (prefill first), each with a grid per queue of
    that role the tree fills or drains; the prefill report is the default run's. The tree here adds
    to the prefill host a decode-side list of requests whose KV is arriving (our own words), bound
    as disagg_decode_transfer_queue: Success leaves, Failed is aborted, the rest wait."""
    tree = tmp_path / "tree"
    shutil.copytree(host, tree)
    (tree / "disaggregation" / "arrivals.py").write_text(ARRIVALS)
    result = kvtrace(str(tree), "--role", "all", "--format", "json")
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    jsonschema.validate(document, JSON_SCHEMA)
    prefill, decode = document["reports"]
    assert [q["name"] for q in prefill["queues"]] == [INFLIGHT, BOOTSTRAP]
    assert [q["states"] for q in prefill["queues"]] == [q["states"] for q in default_json["queues"]]
    assert [q["name"] for q in decode["queues"]] == [TRANSFER]  # no prealloc list in this tree
    transfer = decode["queues"][0]
    assert transfer["drain"]["path"] == "disaggregation/arrivals.py"
    assert {s: v["fate"] for s, v in transfer["states"].items()} == {
        "Success": ["leaves"], "Failed": ["leaves"], "Bootstrapping": ["kept"],
        "WaitingForInput": ["kept"], "Transferring": ["kept"]}
    assert prefill["complete"] and decode["complete"]
    assert (prefill["role"], decode["role"]) == ("prefill", "decode")
    shown = kvtrace(str(tree), "--role", "all", "--no-map")
    text = shown.stdout
    grids = re.findall(r"Verdicts for (\w+)", text)
    assert grids[:3] == [INFLIGHT, BOOTSTRAP, TRANSFER]
    # Each report's header names its role; stderr has each role's totals, not only the failing one's.
    # The target shares the line where it fits, else it has a line of its own under it.
    assert re.findall(r"^kvtrace \S+ · (?:.* · )?role (\w+)$", text, re.M) == ["prefill", "decode"]
    verdicts = [line for line in shown.stderr.splitlines() if line.startswith("kvtrace: ")]
    assert [line.split(": ", 2)[1] for line in verdicts] == [f"{tree} (prefill)", f"{tree} (decode)"], shown.stderr
    # A single role's report keeps its plain header (the target under it when the line is too wide).
    head = kvtrace(str(tree), "--no-map").stdout.splitlines()
    assert head[0] == f"kvtrace {__version__} · {tree}" or head[:2] == [f"kvtrace {__version__}", str(tree)], head[:2]
    # --queue narrows --role all to the roles holding the queues named; --rules conflicts with it.
    only = json.loads(kvtrace(str(tree), "--role", "all", "--queue", TRANSFER, "--format", "json").stdout)
    assert [[q["name"] for q in r["queues"]] for r in only["reports"]] == [[TRANSFER]]
    both = kvtrace(str(tree), "--queue", f"{INFLIGHT},{TRANSFER}")  # without --role all: it is suggested
    assert both.returncode == 2 and "--role all scans both roles' queues" in both.stderr, both.stderr
    for args, fragment in ((["--rules", "sglang-prefill"], "give one of them"),
                           (["--queue", "disagg_prefill_waiting_queue"], "not a queue of any role")):
        refused = kvtrace(str(tree), "--role", "all", *args)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert fragment in refused.stderr


def test_prefill_pack_says_what_a_bootstrap_request_holds_and_reaches_later() -> None:
    pack = load_pack("sglang-prefill")
    assert pack.queues == (INFLIGHT, BOOTSTRAP)
    assert pack.held_in(BOOTSTRAP) == ()
    assert pack.held_in(INFLIGHT) == ("kv_cache", "metadata_buffer")
    assert pack.reached_later(BOOTSTRAP) == ("Transferring", "Success")
    assert pack.reached_later(INFLIGHT) == ()
    text = '[pack]\nname="x"\npackage_dir="d"\n[queue]\nname="q"\npoll_calls=["p"]\n' \
           '[queue.reached_after]\nother = ["Success"]\n[enum]\nname="E"\nterminal=["S"]\n' \
           '[effects]\nabort_calls=["a"]\n[backends]\nsender_base="B"\n'
    import tomllib

    with pytest.raises(InputError, match=r"x\.toml:7: \[queue\] reached_after: 'other' must be a queue of this pack"):
        validate(tomllib.loads(text), text, "x.toml")
