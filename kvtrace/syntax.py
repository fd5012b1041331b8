"""One set of syntax helpers for both trees the analysis reads: `ast` (the index, every file)
and libcst (the bodies that are walked). Each helper means the same on either tree, so a
question about names (what `self.kv_mgr.update_status` is, whether an expression reads
`self.<queue>`, which attribute of `self` a target is) is answered in one place."""

from __future__ import annotations

import ast
from functools import lru_cache
from typing import TYPE_CHECKING, Iterator, Sequence, Union

from kvtrace.parse import walk as _ast_walk

if TYPE_CHECKING:
    import libcst as cst

Node = Union[ast.AST, "cst.CSTNode"]


_LIBCST = None


def _cst():
    """libcst, imported on first use: a cached rescan asks only `ast` questions and must not
    pay libcst's import (a libcst node can only exist once libcst is imported anyway)."""
    global _LIBCST
    if _LIBCST is None:
        import libcst

        _LIBCST = libcst
    return _LIBCST


def dotted(node: Node, calls: bool = False) -> str:
    """`self.tree_cache.cache_finished_req` for a Name/Attribute chain, '' when the expression is
    not one. A `super()` receiver is written `super().m`; with `calls`, any other call receiver
    is written too (`self.get().m`, as the index names call sites), else the chain is ''."""
    return _dotted(node, calls) if isinstance(node, ast.AST) else _dotted_cst(node, calls)


@lru_cache(maxsize=8192)
def _dotted_cst(node: "cst.CSTNode", calls: bool) -> str:
    # Keyed by identity (libcst nodes compare by identity; a cached node stays alive, so its id
    # is never reused): the flow engine asks for the same few chains thousands of times.
    return _dotted(node, calls)


def _dotted(node: Node, calls: bool) -> str:
    parts: list[str] = []
    if not isinstance(node, ast.AST):
        cst = _cst()
        while isinstance(node, cst.Attribute):
            parts.append(node.attr.value)
            node = node.value
        name = node.value if isinstance(node, cst.Name) else None
        func = node.func if isinstance(node, cst.Call) else None
    else:
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        name = node.id if isinstance(node, ast.Name) else None
        func = node.func if isinstance(node, ast.Call) else None
    if name is not None:
        parts.append(name)
        return ".".join(reversed(parts))
    if func is None:
        return ""
    inner = dotted(func, calls)
    if inner == "super":
        return ".".join(["super()", *reversed(parts)])
    if calls and inner and parts:
        return f"{inner}()." + ".".join(reversed(parts))
    return ""


def self_attr(node: Node, self_name: str = "self") -> str | None:
    """`X` for `self.X` (the object's own attribute) in either tree, else None."""
    if isinstance(node, ast.AST):
        return node.attr if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id == self_name else None
    cst = _cst()
    if isinstance(node, cst.Attribute):
        return node.attr.value if isinstance(node.value, cst.Name) and node.value.value == self_name else None
    return None


def walk(node: Node, skip: Node | None = None, memo: dict[int, Sequence[cst.CSTNode]] | None = None) -> Iterator[Node]:
    """Every node under `node`, itself included, in either tree (`ast`: breadth first, as
    ast.walk; libcst: depth first in source order). libcst only: `skip` is a node not entered
    (nor anything under it); `memo` keeps each node's child list by id for walks of the same
    tree that follow, since libcst rebuilds the node to list its children."""
    if isinstance(node, ast.AST):
        yield from _ast_walk(node)
        return
    stack = [node]
    while stack:
        current = stack.pop()
        if current is skip:
            continue
        yield current
        if memo is None:
            stack.extend(reversed(current.children))
            continue
        children = memo.get(id(current))
        if children is None:
            children = memo[id(current)] = current.children
        stack.extend(reversed(children))


_NODE_FIELDS: dict[type, tuple[str, ...]] = {}


def cst_descendants(node: "cst.CSTNode") -> Iterator["cst.CSTNode"]:
    """Every libcst node under `node`, itself included, in no set order: read from the node's
    dataclass fields (a field holds the node's children, alone or in a sequence), where
    libcst's visitors and `children` rebuild each node they pass."""
    import dataclasses

    node_type = _cst().CSTNode
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        cls = type(current)
        names = _NODE_FIELDS.get(cls)
        if names is None:
            names = _NODE_FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
        for name in names:
            value = getattr(current, name)
            if isinstance(value, node_type):
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                stack.extend(item for item in value if isinstance(item, node_type))


def mentions_attr(node: Node, attr: str) -> bool:
    """Whether the expression reads `<anything>.<attr>` (a queue named by its attribute)."""
    if isinstance(node, ast.AST):
        return any(isinstance(n, ast.Attribute) and n.attr == attr for n in _ast_walk(node))
    cst = _cst()
    return any(isinstance(n, cst.Attribute) and n.attr.value == attr for n in cst_descendants(node))


def enum_member(node: ast.AST, enum: str) -> str | None:
    """The member `X` of `<enum>.X` or `<module>.<enum>.X`; None for anything else."""
    if isinstance(node, ast.Attribute) and (isinstance(node.value, ast.Name) and node.value.id == enum
                                            or isinstance(node.value, ast.Attribute) and node.value.attr == enum):
        return node.attr
    return None
