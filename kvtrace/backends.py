"""Graph stage for the senders: which poll() each transfer backend really runs (through
inheritance across files), which states it can return, whether it reads the state that abort()
writes, and which timeout checks it passes on the way to returning each state."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from kvtrace.flow import Config, CstBody, Explorer, Frame, PathState, function_body
from kvtrace.index import ClassInfo, FuncRef, Index
from kvtrace.model import Backend, PollRef, TimeoutCheck
from kvtrace.packs import Pack, matches
from kvtrace.states import NONE, OTHER, Domain, Val


@dataclass
class SenderAnalysis:
    backend: Backend
    cls: ClassInfo
    poll: FuncRef | None
    raise_sites: list[tuple[str, int, str]] = field(default_factory=list)  # (path, line, function) poll() raises at


def backend_name(path: str, root: str) -> str:
    """The backend's folder below the package root (`nixl/conn.py` -> `nixl`)."""
    rel = path[len(root) + 1 :] if root and path.startswith(root + "/") else path
    parts = rel.split("/")
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def is_abstract(func: FuncRef) -> bool:
    if any(ast.unparse(d).endswith("abstractmethod") for d in func.node.decorator_list):
        return True
    body = [s for s in func.node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))]
    if not body:
        return True
    if len(body) == 1:
        only = body[0]
        if isinstance(only, ast.Pass) or (isinstance(only, ast.Expr) and isinstance(only.value, ast.Constant) and only.value.value is Ellipsis):
            return True
        if isinstance(only, ast.Raise) and only.exc is not None and "NotImplementedError" in ast.unparse(only.exc):
            return True
    return False


def analyse_backends(index: Index, pack: Pack, domain: Domain, root: str, problems: list[str]) -> list[SenderAnalysis]:
    results = []
    _ASSIGNED.clear()
    senders = [c for c in index.subclasses_of(pack.sender_base) if not matches(c.name, pack.exclude_classes)]
    for cls in senders:
        # An intermediate class that a sender of the same backend builds on is not a backend
        # of its own: the class that extends it is what the backend creates.
        folder = backend_name(cls.path, root)
        if any(other is not cls and backend_name(other.path, root) == folder and cls in index.mro(other)[1:]
               for other in senders):
            continue
        try:
            results.append(analyse_sender(index, pack, domain, cls, root))
        except RecursionError:
            problems.append(f"{cls.name}.{pack.poll_method}() is nested too deeply to analyse ({cls.path}:{cls.line})")
    return results


def analyse_sender(index: Index, pack: Pack, domain: Domain, cls: ClassInfo, root: str) -> SenderAnalysis:
    name = backend_name(cls.path, root)
    poll = index.find_method(cls, pack.poll_method)
    abort = index.find_method(cls, pack.abort_method)
    abort_attrs = _abort_attributes(index, domain, cls, abort) if abort and not is_abstract(abort) else frozenset()
    notes: list[str] = []
    if poll is None or is_abstract(poll):
        notes.append(f"no concrete {pack.poll_method}() in {cls.name} or its bases")
        backend = Backend(name, cls.name, cls.path, cls.line, None, [], False, None, [], notes)
        return SenderAnalysis(backend, cls, None)
    if abort is None or is_abstract(abort):
        notes.append(f"no concrete {pack.abort_method}(): an abort cannot reach poll()")
    cst_func = index.cst(poll)
    inherited = poll.owner.name if poll.owner is not None and poll.owner is not cls else None
    ref = PollRef(poll.path, poll.line, inherited)
    if cst_func is None:
        notes.append("poll() could not be parsed")
        return SenderAnalysis(Backend(name, cls.name, cls.path, cls.line, ref, list(domain.members), False,
                                      None, [], notes), cls, poll)
    config = Config(index, pack, domain, abort_attrs=abort_attrs,
                    attr_values=lambda attr: _attribute_values(index, domain, cls, attr))
    explorer = Explorer(config)
    explorer.stack.append(id(poll.node))
    ends = explorer.run_block(function_body(cst_func.node), [PathState()], Frame(poll, CstBody(cst_func.node, cst_func.line), cls))
    returns: set[str] = set()
    raises = False
    covers: dict[tuple[str, int], set[str]] = {}
    reads_abort = False
    raise_sites: set[tuple[str, int, str]] = set()
    for end in ends:
        if end.term == "raise":
            raises = True
            value: Val = frozenset()
            raise_sites.update((e.path, e.line, e.function) for e in end.events if e.kind == "raise")
        else:
            value = end.ret if end.ret is not None else frozenset({NONE})
        states = domain.states(value)
        returns |= states
        for event in end.events:
            if event.kind == "abort-read":
                reads_abort = True
            if event.kind == "timeout":
                covers.setdefault((event.path, event.line), set()).update(s for s in states if s not in domain.terminal)
    if raises:
        notes.append("poll() can raise")
    if config.truncated:
        notes.append("path limit reached in " + ", ".join(config.truncated))
    order = {m: i for i, m in enumerate(domain.members)}
    timeouts = [TimeoutCheck(p, l, tuple(sorted(c, key=order.get))) for (p, l), c in sorted(covers.items())]
    backend = Backend(
        name=name,
        sender=cls.name,
        path=cls.path,
        line=cls.line,
        poll=ref,
        returns=sorted(returns, key=order.get),
        reads_abort_state=reads_abort,
        abort_state=", ".join(sorted(abort_attrs)) or None,
        timeouts=timeouts,
        notes=notes,
    )
    return SenderAnalysis(backend, cls, poll, sorted(raise_sites))


def _abort_attributes(index: Index, domain: Domain, cls: ClassInfo, abort: FuncRef) -> frozenset[str]:
    """`self.X` attributes that abort() (or a self method it calls) assigns: the abort state.

    Usually one attribute set to the failed member (`self.conclude_state = KVPoll.Failed`), but a
    flag (`self.aborted = True`) that poll() turns into Failed is the same mechanism."""
    attrs: set[str] = set()
    seen: set[int] = set()
    todo = [abort]
    while todo:
        func = todo.pop()
        if id(func.node) in seen:
            continue
        seen.add(id(func.node))
        for node in ast.walk(func.node):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if _self_attr(t):
                        attrs.add(t.attr)
            if isinstance(node, ast.Call) and _self_attr(node.func):
                callee = index.find_method(cls, node.func.attr)
                if callee is not None:
                    todo.append(callee)
    return frozenset(attrs)


_ASSIGNED: dict[int, dict[str, set[str]]] = {}


def _assigned_in_class(cls: ClassInfo, domain: Domain) -> dict[str, set[str]]:
    """self.<attr> -> the values the class's own methods assign to it (one walk per class)."""
    key = id(cls.node)
    if key not in _ASSIGNED:
        table: dict[str, set[str]] = {}
        for func in cls.methods.values():
            for node in ast.walk(func.node):
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    targets = [node.target]
                else:
                    continue
                for t in targets:
                    if _self_attr(t):
                        table.setdefault(t.attr, set()).update(_constant_tokens(node.value, domain))
        _ASSIGNED[key] = table
    return _ASSIGNED[key]


def _attribute_values(index: Index, domain: Domain, cls: ClassInfo, attr: str) -> Val:
    """Every value any method of the class (and its bases) assigns to self.<attr>."""
    values: set[str] = set()
    found = False
    for c in index.mro(cls):
        assigned = _assigned_in_class(c, domain).get(attr)
        if assigned is not None:
            found = True
            values |= assigned
    return frozenset(values) if found else domain.universe


def _constant_tokens(value: ast.AST, domain: Domain) -> set[str]:
    if isinstance(value, ast.Constant):
        if value.value is None:
            return {NONE}
        if isinstance(value.value, bool):
            return {str(value.value)}
        if isinstance(value.value, int):
            member = domain.member_for_int(value.value)
            return {member} if member else {OTHER}
        return {OTHER}
    if _is_member(value, domain):
        return {value.attr}
    return set(domain.universe)


def _self_attr(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _is_member(node: ast.AST, domain: Domain) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in domain.members and (
        isinstance(node.value, ast.Name) and node.value.id == domain.enum
        or isinstance(node.value, ast.Attribute) and node.value.attr == domain.enum)
