"""The inner loop (`pytest -m "not e2e"`): tests/conftest.py marks a test end-to-end by what it
reaches in the source, and fails an unmarked test that starts a process. These check the rule on
small modules written here and on the suite's own end-to-end tests."""

from __future__ import annotations

import pytest

from tests.conftest import e2e_by_rule


@pytest.mark.parametrize("source", [
    # directly in the test
    "import subprocess\ndef test_x():\n    subprocess.run(['true'])\n",
    # through a fixture the test asks for
    "import pytest\nfrom tests.sshd_server import SshdServer\n@pytest.fixture\ndef server():\n    return SshdServer()\n"
    "def test_x(server):\n    assert server\n",
    # through a module-level helper, two calls deep
    "import sys, subprocess\ndef run(*a):\n    return subprocess.run([sys.executable, *a])\ndef kv(*a):\n    return run('-m', 'kvtrace', *a)\n"
    "def test_x():\n    assert kv('scan').returncode == 0\n",
    # an import inside the test
    "def test_x():\n    from tests.sglang_wheels import sglang_tree\n    assert sglang_tree('0.5.9')\n",
    # a module-level value made from a real release, used in a parametrize
    "import pytest\nfrom tests.sglang_wheels import sglang_tree\nTREES = [sglang_tree(v) for v in ('0.4.8',)]\n"
    "@pytest.mark.parametrize('tree', TREES)\ndef test_x(tree):\n    assert tree\n",
    # a helper imported from another test module that starts a process
    "from tests.test_cli import kvtrace as run\ndef test_x():\n    assert run('rules')\n",
    # the property oracle's budget, by attribute
    "from tests.property import gen\n@gen.budget(ci=300, slow=3000)\ndef test_x():\n    pass\n",
    # the browser
    "def test_x():\n    from selenium import webdriver\n    webdriver.Chrome()\n",
    # a method of a test class
    "import subprocess\nclass TestX:\n    def test_x(self):\n        subprocess.run(['true'])\n",
])
def test_the_rule_marks_what_reaches_a_process_a_server_a_browser_or_a_release(source: str) -> None:
    cls = "TestX" if "class TestX" in source else None
    assert e2e_by_rule("tests._written_here", "test_x", cls, source)


@pytest.mark.parametrize("source", [
    "import json\ndef test_x():\n    assert json.loads('1') == 1\n",
    # a helper in the same module that does no such thing; a local name like a helper elsewhere
    "from kvtrace.scan import scan_path\ndef tree(tmp):\n    return tmp\ndef test_x(tmp_path):\n    subprocess = 1\n"
    "    assert scan_path(tree(tmp_path)) is not None\n",
    # a pure helper imported from another test module
    "from tests.test_rules import write_tree\ndef test_x(tmp_path):\n    write_tree(tmp_path, {})\n",
])
def test_the_rule_leaves_in_process_tests_in_the_inner_loop(source: str) -> None:
    assert not e2e_by_rule("tests._written_here", "test_x", None, source)


@pytest.mark.parametrize("module, test", [
    ("tests.test_html", "test_state_diagrams_read_and_fit"),  # Chromium
    ("tests.test_ssh", "test_remote_scan_matches_local"),  # sshd
    ("tests.test_ssh", "test_refused_port"),  # kvtrace's SSH client (it runs `ssh -G`)
    ("tests.test_dependency_floors", "test_lowest_allowed_versions_work"),  # pip
    ("tests.test_cli", "test_fail_on_threshold"),  # python -m kvtrace
    ("tests.test_real_sglang", "test_backends_resolve_inherited_poll"),  # real releases
    ("tests.property.test_senders_property", "test_senders_match_oracle"),  # the oracle's budget
])
def test_the_suites_end_to_end_tests_are_marked(module: str, test: str) -> None:
    assert e2e_by_rule(module, test), f"{module}::{test} would run in the inner loop"
