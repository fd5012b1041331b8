"""`[tool.kvtrace]` in pyproject.toml, the way Python projects configure their linters.

Looked up in the scanned tree (the target folder and its parents, as ruff does for a file) and
then in the working directory; the first `pyproject.toml` with a `[tool.kvtrace]` table wins.
Command-line options win over the file. Unknown keys and wrong types are errors naming the file
and the key: a misspelt `ignore-backend` silently doing nothing is how CI gates rot.

A config found this way usually belongs to the tree being scanned, which is untrusted input: the
files it names (`baseline`, a `pack` that is not a bundled name) must lie in the config file's own
folder or below it, after symbolic links are resolved, so a scanned tree cannot make kvtrace read
/dev/zero, a FIFO or a file of the user's elsewhere. Files named on the command line are the
user's own choice and are not confined. Every file is read bounded (kvtrace.userfiles).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from kvtrace.errors import InputError
from kvtrace.userfiles import TOML_CAP, SchemaError, load_toml, validate


class RuleNames(Protocol):
    """The rule names and codes a setting may name: a set, or the CLI's lazy lookup."""

    def __contains__(self, name: object) -> bool: ...

    def __iter__(self) -> Iterator[str]: ...


FAIL_ON_LEVELS = ("error", "warning", "note", "never")


class Settings(NamedTuple):
    """What a scan is asked to report. Empty `select` means every rule. Immutable: a NamedTuple
    rather than a frozen dataclass, whose generated methods every run (a cached rescan's too)
    would pay to build."""

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
        try:
            folder = start if start.is_dir() else start.parent
        except OSError:  # a name the system refuses (too long): its parents may still hold the config
            folder = start.parent
        candidates += [folder, *folder.parents]
    candidates.append(cwd.resolve())
    for folder in candidates:
        path = folder / "pyproject.toml"
        if path.is_file() and "kvtrace" in _tool_table(_read(path), path):
            return path
    return None


def _read(path: Path) -> dict[str, Any]:
    return load_toml(path, "", TOML_CAP)


def _tool_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise InputError(f"{path}: tool must be a table ([tool]), not {type(tool).__name__}")
    return tool


# The [tool.kvtrace] table, as a JSON Schema: what load_settings checks each key against (tests
# check it with the jsonschema package too).
CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "select": {"type": "array", "items": {"type": "string"}},
        "ignore": {"type": "array", "items": {"type": "string"}},
        "ignore-backends": {"type": "array", "items": {"type": "string"}},
        "pack": {"type": "string"},
        "fail-on": {"enum": list(FAIL_ON_LEVELS)},
        "baseline": {"type": "string"},
    },
    "additionalProperties": False,
}


def confined(base: Path, value: str, where: str, key: str) -> str:
    """`value` (a path in a config file) resolved under the config's folder `base`, or an error:
    a config must not name a file elsewhere (see the module's docstring)."""
    if "\0" in value or not value:
        raise InputError(f"{where}: {key} {value!r}: not a file name")
    try:
        folder = base.resolve()
        resolved = (folder / value).resolve()
    except (OSError, RuntimeError) as exc:
        raise InputError(f"{where}: {key} {value!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if not resolved.is_relative_to(folder):
        raise InputError(f"{where}: {key} {value!r} leads outside {folder} (a config may name only files in its "
                         f"own folder or below; give --{'rules' if key == 'pack' else key} for another file)")
    return str(resolved)


def load_settings(path: Path, known_rules: RuleNames) -> Settings:
    """Read and validate `[tool.kvtrace]`; paths in it are relative to the file's folder."""
    table = _tool_table(_read(path), path).get("kvtrace", {})
    where = f"{path}: [tool.kvtrace]"
    if not isinstance(table, dict):
        raise InputError(f"{where} must be a table")
    for key, value in table.items():
        if key not in _KEYS:
            raise InputError(f"{where}: unknown key {key!r} (known: {', '.join(_KEYS)})")
        try:
            validate(value, CONFIG_SCHEMA["properties"][key])
        except SchemaError:
            wanted = "a list of strings" if _KEYS[key][1] is list else "a string" if key != "fail-on" else \
                f"one of {', '.join(FAIL_ON_LEVELS)}, not {value!r}"
            raise InputError(f"{where}: {key} must be {wanted}") from None
    values: dict[str, Any] = {"source": str(path)}
    for key, value in table.items():
        values[_KEYS[key][0]] = tuple(value) if isinstance(value, list) else value
    settings = Settings(**values)
    check_rules(settings, known_rules, where)
    base = path.parent
    if settings.baseline is not None:
        settings = settings._replace(baseline=confined(base, settings.baseline, where, "baseline"))
    if settings.pack is not None and not _bundled_pack(settings.pack):
        settings = settings._replace(pack=confined(base, settings.pack, where, "pack"))
    return settings


def _bundled_pack(name: str) -> bool:
    from kvtrace.packs import available_packs

    return name in available_packs()


def unknown_rule(name: str, known_rules: Iterable[str]) -> str:
    """`unknown rule 'pined-state'; did you mean pinned-state? (`kvtrace rules` lists them)`."""
    known = sorted(known_rules)
    by_fold = {k.lower(): k for k in known}
    close = [by_fold[name.lower()]] if name.lower() in by_fold else \
        [by_fold[m] for m in difflib.get_close_matches(name.lower(), list(by_fold), n=2, cutoff=0.6)]
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown rule {name!r}{hint} (`kvtrace rules` lists them)"


def check_rules(settings: Settings, known_rules: RuleNames, where: str | None) -> None:
    """Every rule named exists; `where` is the file's table, or None for the command line."""
    for key, names in (("select", settings.select), ("ignore", settings.ignore)):
        unknown = [n for n in names if n not in known_rules]
        if unknown:
            said = f"--{key} {unknown[0]}: " if where is None else f"{where}: {key}: "
            raise InputError(said + unknown_rule(unknown[0], known_rules))


class Overrides(NamedTuple):
    """Command-line options; None (or empty) means "not given", so the file's value stands. A
    NamedTuple, as Settings."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    ignore_backends: tuple[str, ...] = ()
    pack: str | None = None
    fail_on: str | None = None
    baseline: str | None = None


def resolve(target: Path | None, cwd: Path, overrides: Overrides, known_rules: RuleNames) -> Settings:
    """The file's settings with the command line's on top (each option given replaces the key)."""
    found = find_pyproject(target, cwd)
    settings = load_settings(found, known_rules) if found else Settings()
    check_rules(Settings(select=overrides.select, ignore=overrides.ignore), known_rules, None)
    changes = {name: getattr(overrides, name) for name in ("select", "ignore", "ignore_backends")
               if getattr(overrides, name)}
    changes |= {name: getattr(overrides, name) for name in ("pack", "fail_on", "baseline")
                if getattr(overrides, name) is not None}
    return settings._replace(**changes)
