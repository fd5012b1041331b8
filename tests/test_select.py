"""fetch/select.py: the files the scan reads, chosen the same way for every route."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from kvtrace.fetch import fetch_target
from kvtrace.fetch.local import fetch_local
from kvtrace.fetch.select import Wanted, defines, narrow
from kvtrace.model import FetchLimits
from kvtrace.packs import load_pack
from kvtrace.report.json import to_json_dict
from kvtrace.scan import scan_fetched

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_defines_is_the_multiline_regex() -> None:
    """The scan's own test for `class NAME` at a line start, without its cost."""
    regex = re.compile(r"^\s*class\s+KVPoll\b", re.MULTILINE)
    statement = re.compile(r"class\s+KVPoll\b")
    pieces = ["class KVPoll", "class  KVPoll:", "x", " ", "\n", "\t", "\x0b", "\x1c", "\xa0", "\r", "KVPollX",
              "class\nKVPoll", "#", "classKVPoll", "\u2028", "\f"]
    rng = random.Random(21)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 7)))
        assert bool(regex.search(text)) == defines(text, statement), repr(text)


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()))
def test_narrowed_tree_gives_the_same_report(example: str, tmp_path: Path) -> None:
    """Files nobody reads beside the example (a decoy folder named like the package, a file
    naming the enum in a comment, unrelated modules) are left out, and the report is the same."""
    import shutil

    tree = tmp_path / "site" / "sglang" / "srt"
    shutil.copytree(EXAMPLES / example, tree)
    (tree.parent / "version.py").write_text('__version__ = "1.2.3"\n')
    (tree / "lang" / "disaggregation").mkdir(parents=True)
    (tree / "lang" / "disaggregation" / "x.py").write_text("X = 1\n")
    (tree / "docs.py").write_text("# see KVPoll\n")
    for i in range(20):
        (tree / f"unrelated{i}.py").write_text(f"def f{i}():\n    return {i}\n")
    pack = load_pack()
    full = fetch_local(tmp_path / "site")
    narrowed = narrow(fetch_local(tmp_path / "site"), Wanted.from_pack(pack))
    # The CLI's fetch drops what it cannot need as it reads, and ends with the same files.
    by_cli = fetch_target(str(tmp_path / "site"), FetchLimits(), pack=pack)
    assert [(f.path, f.sha256, f.status) for f in by_cli.files] == [(f.path, f.sha256, f.status) for f in narrowed.files]
    left_out = {f.path for f in full.files} - {f.path for f in narrowed.files}
    assert {f"sglang/srt/unrelated{i}.py" for i in range(20)} <= left_out
    assert "sglang/srt/lang/disaggregation/x.py" in left_out
    assert "sglang/version.py" not in left_out and "sglang/srt/docs.py" not in left_out
    try:
        expected = to_json_dict(scan_fetched(full, pack))
    except Exception as exc:  # an example that is an input error must be the same error
        with pytest.raises(type(exc)) as info:
            scan_fetched(narrowed, pack)
        assert str(info.value) == str(exc)
        return
    assert to_json_dict(scan_fetched(narrowed, pack)) == expected


def test_renamed_package_folder_is_read_whole(tmp_path: Path) -> None:
    """No folder named like the package: the scan reads the whole target, so nothing is dropped."""
    import shutil

    shutil.copytree(EXAMPLES / "nixl-pin" / "disaggregation", tmp_path / "kv_transfer")
    (tmp_path / "other.py").write_text("def g():\n    return 1\n")
    by_cli = fetch_target(str(tmp_path), FetchLimits(), pack=load_pack())
    full = fetch_local(tmp_path)
    assert [(f.path, f.sha256) for f in by_cli.files] == [(f.path, f.sha256) for f in full.files]
    assert "other.py" in {f.path for f in by_cli.files}


def test_target_named_like_the_package_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`scan .../disaggregation`: the target is the package, so every file is read, in one pass
    (not a filtered pass and then a whole one), and the files are what a plain read gives."""
    import shutil

    import kvtrace.fetch.local

    shutil.copytree(EXAMPLES / "nixl-pin" / "disaggregation", tmp_path / "disaggregation")
    (tmp_path / "disaggregation" / "unrelated.py").write_text("def g():\n    return 1\n")
    reads: list[Path] = []
    real = kvtrace.fetch.local.fetch_local

    def counted(root: Path, *args: object, **kwargs: object) -> object:
        reads.append(root)
        return real(root, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kvtrace.fetch.local, "fetch_local", counted)
    by_cli = fetch_target(str(tmp_path / "disaggregation") + "/", FetchLimits(), pack=load_pack())
    assert len(reads) == 1
    full = real(tmp_path / "disaggregation")
    assert [(f.path, f.sha256) for f in by_cli.files] == [(f.path, f.sha256) for f in full.files]
    assert "unrelated.py" in {f.path for f in by_cli.files}
