"""The files a project adopts kvtrace with, run as what they say: `.pre-commit-hooks.yaml`
through pre-commit (from PyPI, in the test environment) and `action.yml`'s steps as the runner
would run them (bash -eo pipefail, env from the step, GITHUB_OUTPUT). Both install kvtrace into a
fresh virtualenv from a snapshot of this checkout, as a user's machine or runner would."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SARIF_SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
GIT = ["git", "-c", "user.name=kvtrace tests", "-c", "user.email=tests@kvtrace.invalid",
       "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def snapshot(dest: Path) -> str:
    """This checkout's files as they are now (committed or not) in a new git repo; its commit."""
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
    return git(dest, "rev-parse", "HEAD").strip()


def test_pre_commit_hook(tmp_path: Path) -> None:
    hooks = tmp_path / "kvtrace-hooks"
    rev = snapshot(hooks)
    project = tmp_path / "fork"
    shutil.copytree(EXAMPLES / "nixl-pin", project / "python" / "sglang" / "srt")
    (project / "README.md").write_text("a fork\n")
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {hooks.as_uri()}\n  rev: {rev}\n  hooks:\n  - id: kvtrace\n    args: [python/sglang]\n")
    git(project, "init", "-q")
    git(project, "add", "-A")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    env.pop("VIRTUAL_ENV", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pre_commit", "run", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=900)

    pinned = run("--all-files")
    assert pinned.returncode == 1, pinned.stdout + pinned.stderr
    assert "kvtrace (pinned KV-transfer poll states)" in pinned.stdout and "Failed" in pinned.stdout
    assert re.search(r"error\[pinned-state\] at \S*nixl/conn\.py:\d+", pinned.stdout), pinned.stdout

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


# --- action.yml ----------------------------------------------------------------------------------

EXPRESSION = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def test_action_steps_run_as_a_script(tmp_path: Path) -> None:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    workspace = tmp_path / "workspace"
    shutil.copytree(EXAMPLES / "nixl-pin", workspace / "python" / "sglang" / "srt")
    source = tmp_path / "action"
    snapshot(source)
    venv = tmp_path / "runner-python"
    inputs = {name: spec.get("default", "") for name, spec in action["inputs"].items()}
    inputs |= {"path": "python/sglang", "sarif-file": "out/kvtrace.sarif"}
    (workspace / "out").mkdir()
    outputs: dict[str, dict[str, str]] = {}

    def evaluate(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name == "github.action_path":
                return str(source)
            if name.startswith("inputs."):
                return inputs[name[len("inputs."):]]
            step, _, key = name.removeprefix("steps.").partition(".outputs.")
            return outputs[step][key]
        return EXPRESSION.sub(one, text)

    ran: list[str] = []
    logs: dict[str, subprocess.CompletedProcess[str]] = {}
    for step in steps:
        uses = step.get("uses", "")
        if uses.startswith("actions/setup-python@"):
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            ran.append("setup-python")
            continue
        if uses.startswith("github/codeql-action/upload-sarif@"):
            sarif = workspace / evaluate(step["with"]["sarif_file"])
            log = json.loads(sarif.read_text())
            jsonschema.validate(log, SARIF_SCHEMA)
            results = log["runs"][0]["results"]
            uris = [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results]
            # Relative to the scanned folder or to the workspace, depending on --sarif-root.
            assert uris and all((workspace / u).is_file() or (workspace / "python/sglang" / u).is_file() for u in uris)
            assert any(r["ruleId"] in ("pinned-state", "KVT001") and u.endswith("nixl/conn.py")
                       for r, u in zip(results, uris))
            errors_in_sarif = sum(r["level"] == "error" for r in results)
            ran.append("upload-sarif")
            continue
        assert step.get("shell") == "bash" and "run" in step, step
        github_output = tmp_path / f"output-{len(ran)}"
        github_output.touch()
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        env |= {key: evaluate(str(value)) for key, value in step.get("env", {}).items()}
        env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}", "GITHUB_OUTPUT": str(github_output)}
        result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                                cwd=workspace, env=env, capture_output=True, text=True, timeout=900)
        name = step.get("id") or step["name"]
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
    assert len(annotations) == errors_in_sarif
    pinned = [a for a in annotations if "pinned-state" in a]
    assert len(pinned) == 2 and all("file=python/sglang/srt/disaggregation/nixl/conn.py," in a for a in pinned)
    for line in annotations:
        assert (workspace / re.search(r"file=([^,]+),", line).group(1)).is_file()
    assert outputs["scan"]["exit-code"] == "1"
    assert logs["Fail on findings"].returncode == 1
    assert evaluate(action["outputs"]["exit-code"]["value"]) == "1"
