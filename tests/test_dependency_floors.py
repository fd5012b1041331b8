"""The lowest versions pyproject.toml allows really work: a fresh venv gets exactly each
dependency's floor (`name>=X` installed as `name==X`) and runs a subset of the suite that
touches every dependency (typer and click: the CLI and Ctrl-C; rich: output; libcst: analysis;
paramiko: real sshd, hostile server, known_hosts, ssh_config)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBSET = [
    "tests/test_ssh.py", "tests/test_hostile_ssh.py", "tests/test_hostile.py", "tests/test_cli.py",
    "-k", "exec_fetch_matches_local or sftp_fallback_matches or cli_unknown_host or odd_known_hosts "
          "or include_and_match or ctrl_c or markup or drip or pax or 10000 or login_shell "
          "or exit_code or json",
]


def floors() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = []
    for requirement in data["project"]["dependencies"]:
        # A ceiling (`,<Y`) is allowed beside the floor: the suite's own venv gets the newest below it.
        # An environment marker (`; python_version < '3.11'`) stays with the pin.
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)(?:\s*,\s*<\s*[0-9][0-9A-Za-z.]*)?"
                         r"(\s*;.*)?", requirement.strip())
        assert m, f"every dependency needs a tested floor `name>=X`: {requirement!r}"
        pins.append(f"{m.group(1)}=={m.group(2)}{m.group(3) or ''}")
    return pins


def test_lowest_allowed_versions_work(tmp_path: Path) -> None:
    venv = tmp_path / "floors"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pins = floors()
    install = subprocess.run([python, "-m", "pip", "install", "-q", *pins, "pytest", "hypothesis", "jsonschema"],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    local = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)],
                           capture_output=True, text=True, timeout=900)
    assert local.returncode == 0, local.stderr[-3000:]
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "freeze"], capture_output=True, text=True).stdout
    from packaging.requirements import Requirement
    from packaging.version import Version

    def key(name: str) -> str:
        return name.lower().replace("_", "-")

    installed = {key(line.split("==")[0]): line.split("==")[1] for line in listed.splitlines() if "==" in line}
    for pin in pins:
        requirement = Requirement(pin)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue  # not for this Python (tomli below 3.11): pip left it out, as it should
        (version,) = [spec.version for spec in requirement.specifier]
        assert Version(installed.get(key(requirement.name), "0")) == Version(version), (pin, listed)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    run = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUBSET], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
