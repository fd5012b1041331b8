"""Every file a user (or a config file) names, read one way: bounded, and never trusted.

A config, a baseline, a merge input, a rules pack or a hosts file can be anything the name points
at: a FIFO (an open that blocks forever), /dev/zero (a read that never ends), a 3 GB sparse file,
a non-UTF-8 file, a document nested 100,000 deep. Each is refused with one line naming the file,
before any of it is held in memory: the open does not block (O_NONBLOCK), fstat on the opened
descriptor must say "regular file" (so what is read is what was checked), the size must be under
a cap, and at most cap + 1 bytes are ever read (a file that grows while read is still bounded).

Parsed documents are then checked against a schema (`validate`): a small JSON Schema subset
(type, enum, const, required, properties, additionalProperties, items, minimum, minLength,
pattern, $ref to #/$defs) so the schemas kvtrace ships are the ones enforced, without making the jsonschema
package a runtime dependency. Messages name the file and the key: `baseline b.json: reports[0]
.findings[2].rule: must be a string, not 3`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from kvtrace.errors import InputError

# What a hand-written or generated input may weigh. A kvtrace JSON report of SGLang's whole
# installed package is ~6 MB; 64 MiB leaves ten times that and still bounds memory.
JSON_CAP = 64 * 1024 * 1024
TOML_CAP = 4 * 1024 * 1024  # a pyproject.toml or a rules pack: kilobytes in practice
TEXT_CAP = 16 * 1024 * 1024  # a hosts file


def _describe(what: str, path: Path | str) -> str:
    return f"{what} {path}" if what else str(path)


def read_bytes(path: Path | str, what: str, cap: int, follow_links: bool = True) -> bytes:
    """The bytes of a regular file of at most `cap` bytes; anything else is one InputError line.

    `follow_links=False` refuses a symlink itself (the cache's own entries), otherwise a link a
    user made to their file is followed, but what it reaches must still be a regular file."""
    label = _describe(what, path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise InputError(f"{label}: is a symbolic link (refused)") from None
        raise InputError(f"{label}: {_reason(exc)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{label}: not a regular file ({_kind(info.st_mode)})")
        if info.st_size > cap:
            raise InputError(f"{label}: {info.st_size} bytes, more than the {cap} a {what or 'file'} may have")
        chunks: list[bytes] = []
        left = cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{label}: {_reason(exc)}") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise InputError(f"{label}: grew past the {cap} bytes a {what or 'file'} may have while being read")
    return data


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "file name too long"  # without the name itself, already shown (and 255+ bytes)
    return exc.strerror or str(exc)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def read_text(path: Path | str, what: str, cap: int) -> str:
    data = read_bytes(path, what, cap)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{_describe(what, path)}: not UTF-8 (byte {exc.start}: {exc.reason})") from None


def parse_json(text: str, label: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(f"{label}: nested too deeply to be a kvtrace document") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more digits than int() takes
        raise InputError(f"{label}: not JSON ({exc})") from None


def load_json(path: Path | str, what: str, cap: int = JSON_CAP) -> Any:
    return parse_json(read_text(path, what, cap), _describe(what, path))


def parse_toml(text: str, label: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the same parser, released on its own for Python 3.10
        import tomli as tomllib

    try:
        return tomllib.loads(text)
    except RecursionError:
        raise InputError(f"{label}: nested too deeply") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{label}: not valid TOML: {exc}") from None


def load_toml(path: Path | str, what: str, cap: int = TOML_CAP) -> dict[str, Any]:
    return parse_toml(read_text(path, what, cap), _describe(what, path))


def check_name_length(path: Path, option: str) -> None:
    """Each part of a file name within the system's limit (255 bytes on Linux), checked before
    any scan: a name that cannot exist is one line, not an exception after the work."""
    for part in path.parts:
        if len(os.fsencode(part)) > 255:
            raise InputError(f"{option} {str(path)[:80]}...: file name too long (a part of it is over 255 bytes)")


# --- schema ------------------------------------------------------------------------------------

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,), "null": (type(None),),
    "number": (int, float), "integer": (int,),
}
_NAMES = {"object": "an object", "array": "a list", "string": "a string", "boolean": "true or false",
          "null": "null", "number": "a number", "integer": "a whole number"}


class SchemaError(ValueError):
    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where or '(top)'}: {message}")


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False  # JSON's true is not 1
    return isinstance(value, _JSON_TYPES[kind])


def validate(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None, where: str = "") -> None:
    """Raise SchemaError (with the key path) when `value` does not meet `schema`. Walks with an
    explicit stack, so a document nested as deep as the parser allowed cannot overflow it."""
    root = root if root is not None else schema
    stack: list[tuple[Any, dict[str, Any], str]] = [(value, schema, where)]
    while stack:
        value, schema, where = stack.pop()
        ref = schema.get("$ref")
        if ref is not None:
            name = ref.removeprefix("#/$defs/")
            schema = root["$defs"][name]
        if "const" in schema and (value != schema["const"] or type(value) is not type(schema["const"])):
            raise SchemaError(where, f"must be {_shown(schema['const'])}, not {_shown(value)}")
        if "enum" in schema and not any(value == option and type(value) is type(option) for option in schema["enum"]):
            raise SchemaError(where, f"must be one of {', '.join(_shown(o) for o in schema['enum'])}, not {_shown(value)}")
        kinds = schema.get("type")
        if kinds is not None:
            kinds = [kinds] if isinstance(kinds, str) else kinds
            if not any(_is(value, kind) for kind in kinds):
                raise SchemaError(where, f"must be {' or '.join(_NAMES[k] for k in kinds)}, not {_shown(value)}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and "minimum" in schema \
                and value < schema["minimum"]:
            raise SchemaError(where, f"must be at least {schema['minimum']}, not {value}")
        if isinstance(value, str) and len(value) < schema.get("minLength", 0):
            raise SchemaError(where, "must not be empty" if not value else f"must be at least {schema['minLength']} characters")
        if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
            raise SchemaError(where, f"must match {schema['pattern']}, not {_shown(value)}")
        if isinstance(value, dict):
            for key in schema.get("required", ()):
                if key not in value:
                    raise SchemaError(where, f"{key!r} is missing")
            properties = schema.get("properties", {})
            extra = schema.get("additionalProperties", True)
            for key, item in value.items():
                inner = f"{where}.{key}" if where else str(key)
                if key in properties:
                    stack.append((item, properties[key], inner))
                elif extra is False:
                    raise SchemaError(where, f"unknown key {key!r}")
                elif isinstance(extra, dict):
                    stack.append((item, extra, inner))
        elif isinstance(value, list) and "items" in schema:
            stack.extend((item, schema["items"], f"{where}[{i}]") for i, item in enumerate(value))


def checked(value: Any, schema: dict[str, Any], label: str) -> Any:
    """`value` when it meets `schema`, else one InputError line naming `label` and the key."""
    try:
        validate(value, schema)
    except SchemaError as exc:
        raise InputError(f"{label}: {exc}") from None
    return value
