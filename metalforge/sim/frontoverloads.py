"""Helper functions overloaded on address spaces only, made distinct for the simulator's build.

Metal picks between ``float get(device float*)`` and ``float get(threadgroup float*)`` by the
argument's address space; in the C++ build both are ``float get(float*)`` (and ``constant`` vs
``device const`` both ``get(const float*)``), so they would be one function: the parser keeps one
definition and every call runs it.  clang in the front-end check (frontcheck.py) resolves each
call as Metal does, so `renames` gives each such overload its own name, ``get__mf_as1``, ... at
its declarations and at every call clang resolved to it.

Member functions overloaded on the address space of ``this`` (``float get() const thread`` and
``float get() const device``) or of a parameter are renamed likewise (in classes that are not
templates).  Only overloads at namespace scope of the user's text (and in its classes) are
renamed, and only when every use of
the name in the user's text is resolved: a call inside a template that depends on a template
parameter is resolved per instantiation, which clang's AST does not show here; such a group is
left as before (one definition kept), with a warning.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_SPACE = re.compile(r"\b__(global|local|private|generic)\b\s*")


@dataclass(frozen=True)
class Rename:
    line: int          # clang's line and (byte) column of the name in the checked text
    column: int
    old: str
    new: str


def _collapsed(arg_types: list[str]) -> tuple[str, ...]:
    """The parameter types as the C++ build sees them (`constant` is `const`, the other
    spaces are nothing)."""
    out = []
    for t in arg_types:
        words = _SPACE.sub("", t.replace("__constant", "const")).split()
        out.append(" ".join(w for k, w in enumerate(words) if k == 0 or w != words[k - 1]))
    return tuple(out)


def _ident(c) -> tuple[int, int]:
    loc = c.canonical.location
    return (loc.line, loc.column)


def _in_file(c, file_name: str) -> bool:
    f = c.location.file
    return f is not None and f.name.endswith(file_name)


def _functions(tu, file_name: str) -> list:
    """The function declarations at namespace scope of the checked file, and the member
    functions of its classes (not templates) there."""
    out, stack = [], [tu.cursor]
    while stack:
        cur = stack.pop()
        for c in cur.get_children():
            if not _in_file(c, file_name):
                continue
            if c.kind.name in ("NAMESPACE", "LINKAGE_SPEC", "STRUCT_DECL", "CLASS_DECL"):
                stack.append(c)
            elif c.kind.name in ("FUNCTION_DECL", "CXX_METHOD"):
                out.append(c)
    return out


def _this_space(c) -> tuple[str, ...]:
    """A member function's qualifiers as the C++ build sees them (``const device`` and
    ``const thread`` are both ``const``); () for a function."""
    if c.kind.name != "CXX_METHOD":
        return ()
    return _collapsed([c.type.spelling.rsplit(")", 1)[-1].strip()])


def _groups(decls: list) -> dict[tuple[int, int], str]:
    """canonical declaration -> its new name, for overloads that coincide in the C++ build."""
    by_key: dict[tuple, dict[tuple[int, int], list]] = {}
    for c in decls:
        key = (c.semantic_parent.spelling, c.spelling,
               _collapsed([a.type.spelling for a in c.get_arguments()]) + _this_space(c))
        by_key.setdefault(key, {}).setdefault(_ident(c), []).append(c)
    names: dict[tuple[int, int], str] = {}
    for (_, name, _), overloads in by_key.items():
        if len(overloads) > 1:
            for k, ident in enumerate(sorted(overloads)):
                names[ident] = f"{name}__mf_as{k}"
    return names


def _uses(tu, file_name: str, names: set[str]):
    """References to `names` in the checked file (resolved or not)."""
    for top in tu.cursor.get_children():
        if not _in_file(top, file_name):
            continue
        for c in top.walk_preorder():
            if c.kind.name in ("DECL_REF_EXPR", "OVERLOADED_DECL_REF", "MEMBER_REF_EXPR") and \
                    c.spelling in names:
                yield c


def renames(tu, file_name: str) -> tuple[list[Rename], list[str]]:
    """The renames that keep address-space overloads apart, and the names of groups left
    collapsed (a use clang did not resolve)."""
    decls = _functions(tu, file_name)
    names = _groups(decls)
    if not names:
        return [], []
    old_names = {n.rsplit("__mf_as", 1)[0] for n in names.values()}
    out: list[Rename] = []
    unresolved: set[str] = set()
    for c in decls:
        if _ident(c) in names:
            out.append(Rename(c.location.line, c.location.column, c.spelling, names[_ident(c)]))
    for c in _uses(tu, file_name, old_names):
        if c.kind.name == "OVERLOADED_DECL_REF":
            unresolved.add(c.spelling)
        elif c.referenced is not None:
            new = names.get(_ident(c.referenced))
            if new:
                out.append(Rename(c.location.line, c.location.column, c.spelling, new))
    return [r for r in out if r.old not in unresolved], sorted(unresolved)
