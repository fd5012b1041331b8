"""TARGET parsing: which strings are SSH locations and which stay local paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace.errors import InputError
from kvtrace.target import LocalTarget, SshTarget, parse_authority, parse_target

SSH_CASES: list[tuple[str, tuple[str | None, str, int | None, str]]] = [
    ("host:/p", (None, "host", None, "/p")),
    ("user@host:/p", ("user", "host", None, "/p")),
    ("user@host:2222:/p", ("user", "host", 2222, "/p")),
    ("host:2222:rel/dir", (None, "host", 2222, "rel/dir")),
    ("host:./2222", (None, "host", None, "./2222")),  # a folder named 2222 in the login directory
    ("host:", (None, "host", None, ".")),
    ("host:rel/dir", (None, "host", None, "rel/dir")),
    ("host:~/sglang/python", (None, "host", None, "~/sglang/python")),
    ("gpu-01.example.com:/opt/sglang", (None, "gpu-01.example.com", None, "/opt/sglang")),
    ("10.0.0.5:/x", (None, "10.0.0.5", None, "/x")),
    ("my_alias:/x:y", (None, "my_alias", None, "/x:y")),
    ("host:/a b/c d", (None, "host", None, "/a b/c d")),
    ("first.last@host:/p", ("first.last", "host", None, "/p")),
    ("u@corp@host:/p", ("u@corp", "host", None, "/p")),
    ("[::1]:/p", (None, "::1", None, "/p")),
    ("[::1]:2222:/p", (None, "::1", 2222, "/p")),
    ("root@[fe80::1%eth0]:22:/p", ("root", "fe80::1%eth0", 22, "/p")),
    ("ssh://host/p", (None, "host", None, "/p")),
    ("SSH://host/p", (None, "host", None, "/p")),
    ("ssh://u@host:2200/opt/x", ("u", "host", 2200, "/opt/x")),
    ("ssh://[::1]:2222/opt/x", (None, "::1", 2222, "/opt/x")),
    ("ssh://host", (None, "host", None, ".")),
    ("ssh://host/~/sglang", (None, "host", None, "~/sglang")),
    ("ssh://host/a%20b", (None, "host", None, "/a b")),
]

LOCAL_CASES = [
    "C:\\sglang\\python",
    "C:/sglang/python",
    "c:sglang",
    "./a:b",
    "../a:b",
    "/abs/a:b",
    "~/a:b",
    "plain/dir",
    "file.py",
    "user@host",  # no ':' at all
    "-oProxyCommand=x:/p",  # never a host (and never an ssh option)
    ".host:/p",
    "a b:/p",
    "dir\\x:y",
]


@pytest.mark.parametrize(("text", "expected"), SSH_CASES)
def test_ssh_targets(text: str, expected: tuple[str | None, str, int | None, str]) -> None:
    target = parse_target(text)
    assert isinstance(target, SshTarget)
    assert (target.user, target.host, target.port, target.path) == expected
    assert target.label == text


@pytest.mark.parametrize("text", LOCAL_CASES)
def test_local_targets(text: str) -> None:
    target = parse_target(text)
    assert isinstance(target, LocalTarget)
    assert target.path == Path(text)
    assert target.label == text


def test_existing_local_path_with_colon_stays_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "host:dir").mkdir()
    monkeypatch.chdir(tmp_path)
    assert parse_target("host:dir") == LocalTarget(Path("host:dir"), "host:dir")


@pytest.mark.parametrize(
    "text",
    ["", "-", "user@:path", "@host:/p", "[not-v6]:/p", "[]:/p", "u s@host:/p", "u@bad_host!:/p",
     "ssh://", "ssh://:22/p", "ssh://host:99999/p", "ssh://host:0/p", "host:0:/p",
     "host:70000:/p", "ssh://ho st/p", "ssh://host:x/p", "ssh://[::1/p"],
)
def test_bad_targets_are_input_errors(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_target(text)
    assert "\n" not in str(info.value)


def test_stdin_is_refused_with_the_reason() -> None:
    with pytest.raises(InputError, match="reading from stdin is not supported"):
        parse_target("-")


def test_display() -> None:
    assert parse_target("u@[::1]:2222:/p").display == "u@[::1]:2222"  # type: ignore[union-attr]
    assert parse_target("host:/p").display == "host"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("jump", (None, "jump", None)),
        ("me@jump:2200", ("me", "jump", 2200)),
        ("[::1]:22", (None, "::1", 22)),
    ],
)
def test_parse_authority(text: str, expected: tuple[str | None, str, int | None]) -> None:
    assert parse_authority(text) == expected


@pytest.mark.parametrize("text", ["", "me@", "jump:", "jump:x", "[::1", "-jump"])
def test_parse_authority_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_authority(text)


_hosts = st.from_regex(r"[a-z][a-z0-9-]{1,10}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True)
_users = st.none() | st.from_regex(r"[a-z_][a-z0-9_.-]{0,8}", fullmatch=True)
_ports = st.none() | st.integers(1, 65535)
_paths = st.from_regex(r"/[A-Za-z0-9_./: -]{0,30}", fullmatch=True)


@given(user=_users, host=_hosts, port=_ports, path=_paths)
def test_scp_form_round_trips(user: str | None, host: str, port: int | None, path: str) -> None:
    text = (f"{user}@" if user else "") + host + (f":{port}" if port else "") + ":" + path
    target = parse_target(text)
    assert target == SshTarget(user, host, port, path, text)


@given(st.text(min_size=1).map(lambda s: "/" + s) | st.text(min_size=1).map(lambda s: "./" + s))
def test_absolute_and_dot_paths_are_always_local(text: str) -> None:
    assert isinstance(parse_target(text), LocalTarget)


def test_host_and_port_without_a_path_is_refused_with_the_form_to_use() -> None:
    """Before: `root@127.0.0.1:2299` took 2299 as the path and failed with "port 22: connection
    refused" after trying to connect."""
    with pytest.raises(InputError) as caught:
        parse_target("root@127.0.0.1:2299")
    message = str(caught.value)
    assert "no path given" in message and "root@127.0.0.1:2299:PATH" in message and "\n" not in message


def test_cli_refuses_host_port_without_path_before_connecting() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "kvtrace", "scan", "root@127.0.0.1:2299", "--connect-timeout", "1"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "no path given" in result.stderr and "connection refused" not in result.stderr
