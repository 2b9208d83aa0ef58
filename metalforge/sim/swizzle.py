"""Swizzles with a repeated component (``v.xxyy``, ``v.rrg``): rewritten into a member call.

Metal accepts them as values and rejects them as assignment targets.  Declaring each of them
as a union member of every vector (hundreds of members) made every kernel's compile about a
quarter slower, so instead the simulator rewrites the text, and only sources that use one pay:
``.xxyy`` after an expression becomes ``.template mf_swz<0,0,1,1>()`` (a member template of
every vector and swizzle proxy, include/mf_sim/vec.h) which returns a ``const`` vector, so a
write through it does not compile.  A write that the tokens show directly (``v.xx = ...``,
``v.xx += ...``, ``v.xx++``, ``++v.xx``) is reported here with Metal's wording.  The rewrite
works on tokens (no strings, comments or numbers are touched) and keeps every newline, so line
numbers in messages stay the user's.  A name that the source also uses on its own (a struct
field ``xx``, declared as ``float xx;``) is left alone: ``s.xx`` is then that field.
"""
from __future__ import annotations

import re

from ..msl.tokens import tokenize

_SETS = ("xyzw", "rgba")
_ASSIGN = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=", "++",
                     "--"})
# cheap pre-check, so that sources without such a swizzle are never tokenized again
_CANDIDATE = re.compile(r"(?:\.|->)\s*([xyzw]{2,4}|[rgba]{2,4})\b")


def _indices(name: str) -> list[int] | None:
    """Component indices of `name` when it is a swizzle with a repeated component, else None."""
    if not 2 <= len(name) <= 4:
        return None
    for s in _SETS:
        if all(c in s for c in name):
            idx = [s.index(c) for c in name]
            return idx if len(set(idx)) < len(idx) else None
    return None


def _has_candidate(text: str) -> bool:
    return any(_indices(m.group(1)) for m in _CANDIDATE.finditer(text))


def rewrite_repeated_swizzles(text: str) -> tuple[str, list[tuple[int, str]]]:
    """`text` with each repeated-component swizzle turned into a ``mf_swz`` call, and the
    errors found: (offset, message) for each one written to."""
    if not _has_candidate(text):
        return text, []
    toks = tokenize(text)
    # a name declared in the source (a struct field `xx`, a variable `rr`) is not a swizzle
    declared = {t.text for k, t in enumerate(toks)
                if t.kind == "id" and not (k and toks[k - 1].text in (".", "->"))}
    edits: list[tuple[int, int, str]] = []
    errors: list[tuple[int, str]] = []
    for k in range(1, len(toks)):
        t, dot = toks[k], toks[k - 1]
        if t.kind != "id" or dot.kind != "punct" or dot.text not in (".", "->"):
            continue
        idx = _indices(t.text)
        if idx is None or t.text in declared:
            continue
        after = toks[k + 1].text if k + 1 < len(toks) else ""
        before = toks[k - 3].text if k >= 3 else ""
        if after in _ASSIGN or before in ("++", "--"):
            errors.append((t.start, f"a swizzle with a repeated component is not assignable "
                                    f"('{t.text}')"))
            continue
        edits.append((t.start, t.end, f"template mf_swz<{','.join(map(str, idx))}>()"))
    for a, b, new in reversed(edits):
        text = text[:a] + new + text[b:]
    return text, errors
