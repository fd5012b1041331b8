"""Every rule's VALID and INVALID samples (Fixit's convention), run through a real scan; every
bundled pack's own samples (`kvtrace/packs/<pack>.samples.toml`); the pack schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtrace.errors import InputError
from kvtrace.packs import PackSample, available_packs, load_pack, load_samples
from kvtrace.rules import ALL_RULES, find_rule
from kvtrace.rules.base import Rule, Sample
from kvtrace.scan import scan_path
from tests.trees import write_tree

CASES = [
    pytest.param(rule, sample, kind, id=f"{rule.code}-{rule.name}-{kind}-{i}")
    for rule in ALL_RULES
    for kind, samples in (("valid", rule.VALID), ("invalid", rule.INVALID))
    for i, sample in enumerate(samples)
]


@pytest.mark.parametrize(("rule", "sample", "kind"), CASES)
def test_rule_samples(rule: type[Rule], sample: Sample, kind: str, tmp_path: Path) -> None:
    report = scan_path(write_tree(tmp_path, sample.files))
    assert all(f.status == "ok" for f in report.files), [(f.path, f.error) for f in report.files]
    found = {(f.backend, f.state) for f in report.findings if f.rule == rule.name}
    assert found == set(sample.expect)
    assert all(f.code == rule.code for f in report.findings if f.rule == rule.name)
    if kind == "valid":
        assert not sample.expect


def test_a_drain_that_may_be_in_a_file_not_analysed_is_a_gap_not_undrained(tmp_path: Path) -> None:
    """undrained-queue's INVALID sample plus one file that does not parse: the drain may be there,
    so the queue is a problem of the scan (INCOMPLETE), never the rule's error."""
    from kvtrace.rules.undrained_queue import UndrainedQueue

    [invalid] = UndrainedQueue.INVALID
    report = scan_path(write_tree(tmp_path, {**invalid.files, "disaggregation/bootstrap.py": "def (:\n"}))
    assert [f.status for f in report.files if f.path.endswith("bootstrap.py")] == ["syntax-error"]
    assert not [f for f in report.findings if f.rule == UndrainedQueue.name]
    assert any("is filled but not drained in the analysed files (files not analysed: disaggregation/bootstrap.py)"
               in p.text for p in report.problems), report.problems


PACK_CASES = [
    pytest.param(pack, sample, shared, id=f"{pack}-{sample.rule}-{sample.kind}-line{sample.line}")
    for pack in available_packs()
    for shared, samples in [load_samples(pack)]
    for sample in samples
]


@pytest.mark.parametrize(("pack", "sample", "shared"), PACK_CASES)
def test_pack_samples(pack: str, sample: PackSample, shared: dict[str, str], tmp_path: Path) -> None:
    """A pack's samples run with that pack: a new pack is tested without editing this file."""
    rule = find_rule(sample.rule)
    assert rule is not None, f"{pack}.samples.toml:{sample.line}: unknown rule {sample.rule!r}"
    report = scan_path(write_tree(tmp_path, sample.files, shared), load_pack(pack))
    assert all(f.status == "ok" for f in report.files), [(f.path, f.error) for f in report.files]
    found = {(f.backend, f.state) for f in report.findings if f.rule == rule.name}
    assert found == set(sample.expect), sample.note
    if sample.kind == "valid":
        assert not sample.expect


def test_every_pack_has_valid_and_invalid_samples_or_none() -> None:
    for pack in available_packs():
        _, samples = load_samples(pack)
        kinds = {s.kind for s in samples}
        assert kinds in (set(), {"valid", "invalid"}), pack


def test_every_rule_is_documented_and_has_samples() -> None:
    codes = [rule.code for rule in ALL_RULES]
    assert len(set(codes)) == len(codes) and len({r.name for r in ALL_RULES}) == len(codes)
    for rule in ALL_RULES:
        assert rule.code.startswith("KVT") and len(rule.code) == 6
        docs = rule.docs()
        for section in ("What it does:", "Why it matters:", "Example:", "Fix:"):
            assert section in docs, f"{rule.name} docs lack {section!r}"
        assert rule.VALID and rule.INVALID, f"{rule.name} needs VALID and INVALID samples"
        assert rule.severity in ("error", "warning", "note")
        assert find_rule(rule.code) is rule and find_rule(rule.name) is rule
        assert find_rule(rule.code.lower()) is rule


MINIMAL = '''\
[pack]
name = "mine"
package_dir = "disaggregation"

[queue]
name = "my_queue"
poll_calls = ["*.poll"]

[enum]
name = "KVPoll"
terminal = ["Success", "Failed"]

[effects]
abort_calls = ["*prepare_abort"]

[backends]
sender_base = "BaseKVSender"
'''


def _pack_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_pack(str(path))
    return str(caught.value)


def test_minimal_pack_loads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(MINIMAL)
    pack = load_pack(str(path))
    assert pack.queues == ("my_queue",) and pack.poll_method == "poll" and pack.resources == ()


@pytest.mark.parametrize(("edit", "marker", "message"), [
    (lambda t: t.replace('poll_calls = ["*.poll"]', 'poll_calls = ["*.poll"]\npoll_cals = []'), "poll_cals",
     "[queue] unknown key 'poll_cals'"),
    (lambda t: t.replace('terminal = ["Success", "Failed"]', 'terminal = "Success"'), "terminal",
     "[enum] terminal must be a list of strings"),
    (lambda t: t + "\n[backend]\nsender_base = 'X'\n", "[backend]", "unknown section [backend]"),
    (lambda t: t.replace('sender_base = "BaseKVSender"', ''), "[backends]", "[backends] sender_base is missing"),
    (lambda t: t.replace('[effects]', '[effects.resources]\nkv = "x"\n[effects]'), "[effects.resources]",
     "[effects] resources must be a table of lists of strings"),
    (lambda t: t.replace('name = "my_queue"', 'names = "my_queue"'), "names", "[queue] names must be a list of strings"),
])
def test_pack_schema_errors_name_file_and_line(tmp_path: Path, edit, marker: str, message: str) -> None:
    text = edit(MINIMAL)
    line = next(n for n, row in enumerate(text.splitlines(), 1) if row.startswith(marker))
    error = _pack_error(tmp_path, text)
    assert f"mine.toml:{line}: " in error and message in error, error
    assert "\n" not in error


def test_bundled_packs_validate() -> None:
    for name in available_packs():
        pack = load_pack(name)
        assert pack.queues and pack.source.endswith(f"{name}.toml")
