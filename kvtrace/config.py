"""`[tool.kvtrace]` in pyproject.toml, the way Python projects configure their linters.

Looked up in the scanned tree (the target folder and its parents, as ruff does for a file) and
then in the working directory; the first `pyproject.toml` with a `[tool.kvtrace]` table wins.
Command-line options win over the file. Unknown keys and wrong types are errors naming the file
and the key: a misspelt `ignore-backend` silently doing nothing is how CI gates rot.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvtrace.errors import InputError

FAIL_ON_LEVELS = ("error", "warning", "note", "never")


@dataclass(frozen=True)
class Settings:
    """What a scan is asked to report. Empty `select` means every rule."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    ignore_backends: tuple[str, ...] = ()
    pack: str | None = None
    fail_on: str | None = None
    baseline: str | None = None
    source: str | None = None  # the pyproject.toml these came from, for messages

    def wants_rule(self, rule_id: str, code: str | None = None) -> bool:
        names = {rule_id} | ({code} if code else set())
        if self.select and not names & set(self.select):
            return False
        return not names & set(self.ignore)

    def wants_backend(self, backend: str | None) -> bool:
        return backend is None or backend not in self.ignore_backends


# key in the file -> (Settings field, expected type)
_KEYS: dict[str, tuple[str, type]] = {
    "select": ("select", list),
    "ignore": ("ignore", list),
    "ignore-backends": ("ignore_backends", list),
    "pack": ("pack", str),
    "fail-on": ("fail_on", str),
    "baseline": ("baseline", str),
}


def find_pyproject(start: Path | None, cwd: Path) -> Path | None:
    """The first pyproject.toml with a [tool.kvtrace] table: the target and its parents, then cwd."""
    candidates: list[Path] = []
    if start is not None:
        try:
            start = start.resolve()
        except (OSError, RuntimeError):  # a symlink loop: refused with its own message elsewhere
            start = start.absolute()
        folder = start if start.is_dir() else start.parent
        candidates += [folder, *folder.parents]
    candidates.append(cwd.resolve())
    for folder in candidates:
        path = folder / "pyproject.toml"
        if path.is_file() and "kvtrace" in _read(path).get("tool", {}):
            return path
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None


def load_settings(path: Path, known_rules: set[str]) -> Settings:
    """Read and validate `[tool.kvtrace]`; paths in it are relative to the file's folder."""
    table = _read(path).get("tool", {}).get("kvtrace", {})
    where = f"{path}: [tool.kvtrace]"
    if not isinstance(table, dict):
        raise InputError(f"{where} must be a table")
    values: dict[str, Any] = {"source": str(path)}
    for key, value in table.items():
        if key not in _KEYS:
            raise InputError(f"{where}: unknown key {key!r} (known: {', '.join(_KEYS)})")
        name, kind = _KEYS[key]
        if kind is list:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise InputError(f"{where}: {key} must be a list of strings")
            value = tuple(value)
        elif not isinstance(value, str):
            raise InputError(f"{where}: {key} must be a string")
        values[name] = value
    settings = Settings(**values)
    check_rules(settings, known_rules, where)
    if settings.fail_on is not None and settings.fail_on not in FAIL_ON_LEVELS:
        raise InputError(f"{where}: fail-on must be one of {', '.join(FAIL_ON_LEVELS)}, not {settings.fail_on!r}")
    base = path.parent
    if settings.baseline is not None:
        settings = replace(settings, baseline=str(base / settings.baseline))
    if settings.pack is not None and (settings.pack.endswith(".toml") or "/" in settings.pack):
        settings = replace(settings, pack=str(base / settings.pack))
    return settings


def unknown_rule(name: str, known_rules: Iterable[str]) -> str:
    """`unknown rule 'pined-state'; did you mean pinned-state? (`kvtrace rules` lists them)`."""
    known = sorted(known_rules)
    by_fold = {k.lower(): k for k in known}
    close = [by_fold[name.lower()]] if name.lower() in by_fold else \
        [by_fold[m] for m in difflib.get_close_matches(name.lower(), list(by_fold), n=2, cutoff=0.6)]
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown rule {name!r}{hint} (`kvtrace rules` lists them)"


def check_rules(settings: Settings, known_rules: set[str], where: str | None) -> None:
    """Every rule named exists; `where` is the file's table, or None for the command line."""
    for key, names in (("select", settings.select), ("ignore", settings.ignore)):
        unknown = [n for n in names if n not in known_rules]
        if unknown:
            said = f"--{key} {unknown[0]}: " if where is None else f"{where}: {key}: "
            raise InputError(said + unknown_rule(unknown[0], known_rules))


@dataclass(frozen=True)
class Overrides:
    """Command-line options; None (or empty) means "not given", so the file's value stands."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    ignore_backends: tuple[str, ...] = ()
    pack: str | None = None
    fail_on: str | None = None
    baseline: str | None = None


def resolve(target: Path | None, cwd: Path, overrides: Overrides, known_rules: set[str]) -> Settings:
    """The file's settings with the command line's on top (each option given replaces the key)."""
    found = find_pyproject(target, cwd)
    settings = load_settings(found, known_rules) if found else Settings()
    check_rules(Settings(select=overrides.select, ignore=overrides.ignore), known_rules, None)
    changes = {name: getattr(overrides, name) for name in ("select", "ignore", "ignore_backends")
               if getattr(overrides, name)}
    changes |= {name: getattr(overrides, name) for name in ("pack", "fail_on", "baseline")
                if getattr(overrides, name) is not None}
    return replace(settings, **changes)
