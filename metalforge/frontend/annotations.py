"""Parse tensor annotations ("T[R, D]", "u32[N, K/8]", "T[*B, D]") with the lark grammar.

`parse_annotation(text)` returns an `Annotation`: the dtype (a DSL dtype name or a dtype
variable) and one `Dim` per storage dim. A literal dim ("T[C, 4]", "T[C, W]" with W an
`mf.Const[int]`, "T[C, K=4]") has a fixed size: named ("K=4"), its axis is K; unnamed, its axis
is named after the parameter and the dim's position, "w[1]", and is no other tensor's
axis. Derived dims keep their expression until the kernel
resolves it (`resolve_dim`) into a `graph.AxisSpec`, because an operand may name an
`mf.Const[int]` parameter (``K/GS``) whose value is known only per specialisation.
Every error is an `AnnotationError` whose message shows the annotation with a caret under the
offending character.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from importlib import resources
from typing import Callable, Mapping, Optional, Union

import lark

from .. import dtypes
from ..errors import AnnotationError
from ..graph import AxisSpec

_READABLE = {
    "NAME": "a name", "INT": "an integer", "RSQB": "']'", "LSQB": "'['", "COMMA": "','",
    "STAR": "'*'", "LPAR": "'('", "RPAR": "')'", "PLUS": "'+'", "MINUS": "'-'",
    "SLASH": "'/'", "EQUAL": "'='", "$END": "the end", "<END-OF-FILE>": "the end",
}

# Names that look like dtypes but are not metalforge dtypes: refuse them rather than silently
# treating them as dtype variables.
_DTYPE_LOOKALIKE = re.compile(
    r"^(?:[fiu]\d+|bf\d+|float\d*|half|double|bfloat\d*|int\d*|uint\d*|long|short|char|"
    r"uchar|ushort|bool_|boolean)$")


Tree = lark.Tree[lark.Token]
Linear = tuple[Optional[str], Fraction, Fraction]     # (base, coef, off): coef * base + off


def _tree(c: Union[lark.Token, Tree]) -> Tree:
    """A child the grammar makes a subtree."""
    assert isinstance(c, lark.Tree), c
    return c


def _token(c: Union[lark.Token, Tree]) -> lark.Token:
    """A child the grammar makes a token."""
    assert isinstance(c, lark.Token), c
    return c


def _start(tok: lark.Token) -> int:
    """Where a token starts in the annotation (the parser records every position)."""
    assert tok.start_pos is not None
    return tok.start_pos


@lru_cache(maxsize=1)
def grammar_text() -> str:
    return resources.files(__package__).joinpath("metalforge.lark").read_text()


@lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    return lark.Lark(grammar_text(), parser="lalr", propagate_positions=True,
                     maybe_placeholders=False)


@dataclass(frozen=True)
class Dim:
    """One storage dim of an annotation, as written."""
    kind: str                      # "plain" | "derived" | "batch" | "group" | "literal"
    name: str                      # plain/batch/named literal: the name; else the text written
    pos: int                       # offset of the dim in the annotation text
    expr: Optional[Tree] = None            # derived: the expression
    names: tuple[str, ...] = ()            # group: the member names; derived: names used
    labeled: bool = False                  # literal: named by the user ("K=4")


@dataclass(frozen=True)
class Annotation:
    text: str
    dtype: Optional[dtypes.DType]  # concrete dtype, or None when a dtype variable decides
    dtype_var: Optional[str]
    dims: tuple[Dim, ...]

    @property
    def has_group(self) -> bool:
        return any(d.kind == "group" for d in self.dims)


def caret(text: str, pos: int) -> str:
    """The annotation in quotes with a caret under character `pos`."""
    return f'    "{text}"\n     {" " * pos}^'


def _fail(text: str, pos: int, msg: str, context: str) -> AnnotationError:
    prefix = f"{context}: " if context else ""
    err = AnnotationError(f"{prefix}bad annotation \"{text}\": {msg}\n{caret(text, pos)}")
    err.column = pos
    err.annotation = text
    return err


def _syntax_error(text: str, e: lark.exceptions.UnexpectedInput, context: str) -> AnnotationError:
    if isinstance(e, lark.exceptions.UnexpectedToken):
        tok = e.token
        pos = len(text) if tok.type == "$END" else _start(tok)
        got = "end of the annotation" if tok.type == "$END" else f"'{tok}'"
        expected = sorted(_READABLE.get(t, t) for t in e.expected)
    elif isinstance(e, lark.exceptions.UnexpectedCharacters):
        assert e.pos_in_stream is not None, "the lexer says where it stopped"
        pos = e.pos_in_stream
        got = f"'{text[pos]}'"
        expected = sorted(_READABLE.get(t, t) for t in (e.allowed or ()))
    else:   # UnexpectedEOF
        pos = len(text)
        got = "end of the annotation"
        expected = sorted(_READABLE.get(t, t) for t in getattr(e, "expected", ()))
    want = f"; expected {', '.join(expected)}" if expected else ""
    return _fail(text, pos, f"unexpected {got}{want}. Annotations look like \"T[R, D]\", "
                 "\"f16[N]\", \"u32[N, K/8]\" or \"T[*B, D]\"", context)


def _names(tree: Tree) -> list[lark.Token]:
    if tree.data == "name":
        return [_token(tree.children[0])]
    if tree.data == "int":
        return []
    return [n for c in tree.children if isinstance(c, lark.Tree) for n in _names(c)]


def parse_annotation(text: str, context: str = "") -> Annotation:
    """Parse one tensor annotation; `context` (e.g. "kernel 'f' (a.py:3), parameter 'x'")
    prefixes error messages."""
    try:
        tree = _parser().parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise _syntax_error(text, e, context) from None
    dtype_tok, *dim_trees = tree.children
    dtype, dtype_var = _dtype(text, _token(dtype_tok), context)
    dims: list[Dim] = []
    seen: dict[str, int] = {}
    for i, c in enumerate(dim_trees):
        t = _tree(c)
        dim = _dim(text, t, i, context)
        for n, tok_pos in _dim_name_positions(dim, t):   # derived dims may repeat their base
            if n in seen:
                raise _fail(text, tok_pos, f"dim '{n}' appears twice", context)
            seen[n] = tok_pos
        dims.append(dim)
    return Annotation(text, dtype, dtype_var, tuple(dims))


def _dtype(text: str, tok: lark.Token,
           context: str) -> tuple[Optional[dtypes.DType], Optional[str]]:
    """(dtype, None) for a dtype name, (None, name) for a dtype variable such as T."""
    dname = str(tok)
    if dname in dtypes.ANNOTATION_DTYPES:
        return dtypes.ANNOTATION_DTYPES[dname], None
    if _DTYPE_LOOKALIKE.match(dname):
        raise _fail(text, _start(tok),
                    f"'{dname}' is not a metalforge dtype (dtypes: "
                    f"{' '.join(dtypes.ANNOTATION_DTYPES)}; any other name, like T, is a "
                    "dtype variable)", context)
    return None, dname


def _dim(text: str, t: Tree, i: int, context: str) -> Dim:
    """The i-th dim of an annotation: a batch "*B", a group "(G R)", a name, or derived."""
    start = t.meta.start_pos
    src = text[start:t.meta.end_pos]
    if t.data == "batch":
        if i != 0:
            raise _fail(text, start, f"the batch dims '{src}' must come first (they stand "
                        "for any number of leading dims)", context)
        return Dim("batch", str(t.children[0]), start, names=(str(t.children[0]),))
    if t.data == "group":
        return Dim("group", "(" + " ".join(map(str, t.children)) + ")", start,
                   names=tuple(map(str, t.children)))
    if t.data == "name":
        return Dim("plain", str(t.children[0]), start, names=(str(t.children[0]),))
    if t.data == "named":
        label, expr = str(t.children[0]), _tree(t.children[1])
        return Dim("literal", label, start, expr=expr, labeled=True,
                   names=(label, *dict.fromkeys(map(str, _names(expr)))))
    names = _names(t)
    kind = "derived" if names else "literal"    # a dim of integers alone: a fixed size
    return Dim(kind, re.sub(r"\s+", "", src), start, expr=t,
               names=tuple(dict.fromkeys(map(str, names))))


def _dim_name_positions(dim: Dim, tree: Tree) -> list[tuple[str, int]]:
    if dim.kind == "literal":
        return [(dim.name, dim.pos)] if dim.labeled else []
    if dim.kind == "derived":
        return []
    toks = [c for c in tree.children if isinstance(c, lark.Token)]
    return [(str(tok), _start(tok)) for tok in toks]


# --------------------------------------------------------------------------- derived dims

def _linear(tree: Tree, consts: Mapping[str, int], text: str, context: str) -> Linear:
    """Evaluate a derived-dim expression as coef * base + off. Returns (base, coef, off)."""
    def ev(t: Tree) -> Linear:
        if t.data == "int":
            return None, Fraction(0), Fraction(int(_token(t.children[0])))
        if t.data == "name":
            n = str(t.children[0])
            if n in consts:
                v = consts[n]
                if isinstance(v, bool) or not isinstance(v, int):
                    raise _fail(text, t.meta.start_pos, f"'{n}' in a derived dim must be an "
                                f"mf.Const[int], got {v!r}", context)
                return None, Fraction(0), Fraction(v)
            return n, Fraction(1), Fraction(0)
        (ba, ca, oa), (bb, cb, ob) = ev(_tree(t.children[0])), ev(_tree(t.children[1]))
        if ba and bb and ba != bb:
            raise _fail(text, t.meta.start_pos, f"a derived dim is computed from one base dim "
                        f"and integers, but this one uses '{ba}' and '{bb}' (names other than "
                        "the base must be mf.Const[int] parameters)", context)
        base = ba or bb
        if t.data == "add":
            return base, ca + cb, oa + ob
        if t.data == "sub":
            return base, ca - cb, oa - ob
        if t.data == "mul":
            if ca and cb:
                raise _fail(text, t.meta.start_pos, "a derived dim cannot multiply a dim by a "
                            "dim", context)
            return base, ca * ob + cb * oa, oa * ob
        # div
        if cb:
            raise _fail(text, _tree(t.children[1]).meta.start_pos, "a derived dim can only divide "
                        "by an integer", context)
        if ob == 0:
            raise _fail(text, _tree(t.children[1]).meta.start_pos, "division by zero", context)
        return base, ca / ob, oa / ob
    return ev(tree)


def resolve_dims(dims: tuple[Dim, ...], consts: Mapping[str, int], text: str,
                 context: str = "", param: str = "") -> tuple[AxisSpec, ...]:
    """The graph's AxisSpecs for an annotation's dims: one per dim, except a grouped dim
    "(G R)", which is one storage dim seen as the axes G (outer) and R (inner): R is `joined`
    to G (the same storage dim, R varying fastest). An unnamed literal dim is the axis
    "<param>[<position>]" (`param`: the parameter; "" in a return annotation, which must name
    its literal dims)."""
    out: list[AxisSpec] = []
    for i, d in enumerate(dims):
        v = consts.get(d.name) if d.kind == "plain" else None
        if isinstance(v, int) and not isinstance(v, bool):   # "T[C, W]", W an mf.Const[int]
            out.append(_literal(d, Fraction(v), d.name, text, context))
        elif d.kind in ("literal", "derived"):
            out.append(_literal_or_derived(d, i, consts, text, context, param))
        elif d.kind == "group":
            clash = [n for n in d.names if n in consts]
            if clash:
                raise _fail(text, d.pos, f"'{clash[0]}' in the grouped dim '{d.name}' is an "
                            "mf.Const; a grouped dim is made of named axes", context)
            out += [AxisSpec(n, joined=i > 0) for i, n in enumerate(d.names)]
        else:
            out.append(resolve_dim(d, consts, text, context))
    return tuple(out)


def resolve_dim(dim: Dim, consts: Mapping[str, int], text: str, context: str = "") -> AxisSpec:
    """The graph's AxisSpec for one parsed dim (derived dims need the Const values)."""
    if dim.kind == "plain":
        return AxisSpec(dim.name)
    if dim.kind == "batch":
        return AxisSpec(dim.name, batch=True)
    if dim.kind == "group":
        raise _fail(text, dim.pos, f"the grouped dim '{dim.name}' stands for several axes; "
                    "resolve it with resolve_dims", context)
    assert dim.expr is not None, "a derived dim keeps its expression"
    base, coef, off = _linear(dim.expr, consts, text, context)
    if dim.kind == "literal" or base is None:
        return _literal(dim, off if base is None else None, dim.name, text, context)
    if coef <= 0:
        raise _fail(text, dim.pos, f"the derived dim '{dim.name}' must grow with its base dim "
                    "(e.g. K/8, N*2+1)", context)
    if off.denominator != 1:
        raise _fail(text, dim.pos, f"the derived dim '{dim.name}' must have the form "
                    "base*a/b + c with whole numbers a, b, c", context)
    mul, div, add = coef.numerator, coef.denominator, int(off)
    if (mul, div, add) == (1, 1, 0):
        return AxisSpec(base)
    name = base + (f"*{mul}" if mul != 1 else "") + (f"/{div}" if div != 1 else "")
    name += f"+{add}" if add > 0 else (f"{add}" if add < 0 else "")
    return AxisSpec(name, base=base, mul=mul, div=div, add=add)


# --------------------------------------------------------------------------- literal dims

def _literal_or_derived(d: Dim, i: int, consts: Mapping[str, int], text: str, context: str,
                        param: str) -> AxisSpec:
    """A literal or derived dim at position `i`: an unnamed literal (integers and Consts
    only) is the axis "<param>[<i>]"."""
    assert d.expr is not None, "literal and derived dims keep their expression"
    base, _, off = _linear(d.expr, consts, text, context)
    if base is not None:
        return resolve_dim(d, consts, text, context)
    if d.labeled:
        return _literal(d, off, d.name, text, context)
    if not param:
        raise _fail(text, d.pos, f"the literal dim '{d.name}' has no name; in a return "
                    f"annotation name it as the parameter does (e.g. K={d.name} in both)",
                    context)
    return _literal(d, off, f"{param}[{i}]", text, context)


def _literal(d: Dim, value: Optional[Fraction], name: str, text: str,
             context: str) -> AxisSpec:
    """The AxisSpec of a literal dim of size `value` (None: it depends on a dim)."""
    if value is None:
        raise _fail(text, d.pos, f"the literal dim '{d.name}' depends on a dim; a literal size "
                    "is made of integers and mf.Const[int] names", context)
    if value.denominator != 1 or value < 1:
        raise _fail(text, d.pos, f"the literal dim '{d.name}' is {value}; a literal size must "
                    "be a whole number of at least 1", context)
    return AxisSpec(name, size=int(value))


def unify_literals(params: list[tuple[str, tuple[AxisSpec, ...]]],
                   where: Callable[[str], str]) -> dict[str, int]:
    """The fixed size of each named literal axis over every parameter's dims ("K=4" in one
    annotation makes K a literal in every annotation that says K); two different sizes for one
    name are an AnnotationError (`where(param)` names the parameter)."""
    sizes: dict[str, tuple[int, str]] = {}
    for pname, dims in params:
        for d in dims:
            if d.size is None or d.anonymous:
                continue
            if d.name in sizes and sizes[d.name][0] != d.size:
                size, other = sizes[d.name]
                raise AnnotationError(f"{where(pname)}: dim '{d.name}' is the literal {d.size} "
                                      f"here but {size} in parameter '{other}'; a named "
                                      "literal dim has one size")
            sizes.setdefault(d.name, (d.size, pname))
    return {n: v for n, (v, _) in sizes.items()}


def with_literals(dims: tuple[AxisSpec, ...], sizes: Mapping[str, int]) -> tuple[AxisSpec, ...]:
    """`dims` with every axis that `sizes` names made that literal size."""
    return tuple(AxisSpec(d.name, size=sizes[d.name]) if d.name in sizes and not d.derived
                 and not d.batch and not d.joined else d for d in dims)
