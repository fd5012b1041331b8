"""JSON Schema (draft 2020-12) of the kvtrace/2 document; tests validate every report against it.

kvtrace/2 wraps the reports in one document: {"schema": "kvtrace/2", "kvtrace": VERSION,
"reports": [...]}; each report is the kvtrace/1 report object without its "schema" key, plus
"version", "complete", "summary" and "gaps"."""

from __future__ import annotations

from typing import Any

from kvtrace.model import EventKind, Outcome, PremiseKind, WayOut

_EVIDENCE = {
    "type": "object",
    "required": ["path", "line", "note"],
    "properties": {"path": {"type": "string"}, "line": {"type": "integer", "minimum": 1}, "note": {"type": "string"}},
    "additionalProperties": False,
}
_LOCATION = {
    "type": ["object", "null"],
    "required": ["path", "line"],
    "properties": {"path": {"type": "string"}, "line": {"type": "integer", "minimum": 1}},
}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_OUTCOME = {"enum": [o.value for o in Outcome]}

_GAP = {
    "type": "object",
    "required": ["kind", "subject", "reason"],
    "properties": {
        "kind": {"enum": ["file", "backend", "analysis"]},
        "subject": {"type": "string", "description": "the file path, the backend name, or the target"},
        "reason": {"type": "string"},
        "line": {"type": "integer", "minimum": 1, "description": "a file gap's line, when it is at one (a syntax error's)"},
    },
    "additionalProperties": False,
}

REPORT_SCHEMA: dict[str, Any] = {
    "title": "one report: one package of one target",
    "description": "Paths are relative to the scanned target, with '/' separators; lines are 1-based.",
    "type": "object",
    "required": ["schema", "target", "root", "complete", "summary", "gaps", "files", "queues", "backends", "findings"],
    "properties": {
        "schema": {"const": "kvtrace/2"},
        "target": {"type": "string", "description": "the target as given on the command line"},
        "root": {"type": "string", "description": "the located package folder, relative to the target"},
        "version": {
            "type": ["object", "null"],
            "description": "the version the tree declares (__version__ in a version.py above the package)",
            "required": ["package", "version", "path", "line"],
            "properties": {"package": {"type": "string"}, "version": {"type": "string"},
                           "path": {"type": "string"}, "line": {"type": "integer", "minimum": 1}},
        },
        "complete": {"type": "boolean", "description": "false when anything was not analysed (see gaps)"},
        "summary": {"type": "string", "description": "the text report's summary line"},
        "gaps": {"type": "array", "items": _GAP, "description": "every file, backend or part not analysed, and why"},
        "host": {"type": "string", "description": "the machine scanned: the SSH target, or this host's name"},
        "filters": {
            "type": "object",
            "description": "what the scan was told to leave out: the [tool.kvtrace] file applied (or null), "
                           "rules selected or ignored, backends of the tree left out, and backends asked to "
                           "be left out that the tree does not have",
            "required": ["config", "select", "ignore", "ignored_backends", "unknown_backends"],
            "properties": {
                "config": {"type": ["string", "null"]},
                "select": {"type": "array", "items": {"type": "string"}},
                "ignore": {"type": "array", "items": {"type": "string"}},
                "ignored_backends": {"type": "array", "items": {"type": "string"}},
                "unknown_backends": {"type": "array", "items": {"type": "string"}},
            },
        },
        "role": {"type": "string", "description": "--role all: the role (prefill, decode) whose queues this report judges"},
        "sglang_version": {"type": ["string", "null"],
                           "description": "from the installed package metadata (sglang-*.dist-info), if any"},
        "metrics": {
            "type": "object",
            "description": "--metrics: queue gauges sampled from the Prometheus page, one value per sample",
            "required": ["url", "seconds", "samples", "gauges", "error"],
            "properties": {
                "url": {"type": "string"}, "seconds": {"type": "number"}, "samples": {"type": "integer"},
                "gauges": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "number"}}},
                "error": {"type": ["string", "null"]},
            },
        },
        "enum": {**_LOCATION, "description": "where the poll enum is defined"},
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["path", "sha256", "status", "error"],
                "properties": {
                    "path": {"type": "string"},
                    "sha256": {"type": "string"},
                    "status": {"enum": ["ok", "syntax-error", "not-utf8", "too-large", "skipped", "unreadable"]},
                    "error": {"type": ["string", "null"]},
                },
            },
        },
        "queues": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "sites", "states"],
                "properties": {
                    "name": {"type": "string"},
                    "drain": {**_LOCATION, "description": "the drain loop's `for` line; note = its function"},
                    "sites": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["kind", "path", "line", "function", "states"],
                            "properties": {
                                "kind": {"enum": [k.value for k in EventKind if k.is_site]},
                                "path": {"type": "string"},
                                "line": {"type": "integer", "minimum": 1},
                                "function": {"type": "string"},
                                "states": {**_STRINGS, "description": "states that reach the site (checks: that take the true branch)"},
                                "note": {"type": "string"},
                                "mode": {"type": "string", "description": "the modes of the drain that reach it, when not all do"},
                            },
                        },
                    },
                    "states": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "required": ["fate", "evidence"],
                            "properties": {
                                "fate": {"type": "array", "items": _OUTCOME,
                                         "description": "every outcome, all modes together"},
                                "evidence": {"type": "array", "items": _EVIDENCE},
                                "modes": {
                                    "type": "array",
                                    "description": "the fate per mode of the drain, in the order of the queue's modes",
                                    "items": {
                                        "type": "object",
                                        "required": ["mode", "fate", "then", "waits"],
                                        "properties": {
                                            "mode": {"type": "string"},
                                            "fate": {"type": "array", "items": _OUTCOME},
                                            "then": {"type": "array", "items": _OUTCOME,
                                                     "description": "outcomes on the paths that do not wait"},
                                            "waits": {"type": "array", "items": _EVIDENCE,
                                                      "description": "kept on a path that never tests the poll value: the guard (note) or the keep"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                    "modes": {
                        "type": "array",
                        "description": "how the callers in the tree bind the drain's defaulted parameters",
                        "items": {
                            "type": "object",
                            "required": ["label", "passed", "callers"],
                            "properties": {
                                "label": {"type": "string"},
                                "passed": _STRINGS,
                                "callers": {"type": "array", "items": _EVIDENCE},
                            },
                        },
                    },
                },
            },
        },
        "backends": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "sender", "poll", "returns", "reads_abort_state", "timeouts"],
                "properties": {
                    "name": {"type": "string", "description": "the backend's folder"},
                    "sender": {"type": "string"},
                    "path": {"type": "string"},
                    "line": {"type": "integer"},
                    "poll": {
                        "type": ["object", "null"],
                        "required": ["path", "line", "inherited_from"],
                        "properties": {"path": {"type": "string"}, "line": {"type": "integer"},
                                       "inherited_from": {"type": ["string", "null"]}},
                    },
                    "returns": _STRINGS,
                    "reads_abort_state": {"type": "boolean"},
                    "abort_state": {"type": ["string", "null"]},
                    "has_abort": {"type": "boolean", "description": "a concrete abort() is defined in the "
                                  "sender's classes (false: the scheduler's abort() calls cannot reach it)"},
                    "timeouts": {
                        "type": "array",
                        "items": {"type": "object", "required": ["path", "line", "covers"],
                                  "properties": {"path": {"type": "string"}, "line": {"type": "integer"},
                                                 "covers": _STRINGS}},
                    },
                    "notes": _STRINGS,
                    "returns_unknown": {**_STRINGS, "description": "why poll() may return values kvtrace "
                                        "cannot follow (apart from `returns`, the states it is known to return)"},
                    "manager": {
                        "type": ["object", "null"],
                        "description": "the manager paired with the sender, and its status table",
                        "required": ["name", "path", "line", "found_by", "table", "holds", "unknown", "clears"],
                        "properties": {
                            "name": {"type": "string"}, "path": {"type": "string"},
                            "line": {"type": "integer", "minimum": 1},
                            "found_by": {"type": "string", "description": "how the pair was found: from a backend -> classes "
                                         "mapping, an __init__ annotation, or the backend's folder (with where)"},
                            "table": {"type": ["string", "null"], "description": "the status table attribute"},
                            "holds": {**_STRINGS, "description": "states stored into the table somewhere"},
                            "unknown": {**_STRINGS, "description": "why some stored values are unknown"},
                            "clears": {"type": "array", "items": _EVIDENCE,
                                       "description": "paths that remove the room from the table"},
                            "runs": {**_STRINGS, "description": "`path:Class.method` of the status check and "
                                     "update methods the manager's MRO resolves (inherited ones included): "
                                     "a finding in one of them belongs to this backend"},
                        },
                        "additionalProperties": False,
                    },
                    "verdicts": {
                        "type": "object",
                        "description": "each non-terminal state poll() can return -> its way out",
                        "additionalProperties": {
                            "type": "object",
                            "required": ["way_out", "how", "chain"],
                            "properties": {
                                "way_out": {"enum": [w.value for w in WayOut],
                                            "description": "abort: abort() then poll() ends it; timeout: the clock "
                                                           "does; none: pinned"},
                                "how": {"type": "string"},
                                "chain": {"type": "array", "items": _EVIDENCE,
                                          "description": "why, one link per line (for a pinned state)"},
                            },
                            "additionalProperties": False,
                        },
                    },
                },
            },
        },
        "findings": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["rule", "id", "severity", "message", "path", "line", "backend", "state", "evidence"],
                "properties": {
                    "rule": {"type": "string"},
                    "id": {"type": "string", "pattern": "^KVT[0-9]{3}$"},
                    "severity": {"enum": ["error", "warning", "note"]},
                    "message": {"type": "string"},
                    "path": {"type": "string"},
                    "line": {"type": "integer", "minimum": 1},
                    "backend": {"type": ["string", "null"]},
                    "state": {"type": ["string", "null"]},
                    "queue": {"type": ["string", "null"],
                              "description": "the queue whose drain the finding is about (null: the backends alone)"},
                    "evidence": {"type": "array", "items": _EVIDENCE},
                    "premise": {"type": ["string", "null"],
                                "description": "what the finding rests on (e.g. two requests share a bootstrap_room); "
                                               "such a finding is at most a warning"},
                    "premise_kinds": {"type": "array", "items": {"enum": [k.value for k in PremiseKind]},
                                      "description": "what each part of the premise is about; unseen-caller: it "
                                                     "rests on a caller outside the scanned folder (scanning the "
                                                     "folder that holds it decides the finding)"},
                    "function": {"type": ["string", "null"],
                                 "description": "qualified name of the function path:line is in"},
                    "fingerprint": {"type": "string",
                                    "description": "rule|queue|backend|state|role ('-' for none): what a baseline matches; "
                                                   "never a line or the function the code is in"},
                    "suppressed": {"type": "string", "description": "path:line of the `# kvtrace: ignore` comment"},
                    "baseline": {"enum": ["new", "unchanged"], "description": "compared with --baseline"},
                },
            },
        },
        "problems": _STRINGS,
    },
}

JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://kvtrace.invalid/schema/kvtrace-2.json",
    "title": "kvtrace scan --format json (kvtrace/2)",
    "description": "One document for any number of targets; one report per package scanned.",
    "type": "object",
    "required": ["schema", "kvtrace", "reports"],
    "properties": {
        "schema": {"const": "kvtrace/2"},
        "kvtrace": {"type": "string", "description": "the kvtrace version that wrote it"},
        "reports": {"type": "array", "items": {"$ref": "#/$defs/report"}},
    },
    "additionalProperties": False,
    "$defs": {"report": REPORT_SCHEMA},
}
