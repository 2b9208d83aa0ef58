"""Kernel signatures from MSL text, as plain Python data.

The parser reads the *preprocessed* source (macros expanded, ``#include <c10/...>``
inlined, line markers kept) and finds:

- kernel definitions: ``kernel void f(...) {...}`` and ``[[kernel]] void f(...)``, plain or
  templated (``template <typename T, int N> kernel void f(...)``);
- host-visible instantiations of templated kernels, in the three forms MSL code uses::

      template [[host_name("f_float")]] kernel void f<float>(device float* x, uint i);
      template [[host_name("f_float")]] kernel void f(device float* x, uint i);   // deduced
      template [[host_name("f_float")]] [[kernel]] decltype(f<float>) f<float>;   // MLX

- each parameter's role: a buffer (``[[buffer(n)]]`` or the implicit index), a thread-position
  attribute, or something the simulator cannot bind (textures, samplers, ``[[threadgroup(n)]]``).

It reads real-world top-level C++ (``static_assert`` and brace initialisers inside parentheses,
``constexpr`` functions, nested templates, default template arguments, ``<`` comparisons in
template arguments) and records what the rewrite pass needs: attribute spans, ``threadgroup``
declarations, the instantiation statements, function constants (`FunctionConstant`), and the
definitions that differ only in an address space and so coincide on the CPU (blanked, see
`_Walker._drop_space_overloads`).  Errors carry the user's ``file:line``. Nothing here knows about the CPU: the same data drives the CUDA
trampolines (see metalforge/sim/trampoline.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import MetalforgeError

# Thread-position attributes a kernel parameter may carry (MSL spec, "Kernel function input
# attributes").  thread_execution_width is the older spelling of threads_per_simdgroup.
POSITION_ATTRS = frozenset({
    "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
    "threads_per_threadgroup", "threadgroups_per_grid", "threads_per_grid",
    "dispatch_threads_per_threadgroup", "grid_origin", "grid_size", "thread_index_in_threadgroup",
    "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup", "threads_per_simdgroup",
    "simdgroups_per_threadgroup", "dispatch_simdgroups_per_threadgroup", "thread_execution_width",
    "thread_index_in_quadgroup", "quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup",
    "dispatch_quadgroups_per_threadgroup",
})

# C++ attributes that stay in the text; every other [[...]] is Metal's and is blanked.
STANDARD_ATTRS = frozenset({"maybe_unused", "likely", "unlikely", "fallthrough", "nodiscard",
                            "noreturn", "deprecated", "carries_dependency", "no_unique_address"})

ADDRESS_SPACES = ("device", "constant", "threadgroup", "thread", "threadgroup_imageblock",
                  "ray_data", "object_data")


class ParseError(MetalforgeError):
    """The source has a kernel the simulator cannot run (message says why and where).

    ``offset`` (into the preprocessed text) is set when the message has no location yet;
    `parse` turns it into the user's ``file:line``."""

    def __init__(self, msg: str, offset: int | None = None):
        super().__init__(msg)
        self.offset = offset


@dataclass
class Token:
    kind: str   # 'id', 'num', 'str', 'punct', 'attr'
    text: str
    start: int
    end: int


@dataclass
class SignatureParam:
    index: int                 # position in the parameter list
    text: str                  # the declaration, attributes removed
    name: str
    type_text: str             # declared type (may mention template parameters)
    role: str                  # 'buffer' or 'position'
    attr: str = ""             # position attribute name, e.g. 'thread_position_in_grid'
    buffer_index: int = -1
    address_space: str = ""    # device / constant / thread / '' (by value)
    is_pointer: bool = False
    is_reference: bool = False
    is_const: bool = False
    elem_type: str = ""        # pointee / referee / value type, qualifiers removed
    # [[function_constant(name)]]: the parameter exists only when that bool constant is true
    function_constant: str = ""
    function_constant_index: int = -1


@dataclass
class Signature:
    """One host-visible kernel: its name, C++ function, template arguments and parameters."""
    host_name: str
    func_name: str             # qualified C++ name of the function (template name for templates)
    template_args: str | None  # "float, 4" for explicit instantiations, None otherwise
    fn_params: str | None      # concrete parameter list for the deduced instantiation form
    params: list[SignatureParam]
    line: int                  # line of the definition in the user's source
    max_total_threads: int     # [[max_total_threads_per_threadgroup(N)]] or 1024
    threadgroup_bytes: int | None  # static threadgroup memory, None when not computable


Kernel = Signature   # the earlier name, kept for code that imports it


@dataclass
class TgDecl:
    start: int                 # offset of the `threadgroup` keyword
    end: int
    type_text: str
    dims: list[str]
    names: list[str] = field(default_factory=list)   # the declared names (ParsedSource.tg_decls)
    stmt_end: int = 0          # offset just past the declaration's ';' (ParsedSource.tg_decls)


@dataclass
class FunctionConstant:
    """A program-scope ``constant T name [[function_constant(index)]];`` declaration."""
    name: str
    type_text: str
    index: int
    start: int                 # offsets of the declaration, through its ';'
    end: int
    line: int = 0


@dataclass
class ParsedSource:
    kernels: list[Signature]
    blank_spans: list[tuple[int, int]] = field(default_factory=list)     # attributes, instantiations
    tg_decls: list[TgDecl] = field(default_factory=list)
    function_constants: list[FunctionConstant] = field(default_factory=list)


# ------------------------------------------------------------------------------------ tokens
_ID = re.compile(r"[A-Za-z_]\w*")
_NUM = re.compile(r"\.?\d(?:[\w.]|[eEpP][+-])*")
_PUNCT3 = ("<<=", ">>=", "...", "->*")
_PUNCT2 = ("::", "->", "++", "--", "<<", "<=", ">=", "==", "!=", "&&", "||", "+=", "-=", "*=",
           "/=", "%=", "&=", "|=", "^=", ".*")


def tokenize(text: str) -> list[Token]:
    """Tokens of preprocessed C++ (line markers and other # lines are skipped)."""
    toks: list[Token] = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        j, line_start = _skip(text, i, line_start)
        if j == i:
            toks.append(_token_at(text, i))
            j = toks[-1].end
        i = j
    return toks


def _skip(text: str, i: int, line_start: bool) -> tuple[int, bool]:
    """Past the whitespace, comment or # line at text[i] (i itself when a token starts there),
    and whether the next character starts a line."""
    c = text[i]
    if c == "\n":
        return i + 1, True
    if c in " \t\r\f\v":
        return i + 1, line_start
    if c == "#" and line_start:
        return _line_end(text, i), True
    if text.startswith("//", i):
        return _line_end(text, i), False
    if text.startswith("/*", i):
        j = text.find("*/", i + 2)
        return (len(text) if j < 0 else j + 2), False
    return i, False


def _line_end(text: str, i: int) -> int:
    j = text.find("\n", i)
    return len(text) if j < 0 else j


def _token_at(text: str, i: int) -> Token:
    """The token starting at text[i]."""
    c = text[i]
    if c == '"' or c == "'":
        return _quoted_at(text, i)
    if text.startswith("[[", i):
        return _attribute_at(text, i)
    for kind, pattern in (("id", _ID), ("num", _NUM)):
        m = pattern.match(text, i)
        if m:
            return Token(kind, m.group(), i, m.end())
    for p in _PUNCT3 + _PUNCT2:
        if text.startswith(p, i):
            return Token("punct", p, i, i + len(p))
    return Token("punct", c, i, i + 1)


def _quoted_at(text: str, i: int) -> Token:
    """A string or character literal."""
    j, n = i + 1, len(text)
    while j < n and text[j] != text[i]:
        j += 2 if text[j] == "\\" else 1
    return Token("str", text[i:j + 1], i, j + 1)


def _attribute_at(text: str, i: int) -> Token:
    """An attribute ``[[...]]`` (nested brackets included), as its inner text."""
    depth, j, n = 0, i, len(text)
    while j < n:
        if text[j] == "[":
            depth += 1
        elif text[j] == "]":
            depth -= 1
            if depth == 0:
                break
        j += 1
    return Token("attr", text[i + 2:j - 1].strip(), i, j + 1)


def _match(toks: list[Token], i: int, open_: str, close: str) -> int:
    """Index of the token closing the bracket opened at toks[i]."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text
        if toks[j].kind != "punct":
            continue
        if t == open_:
            depth += 1
        elif t == close:
            depth -= 1
            if depth == 0:
                return j
    raise ParseError(f"unbalanced '{open_}': no matching '{close}'", toks[i].start if i < len(toks)
                     else None)


def _after_templates(head: list[Token]) -> int:
    """Index of the first token of a declaration after its `template <...>` headers."""
    k = 0
    while k + 1 < len(head) and head[k].text == "template" and head[k + 1].text == "<":
        k = _match_angle(head, k + 1) + 1
    return k


def _match_angle(toks: list[Token], i: int) -> int:
    """Index of the '>' closing the template bracket opened at toks[i]."""
    depth = 0
    j = i
    while j < len(toks):
        t = toks[j].text
        if t in ("(", "["):
            j = _match(toks, j, t, ")" if t == "(" else "]") + 1
            continue
        if t == "<" and _is_less_than(toks, j):
            j += 1
            continue
        if t == "<":
            depth += 1
        elif t == ">":
            depth -= 1
        elif t == ">>":
            depth -= 2
        if depth <= 0 and t in (">", ">>"):
            return j
        j += 1
    raise ParseError("unbalanced '<' in a template", toks[i].start if i < len(toks) else None)


def _name_before(toks: list[Token], idx: int) -> str:
    """The (possibly qualified) name that ends just before toks[idx]."""
    parts: list[str] = []
    j = idx - 1
    while j >= 0 and toks[j].kind == "id":
        parts.insert(0, toks[j].text)
        j -= 1
        if j >= 0 and toks[j].text == "::":
            parts.insert(0, "::")
            j -= 1
            continue
        break
    return "".join(parts)


# Address spaces that are the same ordinary memory on the CPU (`constant` is `const`, so it stays
# a distinct overload).
_CPU_SAME_SPACES = frozenset(ADDRESS_SPACES) - {"constant"}
_MEMBER_QUALS = frozenset(ADDRESS_SPACES) | {"const", "volatile", "noexcept", "override", "final"}


def _top_level(toks: list[Token]) -> list[str]:
    """Texts of the tokens outside (), [] and {} brackets."""
    out, depth = [], 0
    for t in toks:
        if t.kind == "punct" and t.text in "([{":
            depth += 1
        elif t.kind == "punct" and t.text in ")]}":
            depth -= 1
        elif depth == 0:
            out.append(t.text)
    return out


def _is_less_than(toks: list[Token], j: int) -> bool:
    """Whether the '<' at toks[j] compares (`sizeof(T) < 8`, `4 < N`) rather than opening
    template arguments: a template name is never a literal or a closing parenthesis."""
    return j > 0 and (toks[j - 1].kind == "num" or toks[j - 1].text == ")")


def _split_commas(toks: list[Token]) -> list[list[Token]]:
    parts: list[list[Token]] = [[]]
    depth = 0
    for j, t in enumerate(toks):
        if t.kind == "punct" and t.text == "<" and _is_less_than(toks, j):
            pass
        elif t.kind == "punct" and t.text in "([{<":
            depth += 1
        elif t.kind == "punct" and t.text in ")]}>":
            depth -= 1
        elif t.kind == "punct" and t.text == ">>":
            depth -= 2
        if t.kind == "punct" and t.text == "," and depth == 0:
            parts.append([])
            continue
        parts[-1].append(t)
    return [p for p in parts if p]


# ------------------------------------------------------------------------------------ lines
_LINEMARK = re.compile(r'^#\s*(?:line\s+)?(\d+)\s+"([^"]*)"', re.M)


class LineMap:
    """Maps offsets in preprocessed text back to (file, line) via its line markers."""

    def __init__(self, text: str):
        self.marks: list[tuple[int, int, str]] = []   # (offset of next line, line no, file)
        for m in _LINEMARK.finditer(text):
            nl = text.find("\n", m.end())
            self.marks.append((len(text) if nl < 0 else nl + 1, int(m.group(1)), m.group(2)))
        self.text = text

    def locate(self, off: int) -> tuple[str, int]:
        best = None
        for mark in self.marks:
            if mark[0] <= off:
                best = mark
            else:
                break
        if best is None:
            return "", self.text.count("\n", 0, off) + 1
        return best[2], best[1] + self.text.count("\n", best[0], off)


# ------------------------------------------------------------------------------------ params
def _attr_name(a: str) -> tuple[str, str]:
    m = re.match(r"\s*(\w+)\s*(?:\((.*)\))?\s*$", a, re.S)
    return (m.group(1), (m.group(2) or "").strip()) if m else (a, "")


def _attr_list(text: str) -> list[tuple[str, str]]:
    """(name, argument) of each attribute in one ``[[a(x), b]]``."""
    parts, depth, cur = [], 0, ""
    for c in text:
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [_attr_name(x) for x in parts if x.strip()]


def _parse_param(ptoks: list[Token], text: str, index: int, where: str) -> SignatureParam:
    attrs = [t for t in ptoks if t.kind == "attr"]
    body = [t for t in ptoks if t.kind != "attr"]
    name, type_toks = _param_name(body)
    p = SignatureParam(index=index, text=" ".join(t.text for t in body), name=name or f"arg{index}",
              type_text=_type_text([t.text for t in type_toks]), role="buffer")
    _describe_type(p, [t.text for t in type_toks])
    for an, arg in (x for a in attrs for x in _attr_list(a.text)):
        _apply_param_attr(p, an, arg, where)
    return p


def _param_name(body: list[Token]) -> tuple[str, list[Token]]:
    """The declared name (the last identifier outside array brackets; "" when the declaration
    has none) and the tokens of the type without it."""
    name_i = None
    depth = 0
    for k in range(len(body) - 1, -1, -1):
        t = body[k]
        if t.text == "]":
            depth += 1
        elif t.text == "[":
            depth -= 1
        elif depth == 0 and t.kind == "id":
            name_i = k
            break
    if name_i is not None and name_i > 0 and body[name_i - 1].text not in ("::",) and \
            body[name_i].text not in ("int", "uint", "float", "half", "bool"):
        return body[name_i].text, body[:name_i] + body[name_i + 1:]
    return "", body


def _type_text(words: list[str]) -> str:
    return " ".join(words).replace(" :: ", "::").replace(" < ", "<").replace(" >", ">") \
        .replace(" ,", ",")


def _describe_type(p: SignatureParam, words: list[str]) -> None:
    """Pointer, reference, const, address space and element type of `p` from its type's words."""
    p.is_pointer = "*" in words
    p.is_reference = "&" in words or "&&" in words
    p.is_const = "const" in words
    for a in ADDRESS_SPACES:
        if a in words:
            p.address_space = a
            break
    p.elem_type = _type_text([w for w in words if w not in ADDRESS_SPACES and w not in
                              ("const", "volatile", "*", "&", "&&", "restrict", "__restrict",
                               "__restrict__")])


def _apply_param_attr(p: SignatureParam, an: str, arg: str, where: str) -> None:
    """Record attribute `an`(`arg`) of parameter `p`, or reject one the simulator cannot bind."""
    if an == "function_constant":
        p.function_constant = arg
    elif an in POSITION_ATTRS:
        p.role = "position"
        p.attr = "threads_per_grid" if an == "grid_size" else an
    elif an == "buffer":
        try:
            p.buffer_index = int(arg, 0)
        except ValueError:
            raise ParseError(f"{where}: parameter '{p.name}': [[buffer({arg})]] must be an "
                             f"integer literal") from None
    elif an == "threadgroup":
        raise ParseError(
            f"{where}: parameter '{p.name}' uses [[threadgroup({arg})]] (dynamic threadgroup "
            f"memory); torch.mps.compile_shader cannot bind it either. Declare a "
            f"`threadgroup T name[N];` array inside the kernel instead")
    elif an in ("texture", "sampler", "stage_in", "visible_function_table",
                "intersection_function_table", "instance_acceleration_structure"):
        raise ParseError(f"{where}: parameter '{p.name}' uses [[{an}]], which the simulator "
                         f"(and torch.mps.compile_shader) cannot bind")


def _parse_params(toks: list[Token], text: str, where: str) -> list[SignatureParam]:
    parts = _split_commas(toks)
    if len(parts) == 1 and len(parts[0]) == 1 and parts[0][0].text == "void":
        return []
    return [_parse_param(pt, text, i, where) for i, pt in enumerate(parts)]


def assign_buffer_indices(params: list[SignatureParam], where: str) -> None:
    """Implicit [[buffer(n)]] indices: the lowest unused index, in declaration order."""
    used = {p.buffer_index for p in params if p.role == "buffer" and p.buffer_index >= 0}
    nxt = 0
    for p in params:
        if p.role != "buffer" or p.buffer_index >= 0:
            continue
        while nxt in used:
            nxt += 1
        p.buffer_index = nxt
        used.add(nxt)
    seen: dict[int, str] = {}
    for p in params:
        if p.role == "buffer":
            if p.buffer_index in seen:
                raise ParseError(f"{where}: parameters '{seen[p.buffer_index]}' and '{p.name}' "
                                 f"both use buffer({p.buffer_index})")
            seen[p.buffer_index] = p.name


# ------------------------------------------------------------------------------------ sizes
_SCALAR_SIZES = {
    "bool": 1, "char": 1, "uchar": 1, "int8_t": 1, "uint8_t": 1, "short": 2, "ushort": 2,
    "int16_t": 2, "uint16_t": 2, "half": 2, "bfloat": 2, "int": 4, "uint": 4, "int32_t": 4,
    "uint32_t": 4, "float": 4, "long": 8, "ulong": 8, "int64_t": 8, "uint64_t": 8, "size_t": 8,
    "unsigned": 4, "signed": 4, "double": 8,
}
_FLOAT_SCALARS = {"half", "bfloat", "float", "double"}


def scalar_of(type_name: str) -> tuple[str, int, int] | None:
    """(scalar, components, byte size) of a Metal scalar/vector/packed type name, else None."""
    t = re.sub(r"^(?:::)?metal::", "", type_name.strip())
    t = {"unsigned int": "uint", "unsigned short": "ushort", "unsigned char": "uchar",
         "unsigned long": "ulong", "signed char": "char", "long long": "long",
         "unsigned long long": "ulong"}.get(t, t)
    if t in _SCALAR_SIZES:
        return t, 1, _SCALAR_SIZES[t]
    m = re.fullmatch(r"(packed_)?([a-z]+?)([234])?", t)
    if m and m.group(2) in _SCALAR_SIZES:
        s, n = m.group(2), int(m.group(3) or 1)
        sz = _SCALAR_SIZES[s]
        if n == 1:
            return s, 1, sz
        # a 3-vector occupies four elements unless packed (MSL spec, "Vector data types")
        return s, n, sz * (n if (m.group(1) or n != 3) else 4)
    m = re.fullmatch(r"(?:metal::)?atomic_(int|uint|float|bool|ulong|long)", t)
    if m:
        return m.group(1), 1, _SCALAR_SIZES[m.group(1)]
    m = re.fullmatch(r"vec<\s*(\w+)\s*,\s*([234])\s*>", t)
    if m and m.group(1) in _SCALAR_SIZES:
        n = int(m.group(2))
        return m.group(1), n, _SCALAR_SIZES[m.group(1)] * (4 if n == 3 else n)
    return None


def is_float_scalar(s: str) -> bool:
    return s in _FLOAT_SCALARS


def eval_int(expr: str, names: dict[str, str]) -> int | None:
    """Evaluate a small integer constant expression, resolving identifiers through `names`."""
    seen = 0
    while True:
        seen += 1
        if seen > 20:
            return None
        changed = False

        def sub(m: re.Match) -> str:
            nonlocal changed
            w = m.group()
            if w in names:
                changed = True
                return f"({names[w]})"
            return w
        expr = re.sub(r"(?<![\w.])[A-Za-z_]\w*(?:::\w+)*", sub, expr)
        if not changed:
            break
    expr = re.sub(r"(?<=\d)[uUlL]+\b", "", expr)
    if not re.fullmatch(r"[\d\s+\-*/%()<>]*", expr) or not expr.strip():
        return None
    try:
        v = eval(expr.replace("/", "//"), {"__builtins__": {}}, {})  # digits and operators only
    except Exception:
        return None
    return int(v) if isinstance(v, int) else None


def type_size(type_text: str, names: dict[str, str]) -> int | None:
    t = type_text.strip()
    for w, v in names.items():
        t = re.sub(rf"(?<![\w:]){re.escape(w)}(?!\w)", v, t)
    sc = scalar_of(t)
    if sc:
        return sc[2]
    m = re.fullmatch(r"(?:::)?(?:metal::)?array<\s*(.+)\s*,\s*([^,<>]+)>", t)
    if m:
        inner, n = type_size(m.group(1), names), eval_int(m.group(2), names)
        return inner * n if inner is not None and n is not None else None
    return None


# ------------------------------------------------------------------------------------ walker
@dataclass
class _FuncDef:
    name: str
    qual: str
    tparams: list[tuple[str, str | None]]    # (name, default text)
    param_toks: list[Token]
    is_kernel: bool
    attrs: list[str]
    body: tuple[int, int]                     # token index range of the body
    offset: int
    tg: list[TgDecl]


def _template_params(toks: list[Token]) -> list[tuple[str, str | None]]:
    out = []
    for part in _split_commas(toks):
        dflt = None
        for k, t in enumerate(part):
            if t.text == "=":
                dflt = " ".join(x.text for x in part[k + 1:])
                part = part[:k]
                break
        ids = [t.text for t in part if t.kind == "id"]
        if ids:
            out.append((ids[-1], dflt))
    return out


def _space_overload_key(head: list[Token], ns: list[str]) -> tuple[str, str]:
    """What declarations that differ only in an address space share (the words of `head`
    without attributes and CPU-equivalent space keywords, in namespace `ns`), and the space
    keyword it names ("" for none or `thread`)."""
    key = " ".join(ns + [t.text for t in head if t.kind != "attr" and
                         (t.kind != "id" or t.text not in _CPU_SAME_SPACES)])
    space = next((t.text for t in head if t.kind == "id" and
                  t.text in _CPU_SAME_SPACES - {"thread"}), "")
    return key, space


class _Walker:
    def __init__(self, text: str):
        self.text = text
        self.toks = tokenize(text)
        self.funcs: list[_FuncDef] = []
        self.insts: list[dict] = []
        self.blank: list[tuple[int, int]] = []
        self.tg: list[TgDecl] = []
        self.consts: dict[str, str] = {}
        self.fcs: list[FunctionConstant] = []
        self.overloads: dict[str, list[tuple[str, int, int]]] = {}

    def run(self) -> None:
        toks = self.toks
        for t in toks:
            if t.kind == "attr":
                name, _ = _attr_name(t.text)
                if name not in STANDARD_ATTRS:
                    self.blank.append((t.start, t.end))
        self._scope(0, len(toks), [])
        self._drop_space_overloads(self.overloads)

    def _drop_space_overloads(self, groups: dict[str, list[tuple[str, int, int]]]) -> None:
        for group in groups.values():
            keep = next((m for m in group if m[0] in ("", "thread")), group[0])
            for m in group:
                if m is not keep:
                    self.blank.append((self.toks[m[1]].start, self.toks[m[2]].end))

    def _scope(self, i: int, end: int, ns: list[str]) -> None:
        toks = self.toks
        stmt_start = i
        while i < end:
            t = toks[i]
            after = self._nested_scope(i, end, ns)
            if after is not None:
                i = stmt_start = after
            elif t.text == "(" and t.kind == "punct":
                # a parenthesised part of a declaration (parameter list, static_assert or
                # initialiser argument): braces inside it are never a function body
                i = _match(toks, i, "(", ")") + 1
            elif t.text == ";":
                self._statement(stmt_start, i, None, ns)
                i = stmt_start = i + 1
            elif t.text == "{":
                i, ended = self._braces(stmt_start, i, ns)
                if ended:
                    stmt_start = i
            else:
                i += 1

    def _nested_scope(self, i: int, end: int, ns: list[str]) -> int | None:
        """Walk the block of `namespace a::b {` or `extern "C" {` starting at toks[i]; the index
        after its '}', or None when toks[i] starts no such block."""
        toks = self.toks
        t = toks[i]
        if t.text == "namespace" and t.kind == "id":
            j = i + 1
            names = []
            while j < end and toks[j].text not in ("{", ";", "="):
                if toks[j].kind == "id":
                    names.append(toks[j].text)
                j += 1
            if j < end and toks[j].text == "{":
                close = _match(toks, j, "{", "}")
                self._scope(j + 1, close, ns + names)
                return close + 1
        if t.text == "extern" and i + 2 < end and toks[i + 1].kind == "str" and \
                toks[i + 2].text == "{":
            close = _match(toks, i + 2, "{", "}")
            self._scope(i + 3, close, ns)
            return close + 1
        return None

    def _braces(self, stmt_start: int, i: int, ns: list[str]) -> tuple[int, bool]:
        """The '{' at toks[i], in the statement from stmt_start: a function body (the statement
        ends with it), a class body or an initialiser (the statement goes on to ';').  Returns
        the index after the matching '}' and whether the statement ended."""
        toks = self.toks
        close = _match(toks, i, "{", "}")
        head = toks[stmt_start:i]
        words = [x.text for x in head]
        k = _after_templates(head)
        kind = words[k] if k < len(words) else ""
        # a function definition: a parameter list and no '=' outside brackets (an '=' makes it
        # a variable with a brace initialiser)
        if (")" in words[k:] and "=" not in _top_level(head[k:]) and
                kind not in ("struct", "class", "union", "enum", "typedef", "using")):
            self._statement(stmt_start, i, (i, close), ns)
            return close + 1, True
        if kind in ("struct", "class", "union"):
            self._class_body(i, close)
            # specialisations on address spaces only (`S<device T*>`, `S<thread T*>`) coincide
            # on the CPU, as overloaded functions do
            key, space = _space_overload_key(head, ns)
            self.overloads.setdefault("struct " + key, []).append((space, stmt_start, close))
        return close + 1, False

    def _statement(self, s: int, e: int, body: tuple[int, int] | None, ns: list[str]) -> None:
        head = self.toks[s:e]
        if not head:
            return
        if body is None:
            self._declaration(head, e, ns)
            return
        words = [t.text for t in head]
        if words[0] == "template" and (len(words) < 2 or words[1] != "<"):
            return
        self._function(head, s, body, ns)

    def _declaration(self, head: list[Token], e: int, ns: list[str]) -> None:
        """A statement without a body: a global integer constant, a function constant or an
        explicit instantiation are recorded."""
        words = [t.text for t in head]
        # global integer constants, for threadgroup array sizes
        if "=" in words and "(" not in words:
            q = words.index("=")
            if q >= 1 and head[q - 1].kind == "id" and \
                    any(w in ("constexpr", "constant", "const") for w in words[:q]):
                self.consts[words[q - 1]] = " ".join(words[q + 1:])
        if any(t.kind == "attr" and _attr_name(t.text)[0] == "function_constant" for t in head):
            self._function_constant(head, e)
            return
        if words[0] == "template" and (len(words) < 2 or words[1] != "<"):
            self._instantiation(head, ns)

    def _function(self, head: list[Token], s: int, body: tuple[int, int],
                  ns: list[str]) -> None:
        """A function definition (kernel or not) whose body is the token range `body`."""
        tparams: list[tuple[str, str | None]] = []
        k = 0
        if head[0].text == "template":
            close = _match_angle(head, 1)
            tparams = _template_params(head[2:close])
            k = close + 1
        decl = head[k:]
        is_kernel = any(t.kind == "id" and t.text == "kernel" for t in decl) or \
            any(t.kind == "attr" and "kernel" in dict(_attr_list(t.text)) for t in decl)
        # function name: identifier before the parameter list's '('
        popen = next((j for j, t in enumerate(decl) if t.text == "("), None)
        if popen is None or popen == 0:
            return
        if not is_kernel:
            # overloads on address spaces only (`f(thread T&)`, `f(device T&)`) coincide on the
            # CPU: the first (preferably `thread`/unqualified) is kept, see run()
            key, space = _space_overload_key(head, ns)
            self.overloads.setdefault(key, []).append((space, s, body[1]))
        pclose = _match(decl, popen, "(", ")")
        name = _name_before(decl, popen)
        if not name:
            return
        tg = self._body(body[0], body[1])
        self.funcs.append(_FuncDef(
            name=name.split("::")[-1], qual="::".join(ns + [name]) if ns else name,
            tparams=tparams, param_toks=decl[popen + 1:pclose], is_kernel=is_kernel,
            attrs=[t.text for t in decl if t.kind == "attr"], body=body,
            offset=head[0].start, tg=tg))

    def _class_body(self, open_: int, close: int) -> None:
        """Member functions overloaded on the object's address space (``f() thread``, ``f()
        device``, ``f() const constant``: Metal code such as MLX's complex_t writes one per
        space) are the same function on the CPU, where every space is ordinary memory: the
        qualifier is blanked, and of members that then coincide the first ``thread`` (or
        unqualified) one is kept and the others are blanked whole."""
        toks = self.toks
        members: dict[str, list[tuple[str, int, int]]] = {}
        i = stmt = open_ + 1
        while i < close:
            t = toks[i]
            if t.kind == "id" and t.text in ("public", "private", "protected") and \
                    i + 1 < close and toks[i + 1].text == ":":
                i = stmt = i + 2
                continue
            if t.text == "(" and t.kind == "punct":
                i = _match(toks, i, "(", ")") + 1
                continue
            if t.text == ";":
                self._member(toks[stmt:i], stmt, i, members)
                i = stmt = i + 1
                continue
            if t.text == "{":
                end = _match(toks, i, "{", "}")
                head = toks[stmt:i]
                words = [x.text for x in head]
                k = _after_templates(head)
                kind = words[k] if k < len(words) else ""
                if kind in ("struct", "class", "union"):
                    self._class_body(i, end)
                    i = end + 1
                    continue
                tl = _top_level(head[k:])
                init_brace = ":" in tl and ")" in words and toks[i - 1].text not in (")",) and \
                    (toks[i - 1].kind == "id" and toks[i - 1].text not in _MEMBER_QUALS or
                     toks[i - 1].text == ">")
                if ")" in words[k:] and "=" not in tl and kind not in ("enum", "typedef", "using") \
                        and not init_brace:
                    self._member(head, stmt, end, members)
                    i = stmt = end + 1
                    if i < close and toks[i].text == ";":
                        i = stmt = i + 1
                    continue
                i = end + 1
                continue
            i += 1
        self._drop_space_overloads(members)

    def _member(self, head: list[Token], s: int, e: int,
                members: dict[str, list[tuple[str, int, int]]]) -> None:
        """Record one member declaration/definition toks[s..e]; blank address-space qualifiers.

        An explicit specialisation of a member function template written inside the class
        (``template <> R operator()(complex64_t x)``: Clang, hence Metal, accepts it; GCC does
        not) loses its ``template <>`` and becomes the plain overload that overload resolution
        prefers for exactly those argument types, as it would pick the specialisation."""
        words = [t.text for t in head]
        if words[:3] == ["template", "<", ">"]:
            self.blank.append((head[0].start, head[2].end))
            head, words = head[3:], words[3:]
        popen = next((j for j, t in enumerate(head) if t.text == "(" and j > 0 and
                      (head[j - 1].kind == "id" or head[j - 1].text in (")", ">"))), None)
        if popen is None:
            return
        pclose = _match(head, popen, "(", ")")
        if words[popen - 1] == ")" and popen >= 2 and words[popen - 2] == "(" and \
                pclose + 1 < len(head) and words[pclose + 1] == "(":   # operator()(...)
            popen = pclose + 1
            pclose = _match(head, popen, "(", ")")
        space = ""
        key = [t.text for t in head[:pclose + 1] if t.kind != "attr" and
               (t.kind != "id" or t.text not in _CPU_SAME_SPACES)]
        for t in head[pclose + 1:]:
            if t.text in (":", "->", "=", "{") or t.kind == "attr":
                break
            if t.kind == "id" and t.text in ADDRESS_SPACES:
                space = space or t.text
                self.blank.append((t.start, t.end))
            else:
                key.append(t.text)
        members.setdefault(" ".join(key), []).append((space, s, e))

    def _function_constant(self, head: list[Token], semi: int) -> None:
        attr = next(t for t in head if t.kind == "attr")
        _, arg = _attr_name(attr.text)
        decl = [t for t in head if t.kind != "attr" and t.text not in ("constant", "const")]
        if len(decl) < 2 or decl[-1].kind != "id" or "=" in [t.text for t in decl]:
            raise ParseError(f"a function constant is declared as `constant T name "
                             f"[[function_constant(index)]];`, got "
                             f"`{self.text[head[0].start:head[-1].end]}`", head[0].start)
        try:
            index = int(arg, 8) if re.fullmatch(r"0[0-7]+", arg) else int(arg, 0)
        except ValueError:
            index = None
        if index is None:
            raise ParseError(f"[[function_constant({arg})]]: the index must be an integer "
                             f"literal", attr.start)
        type_text = " ".join(t.text for t in decl[:-1]).replace(" :: ", "::")
        self.fcs.append(FunctionConstant(name=decl[-1].text, type_text=type_text, index=index,
                                         start=head[0].start, end=self.toks[semi].end))

    def _body(self, b0: int, b1: int) -> list[TgDecl]:
        """Find statement-level `threadgroup T x[N];` declarations in a function body."""
        toks = self.toks
        found: list[TgDecl] = []
        prev = "{"
        i = b0 + 1
        while i < b1:
            t = toks[i]
            if t.kind == "id" and t.text == "threadgroup" and prev in ("{", "}", ";", ":"):
                j = i
                while j < b1 and toks[j].text != ";":
                    j += 1
                decl = toks[i + 1:j]
                words = [x.text for x in decl]
                head_words = words[:words.index("[")] if "[" in words else words
                if decl and not any(w in ("*", "&", "&&", "=", "(") for w in head_words):
                    # type = tokens up to the first declarator; dims = bracket contents
                    parts = _split_commas(decl)
                    first = parts[0]
                    br = next((k for k, x in enumerate(first) if x.text == "["), len(first))
                    type_toks = first[:br - 1] if br > 0 else first
                    type_text = " ".join(x.text for x in type_toks).replace(" :: ", "::") \
                        .replace(" < ", "<").replace(" >", ">").replace(" ,", ",")
                    names = []
                    for part in parts:
                        br = next((k for k, x in enumerate(part) if x.text == "["), len(part))
                        if br > 0 and part[br - 1].kind == "id":
                            names.append(part[br - 1].text)
                        dims, k = [], 0
                        while k < len(part):
                            if part[k].text == "[":
                                c = _match(part, k, "[", "]")
                                dims.append(" ".join(x.text for x in part[k + 1:c]))
                                k = c
                            k += 1
                        found.append(TgDecl(start=t.start, end=t.end, type_text=type_text,
                                            dims=dims))
                    self.tg.append(TgDecl(start=t.start, end=t.end, type_text=type_text,
                                          dims=[], names=names,
                                          stmt_end=toks[j].end if j < b1 else 0))
                i = j
                prev = ";"
                continue
            prev = t.text if t.kind == "punct" else "x"
            i += 1
        return found

    def _instantiation(self, head: list[Token], ns: list[str]) -> None:
        attrs = [t for t in head if t.kind == "attr"]
        host = None
        for an, arg in (x for a in attrs for x in _attr_list(a.text)):
            if an == "host_name":
                host = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', arg))
        if host is None:
            return
        self.blank.append((head[0].start, head[-1].end + 1))   # through the ';'
        body = [t for t in head[1:] if t.kind != "attr"]
        words = [t.text for t in body]
        if "decltype" in words:
            # template [[host_name]] [[kernel]] decltype(f<A>) f<A>;
            d = words.index("decltype")
            close = _match(body, d + 1, "(", ")")
            rest = body[close + 1:]
            name, targs = self._name_targs(rest)
            self.insts.append(dict(host=host, name=name, targs=targs, params=None,
                                   offset=head[0].start, ns=ns))
            return
        popen = words.index("(") if "(" in words else None
        if popen is None:
            raise ParseError(f"cannot read the instantiation of '{host}'")
        pclose = _match(body, popen, "(", ")")
        pre = body[:popen]
        # the name (and <args>) is at the end of `pre`
        lt = None
        if pre and pre[-1].text in (">", ">>"):
            depth = 0
            for k in range(len(pre) - 1, -1, -1):
                if pre[k].text == ">":
                    depth += 1
                elif pre[k].text == ">>":
                    depth += 2
                elif pre[k].text == "<":
                    depth -= 1
                    if depth == 0:
                        lt = k
                        break
        name = _name_before(pre, lt if lt is not None else len(pre))
        targs = None
        if lt is not None:
            targs = self.text[pre[lt].end:pre[-1].start].strip()
        params_text = self.text[body[popen].end:body[pclose].start]
        self.insts.append(dict(host=host, name=name, targs=targs,
                               params=params_text if targs is None else None,
                               param_toks=body[popen + 1:pclose],
                               offset=head[0].start, ns=ns))

    def _name_targs(self, toks: list[Token]) -> tuple[str, str | None]:
        words = [t.text for t in toks]
        if "<" in words:
            lt = words.index("<")
            gt = _match_angle(toks, lt)
            name = "".join(words[:lt])
            return name, self.text[toks[lt].end:toks[gt].start].strip()
        return "".join(w for w in words if w != ";"), None


def _subst(text: str, mapping: dict[str, str]) -> str:
    for k, v in mapping.items():
        text = re.sub(rf"(?<![\w:]){re.escape(k)}(?!\w)", v, text)
    return text


def parse(text: str) -> ParsedSource:
    """Parse preprocessed MSL text into kernels plus the spans the rewrite pass needs."""
    lines = LineMap(text)

    def where(off: int) -> str:
        f, ln = lines.locate(off)
        return f"{f or 'program_source'}:{ln}"

    try:
        return _parse(text, lines, where)
    except ParseError as e:
        if e.offset is None:
            raise
        raise ParseError(f"{where(e.offset)}: {e}") from None


def _parse(text: str, lines: LineMap, where) -> ParsedSource:
    w = _Walker(text)
    w.run()
    sigs = _Signatures(text, lines, where, w.consts)
    kernels = [sigs.finish(fd, fd.name, None, None, {}, None)
               for fd in w.funcs if fd.is_kernel and not fd.tparams]
    kernels += [sigs.instantiate(inst, w.funcs) for inst in w.insts]
    seen: set[str] = set()
    for k in kernels:
        if k.host_name in seen:
            raise ParseError(f"two kernels are named '{k.host_name}'")
        seen.add(k.host_name)
    _bind_function_constants(kernels, w.fcs, lines)
    return ParsedSource(kernels=kernels, blank_spans=w.blank, tg_decls=w.tg,
                        function_constants=w.fcs)


class _Signatures:
    """Signatures of the kernels a walked source defines or instantiates."""

    def __init__(self, text: str, lines: LineMap, where, consts: dict[str, str]):
        self.text = text
        self.lines = lines
        self.where = where
        self.consts = consts

    def instantiate(self, inst: dict, funcs: list[_FuncDef]) -> Signature:
        """The kernel of an explicit instantiation of a template among `funcs`."""
        where = self.where
        base = inst["name"].split("::")[-1]
        cands = [fd for fd in funcs if fd.name == base and fd.tparams]
        if not cands:
            raise ParseError(f"{where(inst['offset'])}: instantiation '{inst['host']}' names "
                             f"'{inst['name']}', which is not a template function in this source")
        if inst["targs"] is not None:
            fd = cands[0]
            args = [" ".join(t.text for t in part) for part in
                    _split_commas(tokenize(inst["targs"]))]
            subst = {}
            for k, (pn, dflt) in enumerate(fd.tparams):
                if k < len(args):
                    subst[pn] = args[k]
                elif dflt is not None:
                    subst[pn] = _subst(dflt, subst)
            sig = self.finish(fd, inst["host"], inst["targs"], None, subst, None)
        else:
            concrete = _parse_params(inst["param_toks"], self.text, where(inst["offset"]))
            fd = next((c for c in cands if len(_split_commas(c.param_toks)) == len(concrete)),
                      cands[0])
            sig = self.finish(fd, inst["host"], None, inst["params"], {}, concrete)
        sig.func_name = fd.qual
        return sig

    def finish(self, fd: _FuncDef, host: str, targs: str | None, fn_params: str | None,
               subst: dict[str, str], concrete: list[SignatureParam] | None) -> Signature:
        """The signature of `fd` as kernel `host`: template parameters replaced by `subst`, or
        parameter types taken from the `concrete` list of a deduced instantiation."""
        where = f"{self.where(fd.offset)}: kernel '{host}'"
        params = _parse_params(fd.param_toks, self.text, where)
        if concrete is not None:
            _take_concrete_types(params, concrete, f"{self.where(fd.offset)}: instantiation "
                                                   f"'{host}'")
        elif subst:
            for p in params:
                p.type_text = _subst(p.type_text, subst)
                p.elem_type = _subst(p.elem_type, subst)
        assign_buffer_indices(params, where)
        names = dict(self.consts)
        names.update(subst)
        _, line = self.lines.locate(fd.offset)
        return Signature(host_name=host, func_name=fd.qual, template_args=targs,
                         fn_params=fn_params, params=params, line=line,
                         max_total_threads=_max_total_threads(fd, names, where),
                         threadgroup_bytes=_threadgroup_bytes(fd.tg, names))


def _take_concrete_types(params: list[SignatureParam], concrete: list[SignatureParam], where: str) -> None:
    if len(concrete) != len(params):
        raise ParseError(f"{where} has {len(concrete)} parameters, the template {len(params)}")
    for p, c in zip(params, concrete):
        p.type_text, p.elem_type = c.type_text, c.elem_type
        p.is_pointer, p.is_reference, p.is_const = c.is_pointer, c.is_reference, c.is_const
        p.address_space = c.address_space or p.address_space


def _max_total_threads(fd: _FuncDef, names: dict[str, str], where: str) -> int:
    """[[max_total_threads_per_threadgroup(N)]] (at most 1024), else 1024."""
    mtt = 1024
    for an, arg in (x for a in fd.attrs for x in _attr_list(a)):  # [[kernel, max_total...(N)]]
        if an == "max_total_threads_per_threadgroup":
            v = eval_int(arg, names)
            if v is None:
                raise ParseError(f"{where}: cannot evaluate "
                                 f"[[max_total_threads_per_threadgroup({arg})]]")
            mtt = min(v, 1024)
    return mtt


def _threadgroup_bytes(decls: list[TgDecl], names: dict[str, str]) -> int | None:
    """Bytes of the kernel-scope threadgroup arrays, rounded up to 16; None if not static."""
    total: int | None = 0
    for d in decls:
        sz = type_size(d.type_text, names)
        for dim in d.dims:
            n = eval_int(dim, names)
            sz = None if (sz is None or n is None) else sz * n
        total = None if (total is None or sz is None) else total + sz
    return None if total is None else (total + 15) // 16 * 16


def _bind_function_constants(kernels: list[Signature], fcs: list[FunctionConstant],
                             lines: LineMap) -> None:
    """Lines of the function constants, and the index of each [[function_constant(name)]]
    parameter's constant."""
    for fc in fcs:
        fc.line = lines.locate(fc.start)[1]
    fc_index = {fc.name: fc.index for fc in fcs}
    for k in kernels:
        for p in k.params:
            if p.function_constant:
                if p.function_constant not in fc_index:
                    raise ParseError(f"program_source:{k.line}: kernel '{k.host_name}': parameter "
                                     f"'{p.name}' names [[function_constant({p.function_constant})]]"
                                     f", which is not a declared function constant")
                p.function_constant_index = fc_index[p.function_constant]
