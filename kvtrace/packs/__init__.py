"""Rules packs: the TOML files beside this module that name what the engine looks for.

The engine knows no SGLang names; a pack says which queue, which poll calls, which enum and
which calls release or abort a request. A new engine or queue is a new pack.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kvtrace.errors import InputError

DEFAULT_PACK = "sglang-prefill"


@dataclass(frozen=True)
class Pack:
    name: str
    description: str
    package_dir: str
    queue: str
    poll_calls: tuple[str, ...]
    gauge_calls: tuple[str, ...]
    enum: str
    terminal: tuple[str, ...]
    release_calls: tuple[str, ...]
    abort_calls: tuple[str, ...]
    log_calls: tuple[str, ...]
    sender_base: str
    exclude_classes: tuple[str, ...]
    poll_method: str
    abort_method: str
    # The object behind the sender that keeps the transfer status (see the pack's [manager]).
    manager_base: str
    check_method: str
    update_method: str
    clock_calls: tuple[str, ...]
    source: str

    def is_poll_call(self, callee: str) -> bool:
        return matches(callee, self.poll_calls)

    def is_release(self, callee: str) -> bool:
        return matches(callee, self.release_calls)

    def is_abort(self, callee: str) -> bool:
        return matches(callee, self.abort_calls)

    def is_log(self, callee: str) -> bool:
        return matches(callee, self.log_calls)

    def is_clock_call(self, callee: str) -> bool:
        return matches(callee, self.clock_calls)


def matches(text: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(text, pattern) for pattern in patterns)


def available_packs() -> list[str]:
    folder = resources.files("kvtrace.packs")
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_pack(name_or_path: str | None = None) -> Pack:
    """Load a bundled pack by name, or a TOML file by path."""
    name_or_path = name_or_path or DEFAULT_PACK
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"rules pack {path}: {exc.strerror or exc}") from None
        source = str(path)
    else:
        resource = resources.files("kvtrace.packs") / f"{name_or_path}.toml"
        if not resource.is_file():
            known = ", ".join(available_packs())
            raise InputError(f"unknown rules pack {name_or_path!r} (bundled: {known})")
        text = resource.read_text(encoding="utf-8")
        source = f"{name_or_path} (bundled)"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"rules pack {source}: {exc}") from None
    return _from_dict(data, source)


def _from_dict(data: dict, source: str) -> Pack:
    def get(section: str, key: str, default: object = None) -> object:
        value = data.get(section, {}).get(key, default)
        if value is None:
            raise InputError(f"rules pack {source}: [{section}] {key} is missing")
        return value

    def strings(section: str, key: str, default: list[str] | None = None) -> tuple[str, ...]:
        value = get(section, key, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(f"rules pack {source}: [{section}] {key} must be a list of strings")
        return tuple(value)

    return Pack(
        name=str(get("pack", "name")),
        description=str(get("pack", "description", "")),
        package_dir=str(get("pack", "package_dir")),
        queue=str(get("queue", "name")),
        poll_calls=strings("queue", "poll_calls"),
        gauge_calls=strings("queue", "gauge_calls", []),
        enum=str(get("enum", "name")),
        terminal=strings("enum", "terminal"),
        release_calls=strings("effects", "release_calls"),
        abort_calls=strings("effects", "abort_calls"),
        log_calls=strings("effects", "log_calls", []),
        sender_base=str(get("backends", "sender_base")),
        exclude_classes=strings("backends", "exclude_classes", []),
        poll_method=str(get("backends", "poll_method", "poll")),
        abort_method=str(get("backends", "abort_method", "abort")),
        manager_base=str(get("manager", "manager_base", "")),
        check_method=str(get("manager", "check_method", "")),
        update_method=str(get("manager", "update_method", "")),
        clock_calls=strings("backends", "clock_calls", ["time.time", "time.monotonic", "time.perf_counter"]),
        source=source,
    )
