"""The analysed model as one typed structure (ScanModel: fate, paths, release_map, way_out), its
enums, the backends table (known returns apart from "unknown: <why>", per-state way out) in
every format, and a function the analysis must read that libcst cannot parse: a gap (exit 3),
never a silent skip, a confident `undrained-queue` or a claimed pin."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import jsonschema
import libcst
import pytest
from rich.console import Console

from kvtrace.fleet import exit_code_for
from kvtrace.flow import Event
from kvtrace.graph import ScanModel, analyse_queue, find_enum
from kvtrace.index import Index
from kvtrace.model import OUTCOME_ORDER, EventKind, Evidence, Outcome, Site, WayOut
from kvtrace.packs import load_pack
from kvtrace.parse import parse_modules
from kvtrace.report import json as json_report
from kvtrace.report import html, markdown, sarif
from kvtrace.report.schema import JSON_SCHEMA
from kvtrace.report.text import render as render_text
from kvtrace.report.verdicts import verdict_grid
from kvtrace.scan import scan_path
from kvtrace.fetch.local import fetch_local

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NIXL_PIN = EXAMPLES / "nixl-pin"


def text_of(report, width: int = 200) -> str:
    buffer = io.StringIO()
    render_text(report, Console(file=buffer, width=width, force_terminal=False, color_system=None, highlight=False))
    return buffer.getvalue()


def model_of(tree: Path) -> ScanModel:
    """The queue model of an example, built stage by stage as the scan does."""
    from kvtrace.backends import analyse_backends

    pack = load_pack()
    fetched = fetch_local(tree)
    root = "disaggregation"
    index = Index(parse_modules(fetched.files).modules, root)
    domain, _ = find_enum(index, pack)
    return ScanModel(analyse_queue(index, pack, domain), analyse_backends(index, pack, domain, root, []), domain)


# --- enums: typed, and text-identical to the strings they replace ------------------------------

def test_enums_read_as_their_strings_everywhere_text_is_made() -> None:
    assert f"{EventKind.KEEP}" == str(EventKind.KEEP) == "keep" and repr(Outcome.KEPT) == "'kept'"
    assert json.dumps({"kind": EventKind.TABLE_RAISE, "fate": [Outcome.LEAVES]}) == \
        '{"kind": "table-raise", "fate": ["leaves"]}'
    assert {EventKind.RELEASE} == {"release"} and hash(Outcome.DROPPED) == hash("dropped")
    assert OUTCOME_ORDER == ("kept", "leaves", "raises", "dropped")


def test_a_kind_that_does_not_exist_fails_and_a_site_must_be_a_site_kind() -> None:
    with pytest.raises(ValueError):
        Event("kep", "a.py", 1, "f")  # a typo never passes as a site
    assert Event("keep", "a.py", 1, "f").kind is EventKind.KEEP
    assert Site("entry", "a.py", 1, "f").kind is EventKind.ENTRY
    with pytest.raises(ValueError):
        Site("table-read", "a.py", 1, "f")  # describes a path, never a row of the release map


# --- the model's queries agree with the paths they summarise ----------------------------------

@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.iterdir() if (p / "disaggregation").is_dir()))
def test_fate_by_reachability_and_release_map_agree_with_the_paths(example: str) -> None:
    model = model_of(EXAMPLES / example)
    if model.queue.drain is None:
        pytest.skip(f"{example} has no drain loop")  # pragma: no cover - every example has one today
    for state in model.domain.members:
        ended = {outcome for _, outcome in model.queue.paths[state]}
        assert model.fate(state) == [o for o in OUTCOME_ORDER if o in ended], state
        for outcome in Outcome:
            assert model.paths(state, outcome) == [e for e, o in model.queue.paths[state] if o is outcome]
    by_place = {(s.kind, s.path, s.line): s for s in model.release_map()}
    for state in model.domain.members:
        for events, _ in model.queue.paths[state]:
            for e in events:
                site = by_place.get((e.kind, e.path, e.line))
                if site is None:
                    assert not e.kind.is_site or e.kind is EventKind.HELPER, e  # only effect-free helpers leave the map
                elif e.kind is not EventKind.CHECK or e.detail == "T":
                    assert state in site.states, (site, state)
    for backend in model.senders:
        for state, verdict in backend.backend.verdicts.items():
            assert model.way_out(backend.backend.name, state) is verdict
    assert model.way_out("no-such-backend", "WaitingForInput") is None
    # Each fate's evidence line carries the kind of event it was seen as (the text's details show
    # effects, not decisions, by that kind); the kind is not part of the evidence's equality.
    kinds: dict[EventKind | None, Evidence] = {}
    for state, fate in model.queue.state_fates(model.domain.members).items():
        for e in fate.evidence:
            assert e.kind is None or e.note.startswith(str(e.kind)), e
            kinds.setdefault(e.kind, e)
    assert EventKind.CHECK in kinds
    check = kinds[EventKind.CHECK]
    assert Evidence(check.path, check.line, check.note) == check and hash(Evidence(check.path, check.line, check.note)) == hash(check)


# --- the backends table: known returns, "unknown: <why>" apart, and each state's way out ------

def test_backends_table_shows_unknown_returns_apart_and_verdicts_in_every_format() -> None:
    report = scan_path(NIXL_PIN)
    nixl = next(b for b in report.backends if b.name == "nixl")
    # The manager's update_status stores a parameter kvtrace cannot follow to a value.
    assert nixl.returns_unknown and "request_status" in nixl.returns_unknown[0]
    why = nixl.returns_unknown[0]

    text = text_of(report)
    backends = text[text.index("\nBackends"):]
    nixl_block = backends[backends.index("  nixl"):]
    returns_line = next(line for line in nixl_block.splitlines() if line.strip().startswith("returns"))
    assert "unknown" not in returns_line  # the known states on their own line
    assert f"unknown: {why[:40]}" in " ".join(nixl_block.split())
    assert "way out      WaitingForInput: none (pinned)" in nixl_block

    document = json.loads(json_report.render([report]))
    jsonschema.validate(document, JSON_SCHEMA)
    entry = next(b for b in document["reports"][0]["backends"] if b["name"] == "nixl")
    assert entry["returns"] == nixl.returns and entry["returns_unknown"] == [why]
    assert entry["verdicts"]["WaitingForInput"]["way_out"] == "none"
    assert entry["verdicts"]["WaitingForInput"]["chain"] and all(
        link["line"] >= 1 for link in entry["verdicts"]["WaitingForInput"]["chain"])
    assert entry["manager"]["name"] == "NixlKVManager" and entry["manager"]["table"] == "request_status"
    mooncake = next(b for b in document["reports"][0]["backends"] if b["name"] == "mooncake")
    assert mooncake["returns_unknown"] == [] and {v["way_out"] for v in mooncake["verdicts"].values()} <= {"abort", "timeout"}

    md = markdown.render([report])
    row = next(line for line in md.splitlines() if line.startswith("| nixl | `NixlKVSender`"))
    assert f"<br>unknown: {why[:40]}" in row and "WaitingForInput: none (pinned)" in row
    page = html.render([report])
    assert "poll() returns Failed, Bootstrapping" in page and "unknown: " in page


# --- a function the analysis must read that libcst cannot parse -------------------------------

@pytest.fixture
def libcst_rejects(monkeypatch: pytest.MonkeyPatch):
    """Make libcst fail on the named functions only (the per-function parse is the seam)."""
    real = libcst.parse_module

    def reject(*names: str) -> None:
        def parse(source: str, *args, **kwargs):
            if any(source.lstrip().startswith(f"def {name}(") for name in names):
                raise libcst.ParserSyntaxError("simulated", lines=[source], raw_line=1, raw_column=0)
            return real(source, *args, **kwargs)

        monkeypatch.setattr(libcst, "parse_module", parse)

    return reject


def assert_loud(report, fragment: str) -> None:
    """Incomplete in every format, and exit 3."""
    assert report.incomplete and any(fragment in g.reason for g in report.gaps), report.gaps
    assert exit_code_for(report, "note") == 3
    assert "INCOMPLETE" in text_of(report) and "INCOMPLETE" in markdown.render([report])
    document = json.loads(json_report.render([report]))
    assert document["reports"][0]["complete"] is False
    assert any(fragment in g["reason"] for g in document["reports"][0]["gaps"])
    log = sarif.to_sarif([report]) if hasattr(sarif, "to_sarif") else json.loads(sarif.render([report]))
    invocation = log["runs"][0]["invocations"][0]
    assert invocation["executionSuccessful"] is False


def test_drain_loop_libcst_cannot_parse_is_a_gap_not_an_undrained_queue(libcst_rejects) -> None:
    clean = scan_path(NIXL_PIN)
    assert clean.queues[0].drain is not None and not clean.incomplete
    libcst_rejects("process_disagg_prefill_inflight_queue")
    report = scan_path(NIXL_PIN)
    assert not any(f.rule == "undrained-queue" for f in report.findings)  # before: a confident error
    assert_loud(report, "disaggregation/prefill.py:46 SchedulerDisaggregationPrefillMixin."
                        "process_disagg_prefill_inflight_queue()")


def test_helper_the_drain_enters_libcst_cannot_parse_is_a_gap(libcst_rejects) -> None:
    libcst_rejects("finish_inflight_success")
    report = scan_path(EXAMPLES / "helper-methods")
    assert report.queues[0].drain is not None  # the loop itself is analysed; the helper is not
    assert_loud(report, "SchedulerDisaggregationPrefillMixin.finish_inflight_success()")


def test_abort_libcst_cannot_parse_claims_no_pin(libcst_rejects) -> None:
    clean = scan_path(NIXL_PIN)
    assert {(f.backend, f.state) for f in clean.findings if f.rule == "pinned-state"} == {
        ("nixl", "WaitingForInput"), ("nixl", "Transferring")}
    libcst_rejects("abort")
    report = scan_path(NIXL_PIN)
    # Whether abort() gives a way out is unknown: no pin is claimed, the cells say "?", not "ok".
    assert not any(f.rule == "pinned-state" for f in report.findings)
    nixl = next(b for b in report.backends if b.name == "nixl")
    assert nixl.verdicts["WaitingForInput"].way_out is WayOut.UNKNOWN
    assert "NixlKVSender.abort()" in nixl.verdicts["WaitingForInput"].how
    grid = verdict_grid(report)
    assert grid.cells["nixl", "WaitingForInput"] == ("?", "warning") and "not decided" in grid.legend
    assert_loud(report, "NixlKVSender.abort() could not be parsed with libcst")


def test_poll_libcst_cannot_parse_is_unknown_not_never_returned(libcst_rejects) -> None:
    libcst_rejects("poll")
    report = scan_path(NIXL_PIN)
    grid = verdict_grid(report)
    assert all(grid.cells["nixl", s] == ("?", "warning") for s in grid.states)  # never "-"
    assert_loud(report, "NixlKVSender.poll() could not be parsed with libcst")


def test_drain_loop_nested_beyond_libcst_is_a_gap_not_an_undrained_queue(tmp_path: Path) -> None:
    """A real input: a 300-operand `and` in the drain loop is deeper than libcst is given."""
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    prefill = tree / "disaggregation" / "prefill.py"
    text = prefill.read_text()
    anchor = "        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):"
    end = text.index("\n", text.index(anchor)) + 1
    chain = " and ".join(f"req.f{i}" for i in range(300))
    prefill.write_text(text[:end] + f"            if {chain}:\n                pass\n" + text[end:])
    report = scan_path(tree)
    assert not any(f.rule == "undrained-queue" for f in report.findings)
    assert_loud(report, "process_disagg_prefill_inflight_queue()")


def test_form_feed_between_methods_keeps_lines_and_the_drain(tmp_path: Path) -> None:
    """A real input: a page break (^L) line between methods. str.splitlines() also ends a line
    at a form feed, so every later line was off by one (and the function snippets handed to
    libcst were cut one line off)."""
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    prefill = tree / "disaggregation" / "prefill.py"
    text = prefill.read_text()
    marker = "    def process_disagg_prefill_inflight_queue("
    prefill.write_text(text.replace(marker, "\x0c\n" + marker))
    before, after = scan_path(NIXL_PIN), scan_path(tree)
    assert not after.incomplete and after.queues[0].drain is not None
    assert not any(f.rule == "undrained-queue" for f in after.findings)
    assert {s: f.fate for s, f in after.queues[0].states.items()} == {s: f.fate for s, f in before.queues[0].states.items()}
    moved = [(s.kind, s.line) for s in after.queues[0].sites if s.path == "disaggregation/prefill.py"]
    original = [(s.kind, s.line + (s.line >= 46)) for s in before.queues[0].sites if s.path == "disaggregation/prefill.py"]
    assert moved == original  # the one inserted line shifts exactly the lines below it
    lines = prefill.read_text().split("\n")
    release = next(s for s in after.queues[0].sites if s.kind is EventKind.RELEASE)
    assert "release" in lines[release.line - 1]


# --- one set of syntax helpers: the same answer on either tree ---------------------------------

@pytest.mark.parametrize("source, plain, with_calls", [
    ("a.b.c", "a.b.c", "a.b.c"),
    ("super().abort", "super().abort", "super().abort"),
    ("super()", "super()", "super()"),
    ("self.get().x", "", "self.get().x"),
    ("a().b().c", "", "a().b().c"),
    ("f()", "", ""),
    ("x[0].y", "", ""),
    ("1 + 2", "", ""),
])
def test_dotted_means_the_same_on_ast_and_libcst(source: str, plain: str, with_calls: str) -> None:
    import ast

    from kvtrace.syntax import dotted

    for node in (ast.parse(source, mode="eval").body, libcst.parse_expression(source)):
        assert dotted(node) == plain and dotted(node, calls=True) == with_calls, (type(node), source)


def test_self_attr_walk_and_mentions_attr_on_both_trees() -> None:
    import ast

    from kvtrace.syntax import mentions_attr, self_attr, walk

    for parse in (lambda s: ast.parse(s, mode="eval").body, libcst.parse_expression):
        assert self_attr(parse("self.conclude_state")) == "conclude_state"
        assert self_attr(parse("sender.conclude_state")) is None
        assert self_attr(parse("sender.conclude_state"), self_name="sender") == "conclude_state"
        assert self_attr(parse("self.a.b")) is None  # an attribute of an attribute is not the object's own
        assert mentions_attr(parse("zip(self.disagg_prefill_inflight_queue, polls)"), "disagg_prefill_inflight_queue")
        assert not mentions_attr(parse("zip(queue, polls)"), "queue")  # a bare name is not an attribute
    names = [n.value for n in walk(libcst.parse_expression("f(a, g(b))")) if isinstance(n, libcst.Name)]
    assert names == ["f", "a", "g", "b"]  # libcst: depth first, source order


# --- severity, problems and graphs as data (issue 17) ------------------------------------------

def test_severity_is_ordered_and_reads_as_its_level_everywhere() -> None:
    from kvtrace.gate import fails_on
    from kvtrace.model import SEVERITIES_WORST_FIRST, Severity

    assert sorted([Severity.NOTE, Severity.ERROR, Severity.WARNING]) == [Severity.NOTE, Severity.WARNING, Severity.ERROR]
    assert max(Severity) is Severity.ERROR and Severity.WARNING > "note" and Severity.WARNING < "error"
    assert SEVERITIES_WORST_FIRST == (Severity.ERROR, Severity.WARNING, Severity.NOTE)
    assert json.dumps([Severity.ERROR]) == '["error"]' and f"{Severity.NOTE}[x]" == "note[x]" and str(Severity.WARNING) == "warning"
    assert Severity("warning") is Severity.WARNING and {"error": 1}[Severity.ERROR] == 1
    # The gate: at or above the level; `never` fails nothing; a level read from another report that
    # kvtrace does not know counts as a note.
    assert [fails_on(s, "warning") for s in ("error", "warning", "note")] == [True, True, False]
    assert not any(fails_on(s, "never") for s in ("error", "warning", "note"))
    assert fails_on("critical", "note") and not fails_on("critical", "warning")


def test_findings_carry_a_severity_and_the_cache_gives_it_back() -> None:
    from kvtrace.cachecodec import decode_report, encode_report
    from kvtrace.model import Severity

    report = scan_path(EXAMPLES / "nixl-pin")
    assert report.findings and all(type(f.severity) is Severity for f in report.findings)
    _, back = decode_report(encode_report({}, report))
    assert [(f.rule, f.severity) for f in back.findings] == [(f.rule, f.severity) for f in report.findings]
    assert all(type(f.severity) is Severity for f in back.findings)


# A second queue in our own words: a wait list for the handshake, drained by its own class, that
# the prefill pack knows as the bootstrap queue.
WAIT_LIST = '''\
from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.utils import poll_and_all_reduce, prepare_abort


class GreetingLine:
    def __init__(self, scheduler, group):
        self.scheduler = scheduler
        self.group = group
        self.queue = []

    def join(self, req):
        self.queue.append(req)

    def pop_greeted(self):
        polls = poll_and_all_reduce([req.disagg_kv_sender for req in self.queue], self.group)
        greeted, still = [], []
        for req, poll in zip(self.queue, polls):
            if poll == KVPoll.Failed:
                prepare_abort(req, "no greeting")
                self.scheduler.stream_output([req], False)
            elif poll == KVPoll.Bootstrapping:
                still.append(req)
            else:
                greeted.append(req)
        self.queue = still
        return greeted


class GreetingMixin:
    def open_line(self, group):
        self.disagg_prefill_bootstrap_queue = GreetingLine(self, group)

    def arrive(self, req):
        self.disagg_prefill_bootstrap_queue.join(req)

    def let_in(self):
        self.waiting_queue.extend(self.disagg_prefill_bootstrap_queue.pop_greeted())
'''


def test_the_report_keeps_one_graph_per_queue_and_draws_the_pinned_one(tmp_path: Path) -> None:
    """Issue 17: the report carried only the drawn queue's graph. Each judged queue keeps its own;
    `drawn` names the one the diagrams show (the first with a pin) and `graph` is that one, as before."""
    from kvtrace.cachecodec import decode_report, encode_report
    from kvtrace.report.diagram import drawn_queue, queue_graph

    tree = tmp_path / "tree"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    (tree / "disaggregation" / "greeting.py").write_text(WAIT_LIST)
    report = scan_path(tree)
    inflight, bootstrap = "disagg_prefill_inflight_queue", "disagg_prefill_bootstrap_queue"
    assert list(report.graphs) == [inflight, bootstrap]  # the pack's order
    functions = {name: {attrs.get("function") for _, attrs in graph["nodes"]} for name, graph in report.graphs.items()}
    assert any(f and f.endswith("pop_greeted") for f in functions[bootstrap]), functions[bootstrap]
    assert not any(f and f.endswith("pop_greeted") for f in functions[inflight]), functions[inflight]
    assert report.drawn == inflight and any(f.rule == "pinned-state" and f.queue == inflight for f in report.findings)
    assert report.graph == {**report.graphs[inflight], "queue": inflight}
    drawn = drawn_queue(report)
    assert drawn is not None and drawn.name == inflight and queue_graph(report).number_of_nodes() > 1
    _, back = decode_report(encode_report({}, report))
    assert back.graphs == report.graphs and back.drawn == report.drawn


def test_problems_are_typed_with_where_they_are_and_the_gaps_say_which_kind(libcst_rejects) -> None:
    """A function libcst cannot parse is a problem of kind UNPARSED at its path:line (here abort(),
    met by the sender analysis, which may run in the forked child); its gap carries the kind; every
    format keeps the text alone, as before."""
    from kvtrace.model import GapKind, Problem, ProblemKind

    libcst_rejects("abort")
    report = scan_path(NIXL_PIN)
    unparsed = [p for p in report.problems if p.kind is ProblemKind.UNPARSED]
    assert unparsed and all(isinstance(p, Problem) for p in report.problems)
    nixl = next(p for p in unparsed if "NixlKVSender.abort()" in p.text)
    path, _, line = (nixl.where or "").partition(":")
    assert path == "disaggregation/nixl/conn.py" and line.isdigit()
    assert (NIXL_PIN / path).read_text().splitlines()[int(line) - 1].lstrip().startswith("def abort(")
    analysis = [g for g in report.gaps if g.kind is GapKind.ANALYSIS]
    assert [(g.problem, g.reason) for g in analysis] == [(p.kind, p.text) for p in report.problems]
    document = json.loads(json_report.render([report]))["reports"][0]
    assert document["problems"] == [p.text for p in report.problems]


def test_evidence_in_json_is_path_line_and_note_wherever_it_is_written() -> None:
    """Evidence's kind is for the writers, not a field of the report: every place JSON writes a
    piece of evidence (the enum, a queue's drain, findings, fates) writes path, line and note."""
    data = json_report.to_json_dict(scan_path(EXAMPLES / "nixl-pin"))
    assert set(data["enum"]) == {"path", "line", "note"}
    for queue in data["queues"]:
        assert queue["drain"] is None or set(queue["drain"]) == {"path", "line", "note"}
    notes: list[dict] = []

    def walk(value: object) -> None:
        if isinstance(value, dict):
            if "note" in value and "line" in value:
                notes.append(value)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
    walk(data)
    leaked = [e for e in notes if set(e) == {"path", "line", "note", "kind"}]  # an Evidence written whole
    assert len(notes) > 10 and not leaked, leaked[:3]
