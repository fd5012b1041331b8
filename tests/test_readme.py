"""The README as a user runs it: its sample output is what kvtrace prints, and its CI snippet's
commands work in the order a workflow runs them (the upload step is reached, the job then fails)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
SARIF_SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())


def test_sample_output_is_what_kvtrace_prints() -> None:
    marker = re.search(r"<!-- sample: COLUMNS=(\d+) kvtrace (.*?) \(first (\d+) lines.*?-->\n```text\n(.*?)```",
                       README, re.S)
    assert marker, "the README's sample block and its marker"
    columns, args, count, block = marker.group(1), marker.group(2).split(), int(marker.group(3)), marker.group(4)
    result = subprocess.run([sys.executable, "-m", "kvtrace", *args, "--no-cache"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "COLUMNS": columns})
    assert result.returncode == 1, result.stderr
    assert block.splitlines() == result.stdout.splitlines()[:count]


def _ci_steps() -> list[str]:
    section = README[README.index("### In CI"):README.index("## Rules")]
    yaml = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return [line.split("run: ", 1)[1] for line in yaml.splitlines() if line.startswith("- run: ")]


def test_ci_snippet_runs_as_written(tmp_path: Path) -> None:
    steps = _ci_steps()
    assert steps[0] == "pip install kvtrace"  # the test runs the kvtrace installed for the suite instead
    shutil.copytree(ROOT / "examples" / "nixl-pin", tmp_path / "python" / "sglang")
    github_env = tmp_path / "github_env"
    github_env.write_text("")
    env = {**os.environ, "GITHUB_ENV": str(github_env),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    codes = []
    for step in steps[1:]:
        # As GitHub runs `run:` steps: bash -eo pipefail, with what earlier steps put in GITHUB_ENV.
        for line in github_env.read_text().splitlines():
            key, _, value = line.partition("=")
            env[key] = value
        codes.append(subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step],
                                    cwd=tmp_path, env=env, timeout=300, capture_output=True, text=True).returncode)
    assert codes[0] == 0  # the scan step never stops the job before the upload
    sarif = json.loads((tmp_path / "kvtrace.sarif").read_text())
    jsonschema.validate(sarif, SARIF_SCHEMA)
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in sarif["runs"][0]["results"]}
    assert uris and all((tmp_path / uri).is_file() and uri.startswith("python/sglang/") for uri in uris)
    assert codes[-1] == 1  # ...and the last step fails the job on the findings
