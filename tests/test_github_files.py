"""The README's CI forms, each run the way its system runs it, from a git URL of a local clone of
this checkout tagged like a release (kvtrace is not on PyPI):

- pip in a CI job: a clean virtualenv runs the README's `pip install "git+<url>@<tag>"` line;
- the Action: `action.yml` is checked out at the tag (as the runner fetches `uses: owner/repo@tag`)
  and its steps run as the runner would (bash -eo pipefail, env from the step, GITHUB_OUTPUT)
  with the README snippet's inputs;
- pre-commit: the README's `.pre-commit-config.yaml` (`repo:` + `rev:` the tag) through a real
  `pre-commit run`, which clones the URL and installs the hook into its own environment.

Only the URL and tag placeholders are replaced. Each test builds a virtualenv and installs
kvtrace's dependencies into it: slow (minutes on a busy machine), marked `e2e` so the inner loop
can `-m "not e2e"`; CI runs them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
README = (ROOT / "README.md").read_text(encoding="utf-8")
SARIF_SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
GIT = ["git", "-c", "user.name=kvtrace tests", "-c", "user.email=tests@kvtrace.invalid",
       "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]
URL_PLACEHOLDER = "https://github.com/<owner>/kvtrace"
TAG = "v0.0.0-test"
# A concise finding line: path:line:col: CODE [severity] message
CONCISE = re.compile(r"^(?P<path>\S+\.py):(?P<line>\d+):1: (?P<code>KVT\d{3}) \[(?P<severity>error|warning|note)\] \S")

pytestmark = pytest.mark.e2e


def git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@dataclass(frozen=True)
class Published:
    """This checkout as a published repository: its URL and a release tag."""

    url: str
    tag: str
    commit: str


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Published:
    """This checkout's files as they are now (committed or not) in a new git repo, tagged."""
    dest = tmp_path_factory.mktemp("kvtrace-published")
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, listed):
        source = ROOT / rel
        if source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "snapshot")
    git(dest, "tag", TAG)
    return Published(dest.as_uri(), TAG, git(dest, "rev-parse", "HEAD").strip())


def ci_section() -> str:
    return README[README.index("### In CI"):README.index("**Baseline.**")]


def readme_yaml(containing: str) -> str:
    """The In CI section's yaml block that contains `containing`, placeholders as written."""
    blocks = re.findall(r"```yaml\n(.*?)```", ci_section(), re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, (containing, blocks)
    return found[0]


def localised(text: str, published: Published) -> str:
    assert URL_PLACEHOLDER in text or "<owner>/kvtrace@<tag>" in text, text
    return text.replace(URL_PLACEHOLDER, published.url).replace("<tag>", published.tag)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV" and not k.startswith("PYTEST")}
    return env | extra


def bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """As GitHub runs a `run:` step."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


# --- pip install from the git URL ------------------------------------------------------------------

def test_readme_pip_line_installs_from_the_git_url(tmp_path: Path, published: Published) -> None:
    steps = [line.split("run: ", 1)[1] for line in readme_yaml("pip install").splitlines()
             if line.startswith("- run: ")]
    install = steps[0]
    assert install == f'pip install "git+{URL_PLACEHOLDER}@<tag>"'
    venv = tmp_path / "job-python"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    installed = bash(localised(install, published), tmp_path, env)
    assert installed.returncode == 0, installed.stderr[-3000:]
    # A real install from the clone (not an editable link to this checkout) of the tagged commit.
    info = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "show", "-f", "kvtrace"], capture_output=True,
                          text=True, env=env).stdout
    assert "Editable project location" not in info and "kvtrace/cli.py" in info, info
    direct = next((venv / "lib").glob("python*/site-packages/kvtrace-*.dist-info/direct_url.json"))
    origin = json.loads(direct.read_text())
    assert origin["url"] == published.url and origin["vcs_info"]["commit_id"] == published.commit, origin
    assert shutil.which("kvtrace", path=env["PATH"]) == str(venv / "bin" / "kvtrace")

    shutil.copytree(EXAMPLES / "nixl-pin", tmp_path / "python" / "sglang")
    scan = bash("kvtrace scan python/sglang --format concise", tmp_path, env)
    assert scan.returncode == 1, scan.stderr
    assert scan.stdout.splitlines()[-1].endswith("failed: 2 errors (--fail-on error, the default)"), scan.stdout


# --- the Action ------------------------------------------------------------------------------------

EXPRESSION = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def test_action_from_the_readme_runs_as_the_runner_would(tmp_path: Path, published: Published) -> None:
    snippet = yaml.safe_load(localised(readme_yaml("uses: <owner>/kvtrace@<tag>"), published))
    step = next(s for s in snippet["steps"] if s.get("uses", "").endswith(f"kvtrace@{published.tag}"))
    # The runner fetches `uses: owner/kvtrace@tag` as a checkout of the repository at the tag.
    source = tmp_path / "actions" / "kvtrace"
    subprocess.run([*GIT, "clone", "-q", "--branch", published.tag, published.url, str(source)], check=True,
                   capture_output=True)
    action = yaml.safe_load((source / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    inputs = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    assert set(step["with"]) <= set(inputs), step["with"]
    inputs |= {key: str(value) for key, value in step["with"].items()}
    assert inputs["path"] == "python/sglang" and inputs["args"] == "--baseline kvtrace-baseline.json"

    workspace = tmp_path / "workspace"
    shutil.copytree(EXAMPLES / "nixl-pin", workspace / "python" / "sglang" / "srt")
    # The baseline the snippet names: written on the tree before this change (every rule accepts
    # it), so every finding of the nixl pin is new and fails the job.
    shutil.copytree(EXAMPLES / "all-clear", tmp_path / "before")
    wrote = subprocess.run([sys.executable, "-m", "kvtrace", "scan", str(tmp_path / "before"), "--write-baseline",
                            str(workspace / "kvtrace-baseline.json"), "-q", "-f", "json"], capture_output=True, text=True)
    assert wrote.returncode == 0, wrote.stderr
    venv = tmp_path / "runner-python"
    outputs: dict[str, dict[str, str]] = {}

    def evaluate(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name == "github.action_path":
                return str(source)
            if name.startswith("inputs."):
                return inputs[name[len("inputs."):]]
            step_id, _, key = name.removeprefix("steps.").partition(".outputs.")
            return outputs[step_id][key]
        return EXPRESSION.sub(one, text)

    ran: list[str] = []
    logs: dict[str, subprocess.CompletedProcess[str]] = {}
    for action_step in action["runs"]["steps"]:
        uses = action_step.get("uses", "")
        if uses.startswith("actions/setup-python@"):
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            ran.append("setup-python")
            continue
        if uses.startswith("github/codeql-action/upload-sarif@"):
            sarif = workspace / evaluate(action_step["with"]["sarif_file"])
            log = json.loads(sarif.read_text())
            jsonschema.validate(log, SARIF_SCHEMA)
            results = log["runs"][0]["results"]
            uris = [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results]
            assert uris and all((workspace / u).is_file() for u in uris)
            assert any(r["ruleId"] == "KVT001" and u.endswith("nixl/conn.py") for r, u in zip(results, uris))
            assert {r.get("baselineState") for r in results} == {"new"}
            errors_in_sarif = sum(r["level"] == "error" for r in results)
            ran.append("upload-sarif")
            continue
        assert action_step.get("shell") == "bash" and "run" in action_step, action_step
        github_output = tmp_path / f"output-{len(ran)}"
        github_output.touch()
        env = clean_env(**{key: evaluate(str(value)) for key, value in action_step.get("env", {}).items()})
        env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}", "GITHUB_OUTPUT": str(github_output)}
        result = bash(action_step["run"], workspace, env)
        name = action_step.get("id") or action_step["name"]
        logs[name] = result
        outputs[name] = dict(line.split("=", 1) for line in github_output.read_text().splitlines() if "=" in line)
        ran.append(name)
        if result.returncode != 0:
            break
    assert ran == ["setup-python", "Install kvtrace", "scan", "upload-sarif", "Fail on findings"], logs
    assert logs["Install kvtrace"].returncode == 0, logs["Install kvtrace"].stderr
    scan = logs["scan"]
    assert scan.returncode == 0, scan.stderr
    annotations = [line for line in scan.stdout.splitlines() if line.startswith("::error file=")]
    assert len(annotations) == errors_in_sarif == 2
    assert all("file=python/sglang/srt/disaggregation/nixl/conn.py," in a and "pinned-state" in a for a in annotations)
    assert "failed: 2 errors (--fail-on error, the default)" in scan.stdout
    assert outputs["scan"]["exit-code"] == "1"
    assert logs["Fail on findings"].returncode == 1
    assert evaluate(action["outputs"]["exit-code"]["value"]) == "1"


# --- pre-commit --------------------------------------------------------------------------------------

def test_pre_commit_from_the_readme(tmp_path: Path, published: Published) -> None:
    config = localised(readme_yaml("rev: <tag>"), published)
    assert yaml.safe_load(config)["repos"][0]["rev"] == published.tag
    project = tmp_path / "fork"
    shutil.copytree(EXAMPLES / "nixl-pin", project / "python" / "sglang" / "srt")
    (project / "README.md").write_text("a fork\n")
    (project / ".pre-commit-config.yaml").write_text(config)
    git(project, "init", "-q")
    git(project, "add", "-A")
    env = clean_env(PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pre_commit", "run", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=900)

    pinned = run("--all-files")
    assert pinned.returncode == 1, pinned.stdout + pinned.stderr
    # pre-commit's own [INFO] lines (installing the hook's environment, first run only) come
    # first; the hook's output is its status line and what follows.
    every = pinned.stdout.rstrip("\n").splitlines()
    start = next(i for i, line in enumerate(every) if line.startswith("kvtrace (pinned KV-transfer poll states)"))
    assert all(line.startswith("[INFO] ") for line in every[:start]), pinned.stdout
    lines = every[start:]
    assert lines[0].endswith("Failed"), pinned.stdout
    # The hook's whole output on the NIXL example: one line per finding and the summary.
    assert len(lines) <= 30, pinned.stdout
    found = [m for m in map(CONCISE.match, lines) if m]
    reported = json.loads(subprocess.run([sys.executable, "-m", "kvtrace", "scan", "python/sglang", "-f", "json"],
                                         cwd=project, capture_output=True, text=True).stdout)["reports"][0]["findings"]
    assert sorted((m["code"], m["path"], int(m["line"])) for m in found) == sorted(
        (f["id"], f"python/sglang/{f['path']}", f["line"]) for f in reported)
    assert all((project / m["path"]).is_file() for m in found)  # openable from the repository root
    assert sum(m["code"] == "KVT001" and m["path"].endswith("nixl/conn.py") for m in found) == 2
    errors = sum(f["severity"] == "error" for f in reported)
    assert lines[-1].startswith(f"kvtrace python/sglang: {len(reported)} findings ({errors} errors, ")
    assert lines[-1].endswith(f"failed: {errors} errors (--fail-on error, the default)"), lines[-1]

    # Only a file outside disaggregation/ changed: the hook does not run.
    git(project, "commit", "-qm", "the fork")
    (project / "README.md").write_text("a fork, edited\n")
    git(project, "add", "README.md")
    skipped = run()
    assert skipped.returncode == 0 and "(no files to check)Skipped" in skipped.stdout, skipped.stdout

    # A tree every rule accepts (the all-clear example): the hook passes.
    shutil.rmtree(project / "python" / "sglang" / "srt")
    shutil.copytree(EXAMPLES / "all-clear", project / "python" / "sglang" / "srt")
    git(project, "add", "-A")
    passed = run("--all-files")
    assert passed.returncode == 0 and "Passed" in passed.stdout, passed.stdout + passed.stderr
