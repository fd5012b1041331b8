"""What a scan could not analyse, and why: every file not read or not parsed, every backend not
checked (or checked without one of its files), every part of the analysis that was cut. Any gap
makes the report INCOMPLETE in every format and the exit code 3."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from kvtrace.managers import folder_below
from kvtrace.model import Gap, GapKind, Report, SourceFile

if TYPE_CHECKING:
    from kvtrace.index import ClassInfo, Index

class Cut(str):
    """Where a path exploration stopped following the code, and why: an entry of a run's
    truncations beside the plain `path:line` of a path limit (a `str`, so it travels with them
    through the analysis and its text reads as it is). `kind` is "unmodelled" (a statement kind
    the engine has no handler for) or "budget" (the run's overall work budget was spent)."""

    kind: str
    where: str
    what: str

    def __new__(cls, kind: str, where: str, what: str) -> "Cut":
        made = super().__new__(cls, f"{where} ({what})")
        made.kind, made.where, made.what = kind, where, what
        return made

    def __reduce__(self) -> tuple:  # crosses the scan's fork as itself
        return (Cut, (self.kind, self.where, self.what))

    @classmethod
    def unmodelled(cls, where: str, construct: str) -> "Cut":
        return cls("unmodelled", where, f"{construct} statement not modelled")

    @classmethod
    def budget(cls, where: str, steps: int) -> "Cut":
        return cls("budget", where, f"work budget of {steps} path steps spent")


STATUS_TEXT = {
    "syntax-error": "syntax error",
    "not-utf8": "not UTF-8",
    "too-large": "too large",
    "unreadable": "unreadable",
    "skipped": "skipped",
}


def file_reason(f: SourceFile) -> str:
    status = STATUS_TEXT.get(f.status, f.status)
    if f.error and f.error.startswith(status):  # the error already says it ("not UTF-8 and ...")
        return f.error
    return f"{status}: {f.error}" if f.error else status


def error_line(f: SourceFile) -> int | None:
    """The line a file's error names (kvtrace.parse writes a syntax error as `line N: ...`)."""
    found = re.match(r"line (\d+): ", f.error or "") if f.status == "syntax-error" else None
    return int(found.group(1)) if found else None


def find_gaps(report: Report, enum_path: str | None = None, index: Index | None = None) -> list[Gap]:
    gaps = [Gap(GapKind.FILE, f.path, file_reason(f), line=error_line(f)) for f in report.files if f.status != "ok"]
    checked = {b.name for b in report.backends}
    enum_folder = folder_below(enum_path, report.root) if enum_path else None
    missed: dict[str, list[SourceFile]] = {}
    for f in report.files:
        folder = folder_below(f.path, report.root)
        if f.status != "ok" and folder is not None and folder != enum_folder:
            missed.setdefault(folder, []).append(f)
    for folder, unread in sorted(missed.items()):
        listed = ", ".join(f.path for f in unread)
        if folder in checked:
            gaps.append(Gap(GapKind.BACKEND, folder, f"checked without {listed} (not analysed)", partial=True))
        else:
            gaps.append(Gap(GapKind.BACKEND, folder, f"not checked: {listed} could not be analysed"))
    if index is not None:
        told = {g.subject for g in gaps if g.kind is GapKind.BACKEND} | checked
        gaps.extend(_hidden_by_unread_bases(index, report.root, report.files, told))
    gaps.extend(Gap(GapKind.ANALYSIS, "scan", problem.text, problem=problem.kind) for problem in report.problems)
    return gaps


def _hidden_by_unread_bases(index: Index, root: str, files: list[SourceFile], told: set[str]) -> list[Gap]:
    """Backends whose classes build on a class from a file that could not be analysed: a sender
    is recognised by its ancestry, so one whose base is in an unread file (ascend's sender on
    mooncake's) would otherwise be missing from the report without a word."""
    unread = [f.path for f in files if f.status != "ok"]
    if not unread:
        return []
    found: dict[str, str] = {}
    for cls in sorted((c for infos in index.classes.values() for c in infos), key=lambda c: (c.path, c.line)):
        folder = folder_below(cls.path, root)
        if folder is None or folder in told or folder in found:
            continue
        for ancestor in index.mro(cls):
            missing = [base for base in ancestor.base_names if index.resolve_class(base, near=ancestor.path) is None]
            hidden = next(filter(None, (_unread_source(ancestor, base, unread) for base in missing)), None)
            if hidden is not None:
                base, path = hidden
                found[folder] = (f"not checked: {cls.name} ({cls.path}:{cls.line}) builds on {base} "
                                 f"from {path}, which could not be analysed")
                break
    return [Gap(GapKind.BACKEND, folder, reason) for folder, reason in sorted(found.items())]


def _unread_source(cls: ClassInfo, base: str, unread: list[str]) -> tuple[str, str] | None:
    """(base, the unread file it is imported from) when `cls`'s module imports `base` from one."""
    for stmt in cls.module.tree.body:
        if not isinstance(stmt, ast.ImportFrom):
            continue
        for alias in stmt.names:
            if (alias.asname or alias.name) != base:
                continue
            parts = stmt.module.split(".") if stmt.module else []
            if stmt.level:  # relative: from the importing file's package, up level-1 folders
                package = cls.path.split("/")[:-1]
                parts = package[: len(package) - stmt.level + 1] + parts
            for module in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
                for path in unread:
                    if path == module or module.endswith("/" + path) or path.endswith("/" + module):
                        return base, path
    return None
