"""A Report as JSON and back, losslessly and checked: the cache's data-only format.

The JSON report (kvtrace.report.json) is written for people and tools and leaves out what the
cache needs (the queue graph, finding marks, the exact types), so the cache has its own codec,
driven by the annotations of kvtrace.model: encoding walks the dataclasses; decoding builds each
type its annotation names and refuses anything else (a wrong type, a missing or extra key, an
enum value that does not exist). Decoders are compiled once per type, so a warm scan spends its
time reading JSON rather than asking `typing` questions.

`graphs` and `host_facts` hold free-form values (tuples, sets, nested dicts): they are written
with explicit tags ({"tuple": [...]}, {"set": [...]}, {"dict": [[key, value], ...]}) so that
what comes back is what went in, and only those plain types can come back.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

from kvtrace import model
from kvtrace.model import Report


class CacheFormatError(ValueError):
    """The payload is not a report this kvtrace wrote."""


Decoder = Callable[[Any], Any]
T = typing.TypeVar("T")

# Fields left out of the typed walk: the files are stored apart (their bytes are not cached) and
# these hold free-form plain values.
_SKIPPED: dict[type, frozenset[str]] = {Report: frozenset({"files"})}
_PLAIN: dict[type, frozenset[str]] = {Report: frozenset({"graphs", "host_facts"})}
_PLAIN_TAGS = ("tuple", "set", "frozenset", "dict")


# --- encoding -----------------------------------------------------------------------------------

def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, str):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        skipped, plain = _SKIPPED.get(cls, frozenset()), _PLAIN.get(cls, frozenset())
        return {f.name: (_plain(getattr(value, f.name)) if f.name in plain else _encode(getattr(value, f.name)))
                for f in _fields(cls) if f.name not in skipped}
    if isinstance(value, (list, tuple)):
        return [_encode(item) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("a typed dict with keys that are not strings")
        return {k: _encode(v) for k, v in value.items()}
    raise TypeError(f"cannot cache a {type(value).__name__}")


# Values that are their own plain form: exactly these types (a subclass, such as an enum, is not
# one). The graphs are mostly such leaves: tested inline, a leaf costs no call.
_LEAVES = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind in _LEAVES:
        return value
    if kind is dict:  # the graphs' attributes, the commonest container: tested before the chain below
        return {"dict": [[k if type(k) in _LEAVES else _plain(k), v if type(v) in _LEAVES else _plain(v)]
                         for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list):
        return [v if type(v) in _LEAVES else _plain(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [v if type(v) in _LEAVES else _plain(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        items = sorted((_plain(v) for v in value), key=json.dumps)  # the same bytes for the same set
        return {"frozenset" if isinstance(value, frozenset) else "set": items}
    if isinstance(value, dict):
        return {"dict": [[_plain(k), _plain(v)] for k, v in value.items()]}
    raise TypeError(f"cannot cache a {type(value).__name__}")


def encode_report(extra: dict[str, Any], report: Report) -> bytes:
    return json.dumps({"extra": extra, "report": _encode(report)}, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8", "surrogatepass")


def key_bytes(extra: dict[str, Any], report: Report) -> bytes:
    """The fields `encode_report` writes, as bytes for a cache key (never decoded): the json
    module's C encoder walks the report and is handed each dataclass as a dict of its fields, so
    the key of a rendering costs a fraction of `_encode`'s walk in Python."""
    return json.dumps({"extra": extra, "report": report}, default=_key_part, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8", "surrogatepass")


# dataclass -> (field name, written as a plain value) of each field a key holds, worked out once.
_KEY_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}


def _key_part(value: Any) -> Any:
    cls = type(value)
    spec = _KEY_FIELDS.get(cls)
    if spec is None:
        if isinstance(value, enum.Enum):  # a str-valued enum never gets here: JSON writes it as its string
            return value.value
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            raise TypeError(f"cannot key a {type(value).__name__}")
        skipped, plain = _SKIPPED.get(cls, frozenset()), _PLAIN.get(cls, frozenset())
        spec = _KEY_FIELDS[cls] = tuple((f.name, f.name in plain) for f in _fields(type(value)) if f.name not in skipped)
    return {name: _plain(getattr(value, name)) if plain else getattr(value, name) for name, plain in spec}


# --- decoding -----------------------------------------------------------------------------------

def decode_report(payload: bytes) -> tuple[dict[str, Any], Report]:
    """(extra, report) from `encode_report`'s bytes; CacheFormatError (or any ValueError) when
    the payload is anything else."""
    try:
        data = json.loads(payload.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, RecursionError) as exc:
        raise CacheFormatError(str(exc)) from None
    if not isinstance(data, dict) or set(data) != {"extra", "report"} or not isinstance(data["extra"], dict):
        raise CacheFormatError("not a cached report")
    return data["extra"], _decoder(Report)(data["report"])


def encode_record(record: Any) -> bytes:
    """Any dataclass of kvtrace.model as JSON (the forked scan's result, kvtrace.pipeline)."""
    return json.dumps(_encode(record), separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def decode_record(payload: bytes, cls: type[T]) -> T:
    """`encode_record`'s bytes back as a `cls`, checked like a cached report."""
    try:
        data = json.loads(payload.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, RecursionError) as exc:
        raise CacheFormatError(str(exc)) from None
    decode = _decoder(typing.cast(Any, cls))  # a class: hashable, as the cache of decoders needs
    return typing.cast(T, decode(data))


def _fail(expected: str, value: Any) -> CacheFormatError:
    return CacheFormatError(f"expected {expected}, found {type(value).__name__}")


@cache
def _fields(cls: type) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_"))


def _hints(cls: type) -> dict[str, Any]:
    """The fields' types. kvtrace.model's annotations are strings (PEP 563); each distinct one
    is evaluated once (typing.get_type_hints compiles every occurrence, ~a third of a warm run)."""
    return {f.name: _annotation(f.type) if isinstance(f.type, str) else f.type for f in dataclasses.fields(cls)}


@cache
def _annotation(text: str) -> Any:
    return eval(text, vars(model))  # kvtrace's own annotations, never data


@cache
def _decoder(hint: Any) -> Decoder:
    """A function that turns JSON data into a value of type `hint`, or raises."""
    if hint is Any or hint is object:
        return _unplain
    if hint is type(None):
        return _exactly(type(None), "null")
    if hint in (str, int, float, bool):
        return _scalar(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return _union(tuple(_decoder(a) for a in args if a is not type(None)), type(None) in args)
    if origin is typing.Literal:
        return _literal(args)
    if origin is list:
        return _sequence(_decoder(args[0]), list)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _sequence(_decoder(args[0]), tuple)
        return _fixed_tuple(tuple(_decoder(a) for a in args))
    if origin is dict:
        return _mapping(_decoder(args[0]), _decoder(args[1]))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass(hint)
    raise TypeError(f"no cache decoder for {hint!r}")


def _exactly(kind: type, name: str) -> Decoder:
    def decode(value: Any) -> Any:
        if type(value) is not kind:
            raise _fail(name, value)
        return value
    return decode


def _scalar(kind: type) -> Decoder:
    def decode(value: Any) -> Any:
        if kind is float and type(value) is int:
            return float(value)
        if type(value) is not kind:
            raise _fail(kind.__name__, value)
        return value
    return decode


def _union(options: tuple[Decoder, ...], nullable: bool) -> Decoder:
    def decode(value: Any) -> Any:
        if value is None and nullable:
            return None
        for option in options:
            try:
                return option(value)
            except (CacheFormatError, TypeError, ValueError):
                continue
        raise _fail("one of a union", value)
    return decode


def _literal(allowed: tuple[Any, ...]) -> Decoder:
    def decode(value: Any) -> Any:
        if not any(value == a and type(value) is type(a) for a in allowed):
            raise CacheFormatError(f"{value!r} is not one of {allowed}")
        return value
    return decode


def _sequence(item: Decoder, kind: type) -> Decoder:
    def decode(value: Any) -> Any:
        if type(value) is not list:
            raise _fail("a list", value)
        return kind(item(v) for v in value)
    return decode


def _fixed_tuple(items: tuple[Decoder, ...]) -> Decoder:
    def decode(value: Any) -> Any:
        if type(value) is not list or len(value) != len(items):
            raise _fail(f"a list of {len(items)}", value)
        return tuple(d(v) for d, v in zip(items, value))
    return decode


def _mapping(key: Decoder, item: Decoder) -> Decoder:
    def decode(value: Any) -> Any:
        if type(value) is not dict:
            raise _fail("an object", value)
        return {key(k): item(v) for k, v in value.items()}
    return decode


def _enum(kind: type[enum.Enum]) -> Decoder:
    def decode(value: Any) -> Any:
        if type(value) is not str:
            raise _fail(kind.__name__, value)
        return kind(value)  # ValueError for a value the enum does not have
    return decode


def _dataclass(cls: type) -> Decoder:
    skipped, plain = _SKIPPED.get(cls, frozenset()), _PLAIN.get(cls, frozenset())
    fields = [f for f in _fields(cls) if f.name not in skipped]
    names = frozenset(f.name for f in fields)
    hints = _hints(cls)
    decoders = [(f.name, _unplain if f.name in plain else _decoder(hints[f.name])) for f in fields]
    left_out: dict[str, list[Any]] = {name: [] for name in skipped}

    def decode(value: Any) -> Any:
        if type(value) is not dict:
            raise _fail(cls.__name__, value)
        if value.keys() != names:
            raise CacheFormatError(f"{cls.__name__}: keys {sorted(value.keys() ^ names)} differ")
        return cls(**{name: decode_field(value[name]) for name, decode_field in decoders}, **left_out)
    return decode


def _unplain(value: Any) -> Any:
    if type(value) in _LEAVES:
        return value
    if type(value) is list:
        return [v if type(v) in _LEAVES else _unplain(v) for v in value]
    if type(value) is dict and len(value) == 1:
        (tag, items), = value.items()
        if tag in _PLAIN_TAGS and type(items) is list:
            if tag == "dict":
                pairs = [_fixed_pair(pair) for pair in items]
                return {k if type(k) in _LEAVES else _unplain(k): v if type(v) in _LEAVES else _unplain(v)
                        for k, v in pairs}
            decoded = [v if type(v) in _LEAVES else _unplain(v) for v in items]
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](decoded)
    raise _fail("a plain value", value)


def _fixed_pair(pair: Any) -> tuple[Any, Any]:
    if type(pair) is not list or len(pair) != 2:
        raise _fail("a [key, value] pair", pair)
    return pair[0], pair[1]
