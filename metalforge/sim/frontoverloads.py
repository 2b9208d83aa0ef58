"""Helper functions overloaded on address spaces only, made distinct for the simulator's build.

Metal picks between ``float get(device float*)`` and ``float get(threadgroup float*)`` by the
argument's address space; in the C++ build both are ``float get(float*)`` (and ``constant`` vs
``device const`` both ``get(const float*)``), so they would be one function: the parser keeps one
definition and every call runs it.  clang in the front-end check (frontcheck.py) resolves each
call as Metal does, so each such overload gets its own name, ``get__mf_as1``, ..., at its
declarations and at every call clang resolved to it.

The overloads are found at namespace scope and in classes, class templates and their partial
specializations: functions, function templates, member functions (overloaded on the space of
``this``, ``float get() const device``, or of a parameter) and member templates.  An explicit
specialization (of a function template, or of a member of a class template) takes the name of
the overload it specializes.

A call whose arguments depend on a template parameter is resolved per instantiation, which
libclang's AST does not show.  For those, the check parses the text again with each overload
marked ``__attribute__((diagnose_if(true, "mf_as:<new name>", "error")))`` (`marks`): clang
then reports, at every call in every instantiation it makes (the kernels' and what they call),
which overload it picked (`instantiated_calls`).  A call that picks one overload in every
instantiation is renamed to it; one that picks different overloads in different instantiations
(``template <class P> float f(P p) { return get(p); }`` called with a ``device`` and a
``threadgroup`` pointer) cannot be run: the instantiations are one function in the C++ build,
where address spaces are not types, so the source is refused with a message saying so.
Operators and constructors cannot be renamed and are left alone (a collision there is a C++
error of the build, not a wrong call).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_SPACE = re.compile(r"\b__(global|local|private|generic)\b\s*")
_SCOPES = ("NAMESPACE", "LINKAGE_SPEC", "STRUCT_DECL", "CLASS_DECL", "CLASS_TEMPLATE",
           "CLASS_TEMPLATE_PARTIAL_SPECIALIZATION")
_FUNCTIONS = ("FUNCTION_DECL", "CXX_METHOD", "FUNCTION_TEMPLATE")
_TEMPLATE_PARAMS = ("TEMPLATE_TYPE_PARAMETER", "TEMPLATE_NON_TYPE_PARAMETER",
                    "TEMPLATE_TEMPLATE_PARAMETER")
_USES = ("DECL_REF_EXPR", "OVERLOADED_DECL_REF", "MEMBER_REF_EXPR")
SUFFIX = "__mf_as"
MARK = "mf_as:"


@dataclass(frozen=True)
class Rename:
    line: int          # clang's line and (byte) column of the name in the checked text
    column: int
    old: str
    new: str


@dataclass
class OverloadPlan:
    """What the first parse tells: the new name of each overload (by its declaration's
    position), the renames of declarations and of calls clang resolved, whether some call is
    left to the instantiations, and each new name's Metal signature (for messages)."""
    names: dict[tuple[int, int], str] = field(default_factory=dict)
    decls: list[Rename] = field(default_factory=list)
    uses: list[Rename] = field(default_factory=list)
    pending: bool = False
    signatures: dict[str, str] = field(default_factory=dict)


def _collapsed(arg_types: list[str]) -> tuple[str, ...]:
    """The parameter types as the C++ build sees them (`constant` is `const`, the other
    spaces are nothing)."""
    out = []
    for t in arg_types:
        words = _SPACE.sub("", t.replace("__constant", "const")).split()
        out.append(" ".join(w for k, w in enumerate(words) if k == 0 or w != words[k - 1]))
    return tuple(out)


def _pattern(c):
    """The declaration `c` instantiates or explicitly specializes (a function template, a
    member of a class template), else `c` itself."""
    from clang.cindex import conf
    t = conf.lib.clang_getSpecializedCursorTemplate(c)
    return c if t is None else t


def _ident(c) -> tuple[int, int]:
    loc = _pattern(c.canonical).canonical.location
    return (loc.line, loc.column)


def _in_file(c, file_name: str) -> bool:
    f = c.location.file
    return f is not None and f.name.endswith(file_name)


def _functions(tu, file_name: str) -> list:
    """The function (and function template) declarations at namespace scope of the checked
    file, and those in its classes and class templates."""
    out, stack = [], [tu.cursor]
    while stack:
        cur = stack.pop()
        for c in cur.get_children():
            if not _in_file(c, file_name):
                continue
            if c.kind.name in _SCOPES:
                stack.append(c)
            elif c.kind.name in _FUNCTIONS and _renamable(c):
                out.append(c)
    return out


def _renamable(c) -> bool:
    """Not an operator, constructor or conversion (nor a template of one)."""
    from clang.cindex import CursorKind, conf
    if c.spelling.startswith("operator"):
        return False
    if c.kind.name != "FUNCTION_TEMPLATE":
        return True
    kind = CursorKind.from_id(conf.lib.clang_getTemplateCursorKind(c))
    return kind.name in ("FUNCTION_DECL", "CXX_METHOD")


def _this_space(c) -> tuple[str, ...]:
    """A member function's (or member template's) qualifiers as the C++ build sees them
    (``const device`` and ``const thread`` are both ``const``); () for a function."""
    member = c.kind.name == "CXX_METHOD" or \
        c.kind.name == "FUNCTION_TEMPLATE" and c.semantic_parent.kind.name in _SCOPES[2:]
    return _collapsed([c.type.spelling.rsplit(")", 1)[-1].strip()]) if member else ()


def _key(c) -> tuple:
    """What the C++ build sees of a declaration: its scope, name, template parameters (and a
    template's return type), parameter types and qualifiers, without address spaces."""
    p = _pattern(c)
    params = [a.type.get_canonical().spelling for a in p.get_children()
              if a.kind.name == "PARM_DECL"]
    head = tuple((a.kind.name, a.type.get_canonical().spelling) for a in p.get_children()
                 if a.kind.name in _TEMPLATE_PARAMS)
    if p.kind.name == "FUNCTION_TEMPLATE":      # a template's return type is in its signature
        head += _collapsed([p.result_type.get_canonical().spelling])
    return (p.semantic_parent.get_usr(), p.spelling, head, _collapsed(params) + _this_space(p))


def _groups(decls: list) -> tuple[dict[tuple[int, int], str], dict[str, str]]:
    """canonical declaration -> its new name, for overloads that coincide in the C++ build;
    new name -> the overload's signature as Metal spells it."""
    by_key: dict[tuple, dict[tuple[int, int], list]] = {}
    for c in decls:
        by_key.setdefault(_key(c), {}).setdefault(_ident(c), []).append(c)
    names: dict[tuple[int, int], str] = {}
    signatures: dict[str, str] = {}
    for (_, name, _, _), overloads in by_key.items():
        if len(overloads) > 1:
            for k, ident in enumerate(sorted(overloads)):
                names[ident] = f"{name}{SUFFIX}{k}"
                c = _pattern(overloads[ident][0])
                signatures[names[ident]] = c.displayname + _qualifiers(c)
    return names, signatures


def _qualifiers(c) -> str:
    q = c.type.spelling.rsplit(")", 1)[-1].strip() if c.kind.name == "CXX_METHOD" else ""
    return f" {q}" if q else ""


def _uses(tu, file_name: str, names: set[str]):
    """References to `names` in the checked file (resolved or not)."""
    for top in tu.cursor.get_children():
        if not _in_file(top, file_name):
            continue
        for c in top.walk_preorder():
            if c.kind.name in _USES and c.spelling in names:
                yield c


def plan(tu, file_name: str) -> OverloadPlan:
    """The renames the first parse can tell (see `OverloadPlan`)."""
    decls = _functions(tu, file_name)
    names, signatures = _groups(decls)
    out = OverloadPlan(names=names, signatures=signatures)
    if not names:
        return out
    old_names = {n.rsplit(SUFFIX, 1)[0] for n in names.values()}
    for c in decls:
        if _ident(c) in names:
            out.decls.append(Rename(c.location.line, c.location.column, c.spelling,
                                    names[_ident(c)]))
    for c in _uses(tu, file_name, old_names):
        ref = c.referenced
        if c.kind.name == "OVERLOADED_DECL_REF" or ref is None or \
                ref.kind.name == "FUNCTION_TEMPLATE" and c.kind.name != "DECL_REF_EXPR":
            out.pending = True
        elif _ident(ref) in names:
            out.uses.append(Rename(c.location.line, c.location.column, c.spelling,
                                   names[_ident(ref)]))
    return out


# ------------------------------------------------------------------ calls in instantiations
_QUALIFIER = re.compile(r"\s*(?:(?:const|volatile|device|constant|threadgroup|thread|"
                        r"threadgroup_imageblock|ray_data|object_data)\b|&&|&)")


def mark_offset(text: str, name_end: int) -> int:
    """Where a GNU attribute goes in the declaration whose name ends at `name_end` of `text`:
    after its parameter list and qualifiers (before the body, ``;`` or ``= ...``); -1 when
    the declaration does not read as expected."""
    i = _skip_brackets(text, name_end, "<", ">")
    i = _skip_brackets(text, i, "(", ")")
    if i < 0:
        return -1
    while True:
        m = _QUALIFIER.match(text, i)
        if m:
            i = m.end()
            continue
        m = re.compile(r"\s*noexcept\b").match(text, i)
        if m:
            i = _skip_brackets(text, m.end(), "(", ")")
            continue
        break
    m = re.compile(r"\s*[{;=]").match(text, i)
    return i if m else -1


def _skip_brackets(text: str, i: int, open_: str, close: str) -> int:
    """Past the balanced `open_` ... `close` group at text[i] (after spaces): its end; `i`
    when there is none and the bracket is optional (``<``), -1 when ``(`` is missing."""
    m = re.compile(r"\s*").match(text, i)
    j = m.end() if m else i
    if j >= len(text) or text[j] != open_:
        return i if open_ == "<" else -1
    depth = 0
    for k in range(j, len(text)):
        depth += (text[k] == open_) - (text[k] == close)
        if depth == 0:
            return k + 1
    return -1


# a diagnose_if "error" would abandon the rest of the statement it is in (its other calls);
# warnings are off in the check (-Wno-everything), so this pragma, put first, turns them on
ENABLE = '#pragma clang diagnostic warning "-Wuser-defined-warnings"\n'


def mark(new: str) -> str:
    return f' __attribute__((diagnose_if(true, "{MARK}{new}", "warning")))'


@dataclass(frozen=True)
class ResolvedCall:
    """One call clang made in the marked parse: where (line, column), to which overload, in
    which instantiation (Metal's spelling is left to the caller)."""
    line: int
    column: int
    new: str
    instantiation: str


def instantiated_calls(tu) -> tuple[list[ResolvedCall], list[str]]:
    """The calls to marked overloads clang reports, and its other errors (spellings).  clang
    names an instantiation once, at the first diagnostic made in it: the later ones (without
    that note) belong to the same one."""
    calls, other, inst = [], [], ""
    for d in tu.diagnostics:
        if not d.spelling.startswith(MARK):
            if d.severity >= 3:
                other.append(d.spelling)
            continue
        notes = [n.spelling for n in d.children if n.spelling.startswith("in instantiation")]
        if notes:
            quoted = re.findall(r"'([^']*)'", notes[0])
            inst = quoted[0] if quoted else ""
        calls.append(ResolvedCall(d.location.line, d.location.column, d.spelling[len(MARK):], inst))
    return calls, other
