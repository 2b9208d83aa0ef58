"""Swizzles for the CUDA shim: ``v.zyx``, ``v.xxyy``, ``c.rgb``, ``c.a`` rewritten into calls.

The CUDA shim's vectors (include/metal_stdlib) are plain structs with members x, y, z, w, so
that NVRTC sees the simplest layout in every generated kernel.  Every other swizzle Metal
accepts is rewritten on tokens, only in sources where a regex finds one (generated kernels use
none, so they pay nothing and their translation does not change):

- a single ``r``/``g``/``b``/``a`` becomes ``x``/``y``/``z``/``w`` (read or written);
- a read of 2-4 components (``.wzx``, ``.xxyy``, ``.bgr``) becomes
  ``.template mf_swzc<0x1320>()`` (the hex digits after the leading 1 are the components: one
  number, since a comma in template arguments would split a macro's argument), a ``const``
  vector (a write through it does not compile);
- a write (``v.wx = ...``, ``v.zy += ...``) becomes ``.template mf_swzc_w<0x130>()``, a proxy
  that writes the components back; repeated components are rejected (Metal: "not
  assignable"), as are mixed spellings (``.xg``: not a swizzle, left alone).

A name declared as a field of a struct in the source (``struct P { float a; };``) is not
rewritten (``p.a`` is that field) unless the front-end check, which knows the types, marked
the access as a vector's swizzle (``c.mf_swz__a`` for ``c.a`` on a ``float4``; the check runs
on every source the cuda backend compiles, when libclang is there).  Swizzles in ``#define``
bodies are rewritten too (the macro's text is what NVRTC expands).  Line numbers are kept
(each rewrite stays on its line).
"""
from __future__ import annotations

import re

from ..msl.tokens import Token, tokenize

_SETS = ("xyzw", "rgba")
_ASSIGN = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=", "++",
                     "--"})
_CANDIDATE = re.compile(r"(?:\.|->)\s*(?:mf_swz__)?(?:[xyzw]{2,4}|[rgba]{1,4})\b")
_CLASS_KEYS = ("struct", "class", "union")
# a swizzle on a vector that the simulator's front-end check marked, its name being also a
# struct field of the source (metalforge/sim/frontcheck.py's SWIZZLE_MARK): always rewritten
MARK = "mf_swz__"


class SwizzleError(ValueError):
    """A swizzle Metal does not accept as written (offset into the text, message)."""

    def __init__(self, offset: int, msg: str):
        super().__init__(msg)
        self.offset = offset


def _indices(name: str) -> list[int] | None:
    """Component indices of swizzle `name` (one spelling), else None; a lone x/y/z/w is a
    real member and not rewritten."""
    if not 1 <= len(name) <= 4 or name in ("x", "y", "z", "w"):
        return None
    for s in _SETS:
        if all(c in s for c in name):
            return [s.index(c) for c in name]
    return None


def _fields(toks: list[Token]) -> set[str]:
    """Names declared as data members of a struct/class/union written in the source."""
    out: set[str] = set()
    stack: list[bool] = []             # per open brace: a class body?
    head: list[str] = []               # tokens since the last ; { }
    for k, t in enumerate(toks):
        if t.text == "{":
            stack.append(any(h in _CLASS_KEYS for h in head) and "(" not in head)
            head = []
        elif t.text == "}":
            if stack:
                stack.pop()
            head = []
        elif t.text == ";":
            head = []
        else:
            head.append(t.text)
            after = toks[k + 1].text if k + 1 < len(toks) else ""
            if stack and stack[-1] and t.kind == "id" and after in (";", ",", "[", "=", ":",
                                                                      "{"):
                out.add(t.text)
    return out


def _written(toks: list[Token], k: int) -> bool:
    after = toks[k + 1].text if k + 1 < len(toks) else ""
    before = toks[k - 3].text if k >= 3 else ""
    return after in _ASSIGN or before in ("++", "--")


def rewrite_swizzles(text: str) -> str:
    """`text` with every swizzle the CUDA vectors lack rewritten (see the module docstring);
    SwizzleError for a write through a repeated component."""
    if not _CANDIDATE.search(text):
        return text
    toks = tokenize(text)
    fields = _fields(toks)
    edits = _edits(toks, fields)
    for toks in _define_bodies(text):
        edits += _edits(toks, fields)
    for a, b, new in sorted(edits, reverse=True):
        text = text[:a] + new + text[b:]
    return text


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+\w+(?:\([^)\n]*\))?", re.M)


def _define_bodies(text: str) -> list[list[Token]]:
    """The tokens (offsets into `text`) of each ``#define`` body (continuation lines
    included), which `tokenize` skips with the directive."""
    out = []
    for m in _DEFINE.finditer(text):
        end = m.end()
        while True:
            nl = text.find("\n", end)
            end = len(text) if nl < 0 else nl
            if nl < 0 or not text[max(m.end(), end - 2):end].rstrip("\r").endswith("\\"):
                break
            end += 1
        body = text[m.end():end]
        out.append([Token(t.kind, t.text, t.start + m.end(), t.end + m.end())
                    for t in tokenize(body)])
    return out


def _edits(toks: list[Token], fields: set[str]) -> list[tuple[int, int, str]]:
    edits: list[tuple[int, int, str]] = []
    for k in range(1, len(toks)):
        t, dot = toks[k], toks[k - 1]
        if t.kind != "id" or dot.text not in (".", "->"):
            continue
        name = t.text[len(MARK):] if t.text.startswith(MARK) else t.text
        if name == t.text and name in fields:
            continue
        idx = _indices(name)
        if idx is None:
            continue
        code = "0x1" + "".join(map(str, idx))       # comma-free: safe in a macro argument
        if len(idx) == 1:
            edits.append((t.start, t.end, "xyzw"[idx[0]]))
        elif not _written(toks, k):
            edits.append((t.start, t.end, f"template mf_swzc<{code}>()"))
        elif len(set(idx)) < len(idx):
            raise SwizzleError(t.start, f"a swizzle with a repeated component is not "
                                        f"assignable ('{name}')")
        else:
            edits.append((t.start, t.end, f"template mf_swzc_w<{code}>()"))
    return edits
