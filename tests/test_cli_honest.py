"""A fresh-clone user trial's findings: nothing partial may look clean, no gate that cannot
fail, no silently ignored option. Each test runs the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NIXL_PIN = ROOT / "examples" / "nixl-pin"


def kvtrace(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtrace: error: "), result.stderr
    return lines[0]


@pytest.fixture
def incomplete_tree(tmp_path: Path) -> Path:
    """The NIXL pin with one unparsable file: exit 3 when unpiped."""
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    (tree / "disaggregation" / "broken.py").write_text("def f(:\n")
    return tree


# --- 3. a closed stdout does not change the verdict ------------------------------------------

@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("stderr_too", [False, True])
def test_a_reader_that_goes_away_keeps_the_exit_code(incomplete_tree: Path, fmt: str, stderr_too: bool) -> None:
    """Before: `kvtrace scan TREE 2>&1 | head -16` exited 1 (or 0) where the scan itself gives 3.
    The read end is closed before kvtrace writes a byte, so every write meets EPIPE."""
    assert kvtrace("scan", str(incomplete_tree)).returncode == 3
    proc = subprocess.Popen([sys.executable, "-m", "kvtrace", "scan", str(incomplete_tree), "--format", fmt],
                            cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if stderr_too else subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 3
    if not stderr_too:
        assert b"Traceback" not in err and b"Exception ignored" not in err and b"BrokenPipe" not in err, err


@pytest.mark.parametrize("args", [("rules",), ("explain", "KVT001"), ("--help",)])
def test_a_listing_whose_reader_goes_away_is_not_a_failure(args: tuple[str, ...]) -> None:
    """Before: `kvtrace rules | head -1` exited 1 (click turns EPIPE into exit 1)."""
    proc = subprocess.Popen([sys.executable, "-m", "kvtrace", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert b"Traceback" not in err and b"Exception ignored" not in err and b"BrokenPipe" not in err, err


# --- 4. merge: no gate that cannot fail; hosts told apart ------------------------------------

@pytest.mark.parametrize("content", ["[]", '{"schema": "kvtrace/2", "kvtrace": "0.1.0", "reports": []}'])
def test_merge_of_no_report_is_an_error(tmp_path: Path, content: str) -> None:
    """Before: "Fleet: 0 hosts, exit 0"."""
    empty = tmp_path / "e.json"
    empty.write_text(content)
    line = one_line_error(kvtrace("merge", str(empty)))
    assert "e.json: holds no report" in line


def test_merge_tells_apart_two_reports_from_one_machine(tmp_path: Path, incomplete_tree: Path) -> None:
    """Before: both were labelled with the machine's host name alone."""
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert kvtrace("scan", str(NIXL_PIN), "--format", "json", "-o", str(first)).returncode == 1
    assert kvtrace("scan", str(incomplete_tree), "--format", "json", "-o", str(second)).returncode == 3
    result = kvtrace("merge", str(first), str(second), "--format", "json")
    assert result.returncode == 3, result.stderr
    hosts = [h["target"] for h in json.loads(result.stdout)["hosts"]]
    host = json.loads(first.read_text())["reports"][0]["host"]
    assert hosts == [f"{host} ({first})", f"{host} ({second})"]
    # Two reports of one host in one file (`scan --all`): their place in the file tells them apart.
    together = tmp_path / "together.json"
    document = json.loads(first.read_text())
    document["reports"] += json.loads(second.read_text())["reports"]
    together.write_text(json.dumps(document))
    both = kvtrace("merge", str(together), "--format", "json")
    assert [h["target"] for h in json.loads(both.stdout)["hosts"]] == [
        f"{host} ({together}, report 1)", f"{host} ({together}, report 2)"]
    # A host name seen once keeps its plain name.
    alone = kvtrace("merge", str(first), "--format", "json")
    assert [h["target"] for h in json.loads(alone.stdout)["hosts"]] == [host]


# --- 5. the report format follows --output's extension ---------------------------------------

@pytest.mark.parametrize(("name", "starts"), [
    ("k.sarif", '{\n  "$schema": "https://docs.oasis-open.org/sarif'),
    ("k.sarif.json", '{\n  "$schema": "https://docs.oasis-open.org/sarif'),
    ("k.json", '{\n  "schema": "kvtrace/2"'),
    ("k.md", "# kvtrace: "),
    ("k.html", "<!DOCTYPE html>"),
    ("k.txt", "kvtrace "),
])
def test_the_format_follows_the_output_extension(tmp_path: Path, name: str, starts: str) -> None:
    """Before: `-o x.sarif` without --format wrote the text report into it."""
    out = tmp_path / name
    result = kvtrace("scan", str(NIXL_PIN), "-o", str(out))
    assert result.returncode == 1, result.stderr
    assert out.read_text().startswith(starts)


@pytest.mark.parametrize(("fmt", "name"), [("text", "k.sarif"), ("json", "k.md"), ("sarif", "k.html"),
                                           ("markdown", "k.json")])
def test_a_format_the_extension_contradicts_is_refused(tmp_path: Path, fmt: str, name: str) -> None:
    out = tmp_path / name
    line = one_line_error(kvtrace("scan", str(NIXL_PIN), "--format", fmt, "-o", str(out)))
    assert f"--format {fmt} contradicts --output {out}" in line
    assert not out.exists()  # refused before anything was scanned or written
    # A .json file is a kvtrace JSON report (issue 19: SARIF went silently into x.json); .sarif.json is SARIF.
    assert "contradicts" in one_line_error(kvtrace("scan", str(NIXL_PIN), "--format", "sarif", "-o", str(tmp_path / "s.json")))
    assert kvtrace("scan", str(NIXL_PIN), "--format", "sarif", "-o", str(tmp_path / "s.sarif.json")).returncode == 1
    assert '"$schema"' in (tmp_path / "s.sarif.json").read_text()


# --- 6. SARIF locations are valid URIs --------------------------------------------------------

def test_sarif_uris_are_percent_encoded_and_valid(tmp_path: Path) -> None:
    """Before: "my tree/nixl pin/disaggregation/..." went into artifactLocation.uri as is."""
    import jsonschema

    tree = tmp_path / "my tree" / "nixl pin #1 é"
    shutil.copytree(NIXL_PIN, tree)
    (tree / "disaggregation" / "broken file.py").write_text("def f(:\n")  # a file gap has a location too
    conn = tree / "disaggregation" / "nixl" / "conn.py"
    conn.write_text(conn.read_text().replace("    def poll(self) -> KVPoll:",
                                             "    def poll(self) -> KVPoll:  # kvtrace: ignore[pinned-state]", 1))
    out = tmp_path / "k.sarif"
    result = kvtrace("scan", str(tree), "-o", str(out), cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    log = json.loads(out.read_text())
    schema = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
    checker = jsonschema.FormatChecker()
    assert "uri-reference" in checker.checkers  # rfc3986-validator (test extra) makes the check real
    jsonschema.validate(log, schema, format_checker=checker)
    uris = {loc["physicalLocation"]["artifactLocation"]["uri"]
            for run in log["runs"] for res in run["results"] for loc in res["locations"]}
    uris |= {loc["physicalLocation"]["artifactLocation"]["uri"] for run in log["runs"]
             for inv in run["invocations"] for note in inv["toolExecutionNotifications"]
             for loc in note.get("locations", [])}
    suppressed = {sup["location"]["physicalLocation"]["artifactLocation"]["uri"] for run in log["runs"]
                  for res in run["results"] for sup in res.get("suppressions", [])}
    uris |= suppressed
    prefix = "my%20tree/nixl%20pin%20%231%20%C3%A9/disaggregation/"
    assert suppressed == {f"{prefix}nixl/conn.py"}  # like every location: from the SARIF root
    assert f"{prefix}nixl/conn.py" in uris and f"{prefix}broken%20file.py" in uris
    assert all(checker.conforms(u, "uri-reference") and " " not in u for u in uris)


# --- 7. backend filters: never silent --------------------------------------------------------

def test_an_unknown_backend_to_leave_out_is_a_warning_naming_the_backends(tmp_path: Path) -> None:
    """Before: `--ignore-backend nixxl` was accepted without a word. A warning (not exit 2): a
    typo only leaves more in, so the gate gets stricter, never blind."""
    result = kvtrace("scan", str(NIXL_PIN), "--ignore-backend", "nixxl", "--no-map")
    assert result.returncode == 1
    warnings = [line for line in result.stderr.splitlines() if line.startswith("kvtrace: warning:")]
    assert warnings == [f"kvtrace: warning: {NIXL_PIN}: --ignore-backend: no backend nixxl in this tree "
                        "(its backends: mooncake, nixl); nothing left out for it"]
    assert "no such backend to leave out: nixxl" in result.stdout.splitlines()[2]
    data = json.loads(kvtrace("scan", str(NIXL_PIN), "--ignore-backend", "nixxl", "--format", "json").stdout)
    assert data["reports"][0]["filters"]["unknown_backends"] == ["nixxl"]
    clean = kvtrace("scan", str(NIXL_PIN), "--ignore-backend", "nixl", "--no-map")
    assert "warning" not in clean.stderr and "left out: backend nixl" in clean.stdout.splitlines()[2]


def test_a_config_in_the_scanned_tree_is_named_in_the_report(tmp_path: Path) -> None:
    """Before: `ignore-backends = ["nixl"]` in the scanned tree's pyproject.toml removed the nixl
    pin and the report did not say so."""
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    config = tree / "pyproject.toml"
    config.write_text('[tool.kvtrace]\nignore-backends = ["nixl"]\nignore = ["no-timeout"]\n')
    result = kvtrace("scan", str(tree), "--no-map", cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # without nixl no error is left: warnings do not fail by default
    # Under the header and the package line (the target on a line of its own when too wide).
    lines = result.stdout.splitlines()
    assert lines[3 if lines[1] == str(tree) else 2] == f"config {config} · left out: backend nixl · rules left out: no-timeout"
    data = json.loads(kvtrace("scan", str(tree), "--format", "json", cwd=tmp_path).stdout)
    report = data["reports"][0]
    assert report["filters"] == {"config": str(config), "select": [], "ignore": ["no-timeout"],
                                 "ignored_backends": ["nixl"], "unknown_backends": []}
    import jsonschema

    schema = json.loads(kvtrace("schema").stdout)
    jsonschema.validate(data, schema)
    assert not any(f["backend"] == "nixl" for f in report["findings"])
    sarif = json.loads(kvtrace("scan", str(tree), "--format", "sarif", cwd=tmp_path).stdout)
    assert sarif["runs"][0]["invocations"][0]["properties"]["filters"] == \
        f"config {config} · left out: backend nixl · rules left out: no-timeout"
    # Unfiltered, the header says nothing more than before.
    plain_run = kvtrace("scan", str(NIXL_PIN), "--no-map")
    assert plain_run.stdout.splitlines()[2] == ""


# --- 8. small things: one clear line each ----------------------------------------------------

def test_a_bad_cache_bound_is_an_error() -> None:
    """Before: KVTRACE_CACHE_MAX_BYTES=abc was silently taken as the default 64 MiB."""
    env = {**os.environ, "KVTRACE_CACHE_MAX_BYTES": "abc"}
    for args in (("scan", str(NIXL_PIN)), ("cache", "info")):
        line = one_line_error(kvtrace(*args, env=env))
        assert line == "kvtrace: error: KVTRACE_CACHE_MAX_BYTES='abc': not a number of bytes (e.g. 67108864; 0 keeps nothing)"
    assert kvtrace("scan", str(NIXL_PIN), env={**os.environ, "KVTRACE_CACHE_MAX_BYTES": "1000"}).returncode == 1


@pytest.mark.parametrize(("args", "expected"), [
    (("--format", "pdf"), "kvtrace: error: --format pdf: not one of text, json, sarif, markdown, github, html, concise "
                          "(see 'kvtrace scan --help')"),
    (("--fail-on", "bad"), "kvtrace: error: --fail-on bad: not one of error, warning, note, never "
                           "(see 'kvtrace scan --help')"),
    (("--max-files", "0"), "kvtrace: error: --max-files: must be at least 1 (see 'kvtrace scan --help')"),
    (("--timeout", "soon"), "kvtrace: error: --timeout: not a number (see 'kvtrace scan --help')"),
])
def test_option_errors_speak_kvtrace_not_the_validation_library(args: tuple[str, ...], expected: str) -> None:
    """Before: "Value error, 'pdf' is not one of ...", "Input should be greater than or equal to 1"."""
    assert one_line_error(kvtrace("scan", str(NIXL_PIN), *args)) == expected


def test_an_unknown_rule_is_short_with_a_suggestion(tmp_path: Path) -> None:
    """Before: one ~430-character line listing all 28 ids, starting "command line: select:"."""
    line = one_line_error(kvtrace("scan", str(NIXL_PIN), "--select", "pined-state"))
    assert line.startswith("kvtrace: error: --select pined-state: unknown rule 'pined-state'; did you mean pinned-state")
    assert line.endswith("(`kvtrace rules` lists them)") and len(line) < 160
    line = one_line_error(kvtrace("scan", str(NIXL_PIN), "--ignore", "KVT0001"))
    assert "--ignore KVT0001: unknown rule 'KVT0001'; did you mean KVT001" in line and len(line) < 160
    assert one_line_error(kvtrace("explain", "pinned")) == \
        "kvtrace: error: unknown rule 'pinned'; did you mean pinned-state? (`kvtrace rules` lists them)"
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    (tree / "pyproject.toml").write_text('[tool.kvtrace]\nignore = ["no-timout"]\n')
    line = one_line_error(kvtrace("scan", str(tree), cwd=tmp_path))
    assert line == (f"kvtrace: error: {tree / 'pyproject.toml'}: [tool.kvtrace]: ignore: unknown rule 'no-timout'; "
                    "did you mean no-timeout? (`kvtrace rules` lists them)")


def test_a_file_over_the_size_limit_names_the_option(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    (tree / "disaggregation" / "gen.py").write_text("X = 1\n" * 3000)
    result = kvtrace("scan", str(tree), "--max-file-bytes", "10000", "--no-map")
    assert result.returncode == 3
    # The path opens from the working directory (ROOT): the tree is outside it, so it is absolute.
    assert f"kvtrace: incomplete: {tree}: {tree / 'disaggregation' / 'gen.py'} not analysed (too large: 18000 bytes, over the " \
           "per-file limit (--max-file-bytes 10000))" in result.stderr.splitlines()


def test_the_tree_size_limits_refuse_as_the_readme_says(tmp_path: Path) -> None:
    """The README and the behaviour agree: --max-files and --max-total-bytes refuse (exit 2,
    naming the limit); nothing is analysed from a cut-off fetch."""
    for option, value, words in (("--max-files", "3", "more than 3 .py files"),
                                 ("--max-total-bytes", "2000", "more than 2000 bytes")):
        line = one_line_error(kvtrace("scan", str(NIXL_PIN), option, value))
        assert words in line and option in line
    readme = (ROOT / "README.md").read_text()
    assert "is refused (exit 2, naming the limit)" in readme
    assert "`--max-files` (20,000) or `--max-total-bytes` (128 MiB; the whole SGLang 0.5.23 package is\n67 MB), " \
           "saying which limit stopped it" not in readme


def test_the_result_cache_keys_on_why_a_file_was_not_read(tmp_path: Path) -> None:
    """Two trees alike but for where a link leads: the second scan must not be served the
    first one's gap (a file not read has no bytes to hash; its reason is its content)."""
    env = {**os.environ, "KVTRACE_CACHE_DIR": str(tmp_path / "cache")}
    reasons = []
    for name in ("one", "two"):
        tree = tmp_path / name / "tree"
        shutil.copytree(NIXL_PIN, tree)
        shutil.move(str(tree / "disaggregation" / "nixl"), str(tmp_path / name / "elsewhere"))
        os.symlink(tmp_path / name / "elsewhere", tree / "disaggregation" / "nixl")
        result = kvtrace("scan", str(tree), "--format", "json", env=env)
        assert result.returncode == 3
        reasons.append(json.loads(result.stdout)["reports"][0]["gaps"][0]["reason"])
    assert str(tmp_path / "one" / "elsewhere") in reasons[0] and str(tmp_path / "two" / "elsewhere") in reasons[1]


def test_keeping_a_backend_the_other_option_left_out_says_so() -> None:
    """Before: `--backend nixl --ignore-backend nixl` said "no such backend in this tree", though
    the tree has it: the other option had removed it."""
    result = kvtrace("scan", str(NIXL_PIN), "--backend", "nixl", "--ignore-backend", "nixl")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"kvtrace: error: {NIXL_PIN}: --backend nixl: removed by --ignore-backend (or ignore-backends in the config): "
        "the two options name the same backend, so no row would be left"]
    typo = kvtrace("scan", str(NIXL_PIN), "--backend", "nixxl")
    assert typo.returncode == 2 and "no such backend in this tree" in typo.stderr


@pytest.mark.parametrize("target", ["ssh://root@127.0.0.1:2299", "root@127.0.0.1:2299"])
def test_a_port_and_no_path_gets_the_same_hint_in_both_forms(target: str) -> None:
    """Before: `ssh://root@127.0.0.1:2299` scanned the login directory (and on a refused port,
    failed after trying to connect) while `root@127.0.0.1:2299` said no path was given."""
    from kvtrace.errors import InputError
    from kvtrace.target import parse_target

    with pytest.raises(InputError) as caught:
        parse_target(target)
    message = str(caught.value)
    assert message.startswith(f"{target}: no path given (") and "\n" not in message
    assert f"write {target}{'/' if target.startswith('ssh://') else ':'}PATH, e.g. " in message
    assert parse_target("ssh://root@127.0.0.1:2299/").path == "/"  # a path given: the root
