"""What a scan could not analyse, and why: every file not read or not parsed, every backend not
checked (or checked without one of its files), every part of the analysis that was cut. Any gap
makes the report INCOMPLETE in every format and the exit code 3."""

from __future__ import annotations

from kvtrace.model import Gap, Report, SourceFile

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


def _folder_below(path: str, root: str) -> str | None:
    """The first folder below the package root that holds `path` (a backend's folder), if any."""
    if root and not path.startswith(root + "/"):
        return None
    parts = (path[len(root) + 1 :] if root else path).split("/")
    return parts[0] if len(parts) > 1 else None


def find_gaps(report: Report, enum_path: str | None = None) -> list[Gap]:
    gaps = [Gap("file", f.path, file_reason(f)) for f in report.files if f.status != "ok"]
    checked = {b.name for b in report.backends}
    enum_folder = _folder_below(enum_path, report.root) if enum_path else None
    missed: dict[str, list[SourceFile]] = {}
    for f in report.files:
        folder = _folder_below(f.path, report.root)
        if f.status != "ok" and folder is not None and folder != enum_folder:
            missed.setdefault(folder, []).append(f)
    for folder, unread in sorted(missed.items()):
        listed = ", ".join(f.path for f in unread)
        if folder in checked:
            gaps.append(Gap("backend", folder, f"checked without {listed} (not analysed)"))
        else:
            gaps.append(Gap("backend", folder, f"not checked: {listed} could not be analysed"))
    gaps.extend(Gap("analysis", "scan", problem) for problem in report.problems)
    return gaps
