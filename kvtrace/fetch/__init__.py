"""Fetch stage: turn a target string into the files to analyse, locally or over SSH."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from kvtrace.model import FetchLimits, FetchResult


def fetch_target(text: str, limits: FetchLimits, ssh: dict[str, Any] | None = None,
                 log: Callable[[str], None] | None = None,
                 after_fetch: Callable[[Any, FetchResult], None] | None = None,
                 pack: Any = None) -> FetchResult:
    """`after_fetch(client, result)` runs on the open SSH connection of a remote target. With
    the rules `pack`, only the files its scan reads are kept (fetch/select.py), whatever the
    route, and a remote one moves only those."""
    from kvtrace.fetch.select import Wanted, named_folders, narrow, package_roots

    wanted = Wanted.from_pack(pack) if pack is not None else None
    from kvtrace.target import SshTarget, parse_target

    target = parse_target(text)
    if isinstance(target, SshTarget):
        from kvtrace.fetch.ssh import SshOptions, check_remote_path, fetch_ssh, fetch_tree, open_connection

        options = SshOptions(**(ssh or {}))
        if after_fetch is None:
            return fetch_ssh(target, options, limits, log, wanted)
        check_remote_path(target.path)
        with open_connection(target, options, log) as conn:
            result = fetch_tree(conn, target.path, target.label, limits, wanted)
            after_fetch(conn.client, result)
            return result
    from kvtrace.fetch.local import fetch_local

    if wanted is None or "" in named_folders([], wanted.package_dir, text):
        # A target named like the package folder is the package (or, with no enum in it, read whole
        # for the error): `narrow` would keep every file, so the tree is read once, whole.
        return fetch_local(Path(text), limits)
    if not wanted.searchable:
        return narrow(fetch_local(Path(text), limits), wanted)
    # Files the scan cannot read are dropped as they are read (memory: a whole installed package
    # is 67 MB of .py); when no named package folder turns up, the scan reads the whole target.
    fetched = fetch_local(Path(text), limits, keep=wanted.may_read)
    roots = package_roots(fetched.files, wanted, fetched.target)
    if not roots or "" in roots:
        fetched = fetch_local(Path(text), limits)
    return narrow(fetched, wanted)
