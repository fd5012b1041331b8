"""Glue shared by the property tests: kvtrace lookup, comparison messages, regression fixtures.

Regression fixtures: when a property fails, the shrunk example hypothesis reports last (the
"final" run) is written to `regressions/<kind>-<digest>/` (or $KVTRACE_REGRESSIONS_DIR):
  disaggregation/...   the fixture tree, as scanned
  expected.json        {"kind", "oracle" (the oracle's verdict, from running the tree),
                        "kvtrace_at_failure" (what kvtrace said then), "note"}
  ir.json              the generator's IR of the tree (for reading; nothing loads it)
test_*_property.py replays every such folder against kvtrace, and test_oracle_selfcheck.py
re-runs the oracle on it and checks it still says what expected.json recorded. Commit a folder
once the bug it shows is understood (fixed, or the test marked as a known limitation).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from . import gen, oracle

HERE = Path(__file__).resolve().parent
REGRESSIONS_DIR = Path(os.environ.get("KVTRACE_REGRESSIONS_DIR", HERE / "regressions"))


def kvtrace_scan():
    """kvtrace.scan.scan_path (a function so each test module names what it tests)."""
    from kvtrace.scan import scan_path

    return scan_path


def reports_with_and_without(switch: str, root: Path, pack: str | None = None) -> tuple[str, str]:
    """The JSON report of a scan of `root`, then of a scan with `kvtrace.flow.<switch>` off: a
    shortcut of the engine against the reference it must equal."""
    from kvtrace import flow
    from kvtrace.packs import load_pack
    from kvtrace.report.json import render

    loaded = load_pack(pack) if pack else None
    fast = render([kvtrace_scan()(root, loaded)])
    setattr(flow, switch, False)
    try:
        reference = render([kvtrace_scan()(root, loaded)])
    finally:
        setattr(flow, switch, True)
    return fast, reference


def numbered(text: str) -> str:
    return "\n".join(f"{i:4} | {line}" for i, line in enumerate(text.splitlines(), 1))


def in_final_run() -> bool:
    """True in hypothesis's last run of a failing example (the shrunk one it reports)."""
    try:
        from hypothesis.control import current_build_context

        return bool(current_build_context().is_final)
    except Exception:
        return False


# ---------------------------------------------------------------------------------------------
# Verdicts as plain JSON


def drain_json(v: oracle.DrainVerdict) -> dict:
    return {"fates": {s: v.fates[s] for s in gen.STATES}, "modes": v.modes}


def senders_json(vs: dict[str, oracle.SenderVerdict]) -> dict:
    out = {}
    for name, v in sorted(vs.items()):
        non_terminal = sorted(v.driven - set(gen.TERMINAL))
        out[name] = {
            "sender": v.sender,
            "returns": sorted(v.returns),
            "way_out": {s: v.way_out(s) for s in non_terminal},
            "abort_ok": {s: v.abort_ok.get(s, False) for s in non_terminal},
            "timeout_ok": {s: v.timeout_ok.get(s, False) for s in non_terminal},
        }
    return out


def kvtrace_senders_json(report) -> dict:
    out = {}
    for b in report.backends:
        out[b.name if b.name not in out else f"{b.name} ({b.sender})"] = {
            "sender": b.sender,
            "returns": sorted(b.returns),
            "reads_abort_state": b.reads_abort_state,
            "abort_state": b.abort_state,
            "timeouts": [{"line": t.line, "covers": sorted(t.covers)} for t in b.timeouts],
        }
    return out


# ---------------------------------------------------------------------------------------------
# Regression fixtures


def save_regression(
    kind: str, files: dict, expected_oracle: dict, kvtrace_said: dict, ir=None, note: str = "", extra: dict | None = None
) -> Path | None:
    """Write a failing example as a fixture folder; only in hypothesis's final run, so the
    shrinker's intermediate failures leave nothing behind. Returns the folder (or None)."""
    if not in_final_run():
        return None
    digest = gen.tree_digest(files)
    target = REGRESSIONS_DIR / f"{kind}-{digest}"
    if target.exists():
        return target
    tmp = REGRESSIONS_DIR / f".{kind}-{digest}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    gen.write_files(tmp, files)
    meta = {"kind": kind, "oracle": expected_oracle, "kvtrace_at_failure": kvtrace_said, "note": note, **(extra or {})}
    (tmp / "expected.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    if ir is not None:
        (tmp / "ir.json").write_text(gen.ir_json(ir) + "\n")
    tmp.rename(target)
    return target


def regression_dirs(kind: str) -> list[Path]:
    if not REGRESSIONS_DIR.is_dir():
        return []
    out = []
    for d in sorted(REGRESSIONS_DIR.iterdir()):
        meta = d / "expected.json"
        if d.is_dir() and not d.name.startswith(".") and meta.is_file():
            if json.loads(meta.read_text()).get("kind") == kind:
                out.append(d)
    return out


def regression_params(kind: str, mark_known: bool = True):
    dirs = regression_dirs(kind)
    assert dirs, f"regressions/ holds no {kind} fixtures: the replay would test nothing"
    # A fixture whose expected.json has "known": "<why>" shows a divergence kvtrace has by
    # design (so far): its replay is a strict xfail, which fails the day kvtrace agrees with the
    # oracle (then rename the entry to "fixed"). The oracle-stability check runs on it as usual.
    params = []
    for d in dirs:
        known = load_expected(d).get("known")
        marks = [pytest.mark.xfail(reason=known, strict=True)] if known and mark_known else []
        params.append(pytest.param(d, id=d.name, marks=marks))
    return params


def load_expected(d: Path) -> dict:
    return json.loads((d / "expected.json").read_text())


def tree_files(d: Path) -> dict[str, str]:
    """The .py files of a fixture folder, relative to it (for messages)."""
    return {p.relative_to(d).as_posix(): p.read_text(encoding="utf-8") for p in sorted((d / "disaggregation").rglob("*.py"))}


# ---------------------------------------------------------------------------------------------
# Comparisons


def compare_fates(root: Path, report, verdict: oracle.DrainVerdict) -> list[str]:
    """Differences between kvtrace's per-state fates and the oracle's ('' list = agree)."""
    problems = []
    if not report.queues:
        return [f"kvtrace found no queue (problems: {report.problems})"]
    got = oracle.kvtrace_fates(report)
    for state in gen.STATES:
        want = verdict.fates[state]
        have = got.get(state)
        if have != want:
            problems.append(f"{state}: kvtrace {have} != oracle {want}")
    # Per mode of the drain (rids_to_check at its default / passed by a caller): same labels,
    # same fates.
    got_modes = oracle.kvtrace_mode_fates(report)
    if list(got_modes) != list(verdict.modes):
        problems.append(f"modes: kvtrace {list(got_modes)} != oracle {list(verdict.modes)}")
    else:
        for label, want_fates in verdict.modes.items():
            for state in gen.STATES:
                if got_modes[label].get(state) != want_fates[state]:
                    problems.append(f"{state} when {label}: kvtrace {got_modes[label].get(state)} != oracle {want_fates[state]}")
    return problems


def fates_message(root: Path, report, verdict: oracle.DrainVerdict, problems: list[str], saved: Path | None) -> str:
    source = (Path(root) / "disaggregation" / "prefill.py").read_text()
    parts = ["kvtrace's fates differ from the oracle's:", *("  " + p for p in problems)]
    if saved:
        parts.append(f"saved as regression fixture {saved}")
    parts += ["", "oracle paths:", verdict.summary(), "", "prefill.py:", numbered(source)]
    if report is not None and report.queues:
        parts += ["", "kvtrace evidence:"]
        for state, fate in report.queues[0].states.items():
            ev = "; ".join(f"{e.path}:{e.line} {e.note}" for e in fate.evidence)
            parts.append(f"  {state}: {fate.fate} {ev}")
    return "\n".join(parts)


def compare_senders(report, verdicts: dict[str, oracle.SenderVerdict], check_returns: bool = False) -> list[str]:
    """Differences between kvtrace's backends and the oracle's senders ('' list = agree)."""
    problems = []
    by_key = {(b.name, b.sender): b for b in report.backends}
    for name, v in sorted(verdicts.items()):
        b = by_key.get((name, v.sender))
        if b is None:
            problems.append(f"{name}: kvtrace reports no backend {v.sender} (it reports {sorted(by_key)})")
            continue
        for state in sorted(v.driven - set(gen.TERMINAL)):
            want = v.way_out(state)
            have = oracle.kvtrace_way_out(b, state)
            if have != want:
                why = (
                    f"oracle: after abort -> terminal {v.abort_ok.get(state)}, after timeout -> terminal "
                    f"{v.timeout_ok.get(state)}; kvtrace: reads_abort_state={b.reads_abort_state} "
                    f"(abort_state={b.abort_state}), timeout covers it: {oracle.kvtrace_timeout_covers(b, state)}"
                )
                problems.append(f"{name}/{state}: kvtrace way out {have} != oracle {want} ({why})")
        if check_returns and set(b.returns) != v.returns:
            # With a real manager, a sender attribute may hold any value its class assigns
            # (`self.conclude_state = status` under `if status in (Success, Failed)`) even one
            # the table never gives it: kvtrace may list more *terminal* states, never fewer
            # states and never a non-terminal one the code cannot return.
            extra = set(b.returns) - v.returns
            if not (v.configs and v.returns <= set(b.returns) and extra <= set(gen.TERMINAL)):
                problems.append(f"{name}: kvtrace returns {sorted(b.returns)} != oracle {sorted(v.returns)}")
        # Shared room (issue 23): a state kvtrace says only the sender's constructor stores (so a
        # verdict on it rests on a second sender for the room) must be brought back by no other run
        # (a store that leaves the entry as it was, max(entry, lower), brings nothing back).
        wrong = sorted(set(b.constructor_only) & v.stored_later)
        if wrong:
            problems.append(f"{name}: kvtrace says only __init__ stores {wrong}, but a later run stores it")
    wanted = {(name, v.sender) for name, v in verdicts.items()}
    extra = sorted(k for k in by_key if k not in wanted)
    if extra:
        problems.append(f"kvtrace reports backends that are not concrete *KVSender classes: {extra}")
    return problems


def senders_message(root: Path, report, verdicts, problems: list[str], saved: Path | None) -> str:
    parts = ["kvtrace's sender verdicts differ from the oracle's:", *("  " + p for p in problems)]
    if saved:
        parts.append(f"saved as regression fixture {saved}")
    parts += ["", "oracle:"] + [v.summary() for v in verdicts.values()]
    parts += ["", "kvtrace:", json.dumps(kvtrace_senders_json(report), indent=1)]
    for rel, text in tree_files(Path(root)).items():
        if rel.endswith("conn.py") and not rel.startswith("disaggregation/base/"):
            parts += ["", rel + ":", numbered(text)]
    return "\n".join(parts)
