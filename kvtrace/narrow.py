"""`--backend NAME`: keep only the rows of the backends a host runs. The complement of
`--ignore-backend`, applied to the finished report (the analysis is the whole tree's either way:
a verdict never depends on which rows are shown): the other backends, their findings and their
gaps are left out and named in the report's filters, as `--ignore-backend` names them."""

from __future__ import annotations

from dataclasses import replace

from kvtrace.errors import InputError
from kvtrace.model import Report


def keep_backends(report: Report, wanted: tuple[str, ...]) -> None:
    names = {b.name for b in report.backends} | {g.subject for g in report.gaps if g.kind == "backend"}
    missing = [name for name in wanted if name not in names]
    ignored = [name for name in missing if name in report.filters.ignored_backends]
    if ignored:  # in the tree, but the other option took it out first
        raise InputError(f"{report.target}: --backend {', '.join(ignored)}: removed by --ignore-backend (or ignore-backends in "
                         "the config): the two options name the same backend, so no row would be left")
    if missing:
        # Unlike a name to leave out, a name to keep that the tree lacks would leave no row:
        # a gate that looks at nothing. Refused, naming what there is.
        raise InputError(f"{report.target}: --backend {', '.join(missing)}: no such backend in this tree "
                         f"(its backends: {', '.join(sorted(names)) or 'none'})")
    dropped = sorted(names - set(wanted))
    report.backends = [b for b in report.backends if b.name in wanted]
    report.findings = [f for f in report.findings if f.backend is None or f.backend in wanted]
    report.gaps = [g for g in report.gaps if g.kind != "backend" or g.subject in wanted]
    report.filters = replace(report.filters, ignored_backends=tuple(sorted(set(report.filters.ignored_backends)
                                                                            | set(dropped))))
