"""A textual check for explicit casts between address spaces, which Metal rejects.

On the CPU the address-space keywords are macros (include/mf_sim/keywords.h): ``constant`` is
``const`` and the others are empty, so ``constant float*`` and ``device const float*`` are one
C++ type and the C++ compiler cannot tell a cast between them from a cast that only drops
``const``.  Implicit conversions from a ``constant`` pointer to a ``device T*`` already fail
(they drop ``const``), as do ``static_cast``/``reinterpret_cast`` that drop it; what C++ accepts
and Metal does not is an explicit C-style cast or ``const_cast``:

    kernel void k(constant float* c, device float* out, ...) {
      device float* p = (device float*)c;          // Metal: error, C++: fine
      constant float* q = (constant float*)out;    // Metal: error, C++: fine

`cast_errors` finds such casts where the operand is a plain name whose declaration, in the same
function and visible in the text, carries a different address-space keyword (``device``,
``constant``, ``threadgroup``, ``thread``).  It is deliberately narrow, so that it never rejects
valid Metal: an operand that is an expression (``c + 1``, ``&c[i]``, a call), a name declared
without a keyword, or a name that may be declared again in that function (it follows a type-like
token anywhere in the function) is not checked.  What stays accepted is listed in
docs/reference/simulator.md ("Address spaces").
"""
from __future__ import annotations

from ..msl.tokens import LineMap, Token, tokenize

SPACES = ("device", "constant", "threadgroup", "thread")
_CASTS = ("const_cast", "static_cast", "reinterpret_cast")
# tokens after which an identifier cannot be a newly declared name
_NOT_TYPE = {"return", "case", "goto", "sizeof", "alignof", "decltype", "throw", "new", "delete",
             "co_return", "co_yield", "co_await", "else", "do"}
_OPERAND_END = {";", ",", ")", "]", "}", "?", ":", "=", "==", "!=", "<", ">", "<=", ">=", "&&",
                "||", "+", "-", "{"}


def _pointer_type(toks: list[Token], i: int, end: int) -> tuple[str, int] | None:
    """(space, index of the closing token) if toks[i:end] is `space ... *` (a pointer type with
    an address-space keyword first, or after a leading `const`), ending right before `end`."""
    j = i
    if j < end and toks[j].text == "const":
        j += 1
    if j >= end or toks[j].text not in SPACES:
        return None
    space = toks[j].text
    if end - 1 <= j or toks[end - 1].text != "*":
        return None
    if any(t.text in ("(", ")", "[", "]", "{", "}", ";", "&", "&&") for t in toks[j + 1:end]):
        return None
    return space, end


def _declarations(toks: list[Token], a: int, b: int) -> dict[str, tuple[str, int, int]]:
    """name -> (space, index of the keyword, index of the name) for pointer declarations
    `space T* name` in toks[a:b] (the first one of each name)."""
    out: dict[str, tuple[str, int, int]] = {}
    for i in range(a, b):
        if toks[i].text not in SPACES or toks[i].kind != "id":
            continue
        j, seen_star = i + 1, False
        while j < b and (toks[j].kind == "id" or toks[j].text in ("*", "::", "<", ">", ",")):
            if toks[j].text == "*":
                seen_star = True
            if toks[j].text == "," and not _inside_angles(toks, i + 1, j):
                break
            if toks[j].kind == "id" and seen_star and toks[j].text not in ("const", "volatile",
                                                                         "restrict", "__restrict"):
                if j + 1 < b and (toks[j + 1].text in ("=", ";", ",", ")", "[", "{")
                                  or toks[j + 1].kind == "attr"):
                    out.setdefault(toks[j].text, (toks[i].text, i, j))
                break
            j += 1
    return out


def _inside_angles(toks: list[Token], a: int, b: int) -> bool:
    depth = 0
    for t in toks[a:b]:
        if t.text == "<":
            depth += 1
        elif t.text == ">":
            depth -= 1
    return depth > 0


def _maybe_redeclared(toks: list[Token], a: int, b: int, name: str, name_at: int) -> bool:
    """Whether `name` follows a type-like token in toks[a:b] anywhere but at toks[name_at]
    (its declaration): it may then name something else in part of the function."""
    for i in range(max(a, 1), b):
        t = toks[i]
        if t.kind != "id" or t.text != name or i == name_at:
            continue
        prev = toks[i - 1]
        if prev.kind == "id" and prev.text not in _NOT_TYPE:
            return True
        if prev.text in ("*", "&", "&&", ">", "::", ".", "->"):
            return True
    return False


def _functions(toks: list[Token]) -> list[tuple[int, int, int]]:
    """(index of '(' of the parameter list, index of '{', index of matching '}') of every
    function definition: `name ( params ) [qualifiers] {`."""
    out = []
    close_of: dict[int, int] = {}
    stack: list[int] = []
    for i, t in enumerate(toks):
        if t.text in ("(", "{", "["):
            stack.append(i)
        elif t.text in (")", "}", "]") and stack:
            close_of[stack.pop()] = i
    for i, t in enumerate(toks):
        if t.text != "(" or i == 0 or toks[i - 1].kind != "id" or i not in close_of or \
                toks[i - 1].text in ("if", "for", "while", "switch", "catch", "return"):
            continue
        j = close_of[i] + 1
        while j < len(toks) and toks[j].kind == "id" and toks[j].text in (
                "const", "thread", "device", "threadgroup", "constant", "noexcept", "override",
                "final", "volatile"):
            j += 1
        if j < len(toks) and toks[j].text == "{" and j in close_of:
            out.append((i, j, close_of[j]))
    return out


def cast_errors(text: str) -> list[str]:
    """Messages (`file:line: error: ...`) for explicit casts between address spaces in the
    preprocessed `text` that Metal rejects; see the module docstring for what is checked."""
    toks = tokenize(text)
    lines = LineMap(text)
    errors: dict[int, str] = {}
    for p_open, b_open, b_close in _functions(toks):
        decls = _declarations(toks, p_open + 1, b_close)
        if not decls:
            continue
        for i in range(b_open + 1, b_close):
            t = toks[i]
            target = operand = None
            if t.text == "(" and i + 1 < b_close and toks[i + 1].text in SPACES + ("const",):
                k = i + 1
                while k < b_close and toks[k].text != ")":
                    k += 1
                pt = _pointer_type(toks, i + 1, k)
                if pt and k + 1 < b_close and toks[k + 1].kind == "id" and \
                        k + 2 < b_close and toks[k + 2].text in _OPERAND_END:
                    target, operand = pt[0], k + 1
            elif t.text in _CASTS and i + 1 < b_close and toks[i + 1].text == "<":
                depth, k = 0, i + 1
                while k < b_close:
                    depth += {"<": 1, ">": -1}.get(toks[k].text, 0)
                    if depth == 0:
                        break
                    k += 1
                pt = _pointer_type(toks, i + 2, k)
                if pt and k + 3 < b_close and toks[k + 1].text == "(" and \
                        toks[k + 2].kind == "id" and toks[k + 3].text == ")":
                    target, operand = pt[0], k + 2
            if target is None or operand is None:
                continue
            name = toks[operand].text
            if name not in decls:
                continue
            space, decl_at, name_at = decls[name]
            if space == target or _maybe_redeclared(toks, p_open + 1, b_close, name, name_at):
                continue
            f, ln = lines.locate(t.start)
            _, dln = lines.locate(toks[decl_at].start)
            errors.setdefault(
                i,
                f"{f or 'program_source'}:{ln}: error: cast of '{name}', a {space} pointer "
                f"(declared on line {dln}), to a {target} pointer: Metal does not convert "
                f"pointers between address spaces")
    return [errors[k] for k in sorted(errors)]
