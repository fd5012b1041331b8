"""Rules packs: the TOML files beside this module that name what the engine looks for.

The engine knows no SGLang names; a pack says which queues, which poll calls, which enum and
which calls release, answer or abort a request. A new engine or queue is a new pack. A pack is
checked against `SCHEMA` when loaded: a wrong type, a missing key or an unknown key (a typo
that would otherwise silently fall back to a default) is a one-line error with the file and line.

Rule samples for a pack live beside it, in `<pack>.samples.toml` (see `load_samples`), so a new
pack is tested by the suite without editing the engine's tests.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvtrace.errors import InputError

DEFAULT_PACK = "sglang-prefill"
# The bundled pack of each server role: a role's pack names every queue a request waits in there.
ROLE_PACKS = {"prefill": "sglang-prefill", "decode": "sglang-decode"}

STR, STRS, TABLE_OF_STRS = "a string", "a list of strings", "a table of lists of strings"

# section -> key -> (expected type, default; None = required). The whole schema of a pack.
SCHEMA: dict[str, dict[str, tuple[str, Any]]] = {
    "pack": {"name": (STR, None), "description": (STR, ""), "package_dir": (STR, None)},
    "queue": {
        "name": (STR, ""),  # one queue ...
        "names": (STRS, []),  # ... or several, analysed one by one with the same settings
        "poll_calls": (STRS, None),
        "gauge_calls": (STRS, []),
        # queue -> the resources (of [effects] resources) a request holds while in it; default all.
        "holds": (TABLE_OF_STRS, {}),
        # queue -> poll states a request has already left when it enters the queue (an earlier
        # queue keeps it while its poll says so). Such a state seen again at this queue's drain
        # needs the status table to go back: a verdict resting on that says so (a premise).
        "entered_past": (TABLE_OF_STRS, {}),
        # queue -> poll states a request's sender reaches only once its KV is sent, which happens
        # after it left the queue. Such a state seen at this queue's drain is another request's,
        # for the same room: a verdict resting on that says so (a premise).
        "reached_after": (TABLE_OF_STRS, {}),
    },
    "enum": {"name": (STR, None), "terminal": (STRS, None)},
    "effects": {
        "release_calls": (STRS, []),
        "abort_calls": (STRS, None),
        "answer_calls": (STRS, []),
        "log_calls": (STRS, []),
        "metric_calls": (STRS, []),
        # resource name -> calls that give it back; a request leaving the queue must give back each.
        "resources": (TABLE_OF_STRS, {}),
    },
    "backends": {
        "sender_base": (STR, None),
        # What messages call a request's object of that class: its KV "sender" (prefill side) or
        # "receiver" (decode side).
        "kv_object": (STR, "sender"),
        "exclude_classes": (STRS, []),
        "poll_method": (STR, "poll"),
        "abort_method": (STR, "abort"),
        # Not used by the engine any more (timeouts are recognised by the clock, see
        # clock_calls); still accepted so that older packs load.
        "timeout_names": (STRS, ["*timeout*"]),
        # Calls that read the clock: a comparison of a value computed from one is a timeout check.
        "clock_calls": (STRS, ["time.time", "time.monotonic", "time.perf_counter"]),
    },
    "manager": {
        "base": (STR, ""),
        "update_method": (STR, "update_status"),
        "check_method": (STR, "check_status"),
        # The manager's mode on this pack's side as its constructor tests it (`DECODE`): the
        # threads it starts only for another mode do not run here.
        "side": (STR, ""),
    },
}


@dataclass(frozen=True)
class Pack:
    """A rules pack as loaded and checked (see SCHEMA): the names the engine looks for."""

    name: str
    description: str
    package_dir: str
    queue: str  # the queue being analysed (the first of `queues` until `for_queue` picks another)
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
    timeout_names: tuple[str, ...]
    source: str
    queues: tuple[str, ...] = ()
    answer_calls: tuple[str, ...] = ()
    metric_calls: tuple[str, ...] = ()
    resources: tuple[tuple[str, tuple[str, ...]], ...] = ()
    holds: tuple[tuple[str, tuple[str, ...]], ...] = ()
    entered_past: tuple[tuple[str, tuple[str, ...]], ...] = ()
    reached_after: tuple[tuple[str, tuple[str, ...]], ...] = ()
    manager_base: str = ""
    update_method: str = "update_status"
    check_method: str = "check_status"
    manager_side: str = ""
    clock_calls: tuple[str, ...] = ("time.time", "time.monotonic", "time.perf_counter")
    kv_object: str = "sender"  # a request's object of the backends' class, in messages
    # The queues the user named (--queue), each judged even if not found; empty: the pack's own
    # choice. The others are still analysed, as what their drains do bears on these.
    only: tuple[str, ...] = ()
    path: Path | None = field(default=None, compare=False)  # the TOML file, None when bundled

    def for_queue(self, queue: str) -> "Pack":
        return replace(self, queue=queue)

    def is_poll_call(self, callee: str) -> bool:
        return matches(callee, self.poll_calls)

    def is_release(self, callee: str) -> bool:
        return matches(callee, self.release_calls)

    def is_abort(self, callee: str) -> bool:
        return matches(callee, self.abort_calls)

    def is_answer(self, callee: str) -> bool:
        return matches(callee, self.answer_calls)

    def is_log(self, callee: str) -> bool:
        return matches(callee, self.log_calls)

    def is_metric(self, callee: str) -> bool:
        return matches(callee, self.metric_calls)

    def held_in(self, queue: str) -> tuple[str, ...]:
        """The resources a request holds while in `queue` (all named ones unless the pack says)."""
        return next((names for name, names in self.holds if name == queue), tuple(n for n, _ in self.resources))

    def left_before(self, queue: str) -> tuple[str, ...]:
        """The poll states a request has left before it enters `queue` (none unless the pack says)."""
        return next((states for name, states in self.entered_past if name == queue), ())

    def reached_later(self, queue: str) -> tuple[str, ...]:
        """The poll states a request's sender reaches only after it left `queue` (none unless the pack says)."""
        return next((states for name, states in self.reached_after if name == queue), ())

    def resource_of(self, callee: str) -> str | None:
        """The named resource a release call gives back, if the pack names one."""
        return next((name for name, patterns in self.resources if matches(callee, patterns)), None)

    def is_timeout_name(self, text: str) -> bool:
        return matches(text.lower(), self.timeout_names)

    def is_clock_call(self, callee: str) -> bool:
        return matches(callee, self.clock_calls)


_MATCHED: dict[tuple[str, tuple[str, ...]], bool] = {}


def matches(text: str, patterns: tuple[str, ...]) -> bool:
    # Remembered: the flow engine asks the same few callees against the same patterns ~200,000
    # times in a scan of SGLang, and fnmatch was ~5% of it.
    key = (text, tuple(patterns))
    found = _MATCHED.get(key)
    if found is None:
        if len(_MATCHED) > 100_000:
            _MATCHED.clear()
        found = _MATCHED[key] = any(fnmatch.fnmatchcase(text, pattern) for pattern in patterns)
    return found


def _bundled() -> Any:
    here = Path(__file__).parent
    if here.is_dir():  # an installed or checked-out package: no importlib.resources (and zipfile) to import
        return here
    from importlib import resources

    return resources.files("kvtrace.packs")


def available_packs() -> list[str]:
    return sorted(p.name[: -len(".toml")] for p in _bundled().iterdir()
                  if p.name.endswith(".toml") and not p.name.endswith(".samples.toml"))


def _read(name_or_path: str, suffix: str = ".toml") -> tuple[str, str, Path | None] | None:
    """(text, source label, path) of a pack file given by path or bundled name; None if absent."""
    from kvtrace.userfiles import TOML_CAP, read_text

    path = Path(name_or_path)
    try:
        named_file = path.suffix == ".toml" or path.exists()
    except OSError:  # a name too long to be a file: one line from the reader below
        named_file = True
    if named_file:
        if suffix != ".toml":
            path = path.with_name(path.name[: -len(".toml")] + suffix)
            if not path.is_file():
                return None
        return read_text(path, "rules pack", TOML_CAP), str(path), path  # bounded: a FIFO or /dev/zero is refused
    resource = _bundled() / f"{name_or_path}{suffix}"
    if not resource.is_file():
        return None
    return resource.read_text(encoding="utf-8"), f"kvtrace/packs/{name_or_path}{suffix}", None


def load_pack(name_or_path: str | None = None) -> Pack:
    """Load a bundled pack by name, or a TOML file by path, validated against SCHEMA."""
    name_or_path = name_or_path or DEFAULT_PACK
    found = _read(name_or_path)
    if found is None:
        raise InputError(f"unknown rules pack {name_or_path!r} (bundled: {', '.join(available_packs())})")
    text, source, path = found
    data = _parse(text, source)
    return _from_dict(validate(data, text, source), source, path)


def _parse(text: str, source: str) -> dict[str, Any]:
    from kvtrace.userfiles import parse_toml

    return parse_toml(text, f"rules pack {source}")


def key_line(text: str, section: str, key: str | None = None) -> int:
    """The line of `[section]` (or of `key` inside it) in the TOML text; 1 if not found.

    tomllib gives no positions, so this reads headers and `key =` lines, enough for a pointer."""
    current = None
    header = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
    for number, line in enumerate(text.splitlines(), 1):
        match = header.match(line)
        if match:
            current = match.group(1).strip().strip('"')
            if current == (section if key is None else f"{section}.{key}"):
                return number
            continue
        if key is not None and current == section and re.match(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=", line):
            return number
    return 1


def _type_ok(kind: str, value: Any) -> bool:
    if kind == STR:
        return isinstance(value, str)
    if kind == STRS:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, dict) and all(
        isinstance(v, list) and all(isinstance(s, str) for s in v) for v in value.values())


def validate(data: dict[str, Any], text: str, source: str) -> dict[str, dict[str, Any]]:
    """Every section and key known and well typed, required ones present; defaults filled in."""
    def fail(line: int, message: str) -> InputError:
        return InputError(f"rules pack {source}:{line}: {message}")

    for section, value in data.items():
        if section not in SCHEMA:
            raise fail(key_line(text, section), f"unknown section [{section}] (known: {', '.join(SCHEMA)})")
        if not isinstance(value, dict):
            raise fail(_top_key_line(text, section), f"{section} must be a [{section}] table")
    checked: dict[str, dict[str, Any]] = {}
    for section, keys in SCHEMA.items():
        given = data.get(section, {})
        for key in given:
            if key not in keys:
                raise fail(key_line(text, section, key),
                           f"[{section}] unknown key {key!r} (known: {', '.join(keys)})")
        checked[section] = {}
        for key, (kind, default) in keys.items():
            if key not in given:
                if default is None:
                    raise fail(key_line(text, section), f"[{section}] {key} is missing")
                checked[section][key] = default
                continue
            if not _type_ok(kind, given[key]):
                raise fail(key_line(text, section, key), f"[{section}] {key} must be {kind}")
            checked[section][key] = given[key]
    _check_references(checked, text, fail)
    return checked


def _check_references(checked: dict[str, dict[str, Any]], text: str, fail: Callable[[int, str], InputError]) -> None:
    """What the typed keys name exists in the pack: its queues, their resources, a terminal state."""
    if not checked["queue"]["name"] and not checked["queue"]["names"]:
        raise fail(key_line(text, "queue"), "[queue] needs name (one queue) or names (several)")
    for name, held in checked["queue"]["holds"].items():
        unknown = [h for h in held if h not in checked["effects"]["resources"]]
        if name not in queues_of(checked) or unknown:
            raise fail(key_line(text, "queue", "holds"), f"[queue] holds: {name!r} must be a queue of this pack "
                       f"and {unknown or held} resources of [effects.resources]")
    for key in ("entered_past", "reached_after"):
        for name in checked["queue"][key]:
            if name not in queues_of(checked):
                raise fail(key_line(text, "queue", key), f"[queue] {key}: {name!r} must be a queue of this pack")
    if not checked["enum"]["terminal"]:
        raise fail(key_line(text, "enum", "terminal"), "[enum] terminal must name at least one member")


def queues_of(checked: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    queue = checked["queue"]
    return tuple(dict.fromkeys(([queue["name"]] if queue["name"] else []) + list(queue["names"])))


def _top_key_line(text: str, key: str) -> int:
    return next((n for n, line in enumerate(text.splitlines(), 1)
                 if re.match(rf"^\s*{re.escape(key)}\s*=", line)), 1)


def _from_dict(data: dict[str, dict[str, Any]], source: str, path: Path | None) -> Pack:
    queue, effects, backends, manager = data["queue"], data["effects"], data["backends"], data["manager"]
    queues = queues_of(data)
    owned = tuple((name, tuple(patterns)) for name, patterns in effects["resources"].items())
    # Every named resource's calls are release calls too.
    release = tuple(dict.fromkeys(list(effects["release_calls"]) + [p for _, ps in owned for p in ps]))
    return Pack(
        name=data["pack"]["name"],
        description=data["pack"]["description"],
        package_dir=data["pack"]["package_dir"],
        queue=queues[0],
        poll_calls=tuple(queue["poll_calls"]),
        gauge_calls=tuple(queue["gauge_calls"]),
        enum=data["enum"]["name"],
        terminal=tuple(data["enum"]["terminal"]),
        release_calls=release,
        abort_calls=tuple(effects["abort_calls"]),
        log_calls=tuple(effects["log_calls"]),
        sender_base=backends["sender_base"],
        exclude_classes=tuple(backends["exclude_classes"]),
        poll_method=backends["poll_method"],
        abort_method=backends["abort_method"],
        timeout_names=tuple(backends["timeout_names"]),
        clock_calls=tuple(backends["clock_calls"]),
        kv_object=backends["kv_object"],
        source=source,
        queues=queues,
        answer_calls=tuple(effects["answer_calls"]),
        metric_calls=tuple(effects["metric_calls"]),
        resources=owned,
        holds=tuple((name, tuple(held)) for name, held in queue["holds"].items()),
        entered_past=tuple((name, tuple(states)) for name, states in queue["entered_past"].items()),
        reached_after=tuple((name, tuple(states)) for name, states in queue["reached_after"].items()),
        manager_base=manager["base"],
        update_method=manager["update_method"],
        check_method=manager["check_method"],
        manager_side=manager["side"],
        path=path,
    )


def bundled_pack_of(queues: list[str]) -> str | None:
    """The one bundled pack that names every queue in `queues`, if there is one."""
    holders = [name for name in available_packs() if set(queues) <= set(load_pack(name).queues)]
    return holders[0] if len(holders) == 1 else None


def pack_for(pack: str | None, role: str | None, queues: list[str]) -> str | None:
    """The pack a scan uses: the one given (--rules or [tool.kvtrace] pack); else the role's; else,
    when queues are named, the bundled pack that holds them (`--queue disagg_decode_transfer_queue`
    alone scans the decode side); else None (the default pack)."""
    if role is not None:
        if role not in ROLE_PACKS:
            raise InputError(f"--role must be one of {', '.join(ROLE_PACKS)} (got {role!r})")
        if pack is not None and pack != ROLE_PACKS[role]:
            raise InputError(f"--role {role} scans the bundled pack {ROLE_PACKS[role]}, but the pack {pack} "
                             f"is also given: give one of them")
        return ROLE_PACKS[role]
    if pack is None and queues and not set(queues) <= set(load_pack(DEFAULT_PACK).queues):
        return bundled_pack_of(queues) or DEFAULT_PACK  # none holds them all: select_queues says which
    return pack


def select_queues(pack: Pack, queues: list[str]) -> Pack:
    """The pack that judges only the named queues, in the pack's order (all of them when none is named).
    A name the pack does not hold is an input error that lists the pack's queues and, when a
    bundled pack holds it, which one."""
    if not queues:
        return pack
    unknown = [name for name in dict.fromkeys(queues) if name not in pack.queues]
    if unknown:
        elsewhere = {name: holder for name in unknown if (holder := bundled_pack_of([name])) is not None}
        hint = "".join(f"; {name} is in the pack {holder}" for name, holder in elsewhere.items())
        roles = set(ROLE_PACKS.values())
        # Queues of the two roles (prefill's and decode's): --role all is the scan that reads both.
        both = pack.name in roles and len(elsewhere) == len(unknown) and set(elsewhere.values()) <= roles
        suggest = "; --role all scans both roles' queues, one report per role" if both else ""
        if pack.name in roles and not elsewhere:  # no role holds it: name every role's queues
            held = [name for role_pack in ROLE_PACKS.values() for name in load_pack(role_pack).queues]
            raise InputError(f"--queue {', '.join(unknown)}: not a queue of any role (the queues: {', '.join(held)})")
        raise InputError(f"--queue {', '.join(unknown)}: not a queue of the pack {pack.name} "
                         f"(its queues: {', '.join(pack.queues)}){hint}; one scan reads one pack{suggest}")
    return replace(pack, only=tuple(name for name in pack.queues if name in queues))


@dataclass(frozen=True)
class PackSample:
    """One sample tree of a pack's samples file: which rule, valid or invalid, what to expect."""

    rule: str
    kind: str  # valid | invalid
    files: dict[str, str]
    expect: tuple[tuple[str | None, str | None], ...]
    note: str
    line: int


def load_samples(name_or_path: str) -> tuple[dict[str, str], list[PackSample]]:
    """`<pack>.samples.toml`: `[shared] files` added to every sample, and `[[sample]]` entries
    (rule = name or code, kind = valid|invalid, note, expect = [[backend, state], ...] with ""
    for none, and a `files` table of path -> code)."""
    found = _read(name_or_path, ".samples.toml")
    if found is None:
        return {}, []
    text, source, _ = found
    data = _parse(text, source)
    shared = data.get("shared", {}).get("files", {})
    samples = []
    sample_lines = [n for n, line in enumerate(text.splitlines(), 1) if line.strip() == "[[sample]]"]
    for i, entry in enumerate(data.get("sample", [])):
        line = sample_lines[i] if i < len(sample_lines) else 1
        unknown = set(entry) - {"rule", "kind", "files", "expect", "note"}
        if unknown or entry.get("kind") not in ("valid", "invalid") or not isinstance(entry.get("files"), dict):
            raise InputError(f"rules pack samples {source}:{line}: a [[sample]] needs rule, kind = valid|invalid "
                             f"and files, and nothing else (got {sorted(entry)})")
        expect = tuple((b or None, s or None) for b, s in entry.get("expect", []))
        samples.append(PackSample(entry["rule"], entry["kind"], entry["files"], expect, entry.get("note", ""), line))
    return shared, samples
