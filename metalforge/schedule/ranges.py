"""Static ranges of gather indices: which `mf.take` sites need no run-time index check.

An interval analysis over an index expression's graph, symbolic in the axis sizes (which are
run-time values). A value's range is a list of *cases* (the value lies in at least one: the
branches of a `where`), each a set of lower and a set of upper bounds (the value is at least
every lower bound and at most every upper one); a bound is an affine form (`SizeForm`) over
the sizes of the kernel's base axes with rational coefficients: `size(E) - 1`, `size(E)/2 + 3`. The
annotations relate axes: a derived dim "E/2" has size exactly size(E)/2 (shapes only bind when
the division is exact, so E is then a multiple of 2), "F*2" size 2*size(F), one name one size.

What it knows (everything else is unknown, and an unknown index keeps its check):

- `mf.index(A)` is in [0, size(A) - 1], and a position being evaluated means size(A) >= 1;
  `mf.size(A)` is size(A); integer constants are themselves; bools are 0 or 1;
- `+`, `-`, unary `-` and `*` by a constant, on 64-bit signed values with both bounds known
  and small enough that nothing wraps (sizes are taken below 2^48: no tensor has more
  elements);
- `//` and `%` of a value provably >= 0 by a positive constant, or by a size expression
  provably >= 1 (a divisor that may be 0 leaves the result unknown); `>>` by a constant; `^`
  and `&` with a non-negative constant;
- `mf.minimum`, `mf.maximum` (so `mf.clamp`), and `mf.where(cond, a, b)`, whose condition
  narrows each branch: in `a` the compared values satisfy `cond` (i < half bounds i by
  half - 1 there), in `b` its negation (comparisons of signed integers, `&` of conditions,
  `|` of negated ones, `~`).

A site is proven when, in every case, some lower bound is > -1 and some upper bound is
< size(axis) for every admissible size (all sizes integers: a bound over -1 of an integer
value means it is >= 0). Checking `c . sizes + c0 > -1` for all sizes >= their lower bounds
needs every coefficient >= 0 and the value at the lower bounds > -1: sound, not complete.

Rotate-half RoPE's partner `mf.where(i < half, i + half, i - half)` with i = mf.index("E") and
half = mf.size("E") // 2 is proven: i < half gives i + half <= 2 * half - 1 <= size(E) - 1,
and i >= half gives i - half >= 0. `i + 1`, `size - i`, `i ^ 1` (E may be odd) and an index
read from a tensor are not.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Callable, Iterable, Optional

from ..graph import AxisSpec, BinaryOp, Graph, Node, Op, UnaryOp, take_sites
from ..shapes import size_multiple

MAX_CASES = 8              # more cases than this: the value is unknown
MAX_BOUNDS = 6             # bounds kept per side of a case (dropping bounds is sound)
SIZE_LIMIT = 1 << 48       # every axis size is below this (no tensor holds 2^48 elements)
WRAP_LIMIT = 1 << 62       # bounds of 64-bit arithmetic stay below this: nothing wraps


# --------------------------------------------------------------------------- affine forms

@dataclass(frozen=True)
class SizeForm:
    """sum(coefficient * size(symbol)) + const: a bound, symbolic in the base axes' sizes."""
    terms: tuple[tuple[str, Fraction], ...] = ()      # sorted by symbol, no zero coefficients
    const: Fraction = Fraction(0)

    @staticmethod
    def of(value: int | Fraction) -> "SizeForm":
        return SizeForm((), Fraction(value))

    @staticmethod
    def size(symbol: str) -> "SizeForm":
        return SizeForm(((symbol, Fraction(1)),))

    def __add__(self, other: "SizeForm") -> "SizeForm":
        acc = dict(self.terms)
        for s, c in other.terms:
            acc[s] = acc.get(s, Fraction(0)) + c
        terms = tuple(sorted((s, c) for s, c in acc.items() if c))
        return SizeForm(terms, self.const + other.const)

    def scale(self, k: Fraction) -> "SizeForm":
        if not k:
            return SizeForm.of(0)
        return SizeForm(tuple((s, c * k) for s, c in self.terms), self.const * k)

    def __sub__(self, other: "SizeForm") -> "SizeForm":
        return self + other.scale(Fraction(-1))

    @property
    def constant(self) -> Optional[Fraction]:
        """Its value when it has no size in it, else None."""
        return None if self.terms else self.const

    def magnitude(self) -> Fraction:
        """The largest |value| it takes for sizes below SIZE_LIMIT."""
        return sum((abs(c) * SIZE_LIMIT for _, c in self.terms), abs(self.const))

    def __str__(self) -> str:
        parts = [f"{'' if c == 1 else f'{c}*'}size({s})" for s, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


@dataclass(frozen=True)
class Case:
    """The value is >= every form in `lowers` and <= every form in `uppers`."""
    lowers: tuple[SizeForm, ...] = ()
    uppers: tuple[SizeForm, ...] = ()

    @staticmethod
    def exact(f: SizeForm) -> "Case":
        return Case((f,), (f,))

    def both(self) -> bool:
        return bool(self.lowers and self.uppers)

    def exact_form(self) -> Optional[SizeForm]:
        """The form the value equals, when one is both a lower and an upper bound."""
        return next((f for f in self.lowers if f in self.uppers), None)

    def with_bounds(self, lowers: Iterable[SizeForm], uppers: Iterable[SizeForm]) -> "Case":
        return Case(_cap((*self.lowers, *lowers)), _cap((*self.uppers, *uppers)))

    def __str__(self) -> str:
        lo = " and ".join(f">= {f}" for f in self.lowers) or "no lower bound"
        hi = " and ".join(f"<= {f}" for f in self.uppers) or "no upper bound"
        return f"{lo}, {hi}"


Range = tuple[Case, ...]
TOP: Range = (Case(),)
# narrowing facts: (structural key of a value, extra lower bounds, extra upper bounds)
Env = tuple[tuple[object, tuple[SizeForm, ...], tuple[SizeForm, ...]], ...]


def _cap(forms: Iterable[SizeForm]) -> tuple[SizeForm, ...]:
    return tuple(dict.fromkeys(forms))[:MAX_BOUNDS]


def _cases(cases: Iterable[Case]) -> Range:
    out = tuple(dict.fromkeys(cases))
    return out if 0 < len(out) <= MAX_CASES else TOP


def _signed(n: Node, wide: bool = False) -> bool:
    """A signed integer value (64-bit where `wide`: arithmetic that could wrap)."""
    return n.dtype.kind == "int" and (not wide or n.dtype.itemsize == 8)


def _int_const(n: Node) -> Optional[int]:
    """The integer constant `n` holds, under casts that keep its value; else None."""
    m = n
    while m.op == Op.CAST:
        if not _keeps_value(m.args[0], m):
            return None
        m = m.args[0]
    if m.op == Op.CONST and isinstance(m.attr, int) and not isinstance(m.attr, bool):
        return m.attr
    return None


def key(n: Node) -> object:
    """A structural key: nodes with equal keys hold the same value in one element (two
    `mf.index("E")` calls, two `mf.size("E") // 2`)."""
    if n.op in (Op.INDEX, Op.SIZE, Op.CONST, Op.SCALAR, Op.LOAD):
        return (n.op, n.attr, n.dtype.name, type(n.attr).__name__)
    return (n.op, n.attr, n.dtype.name, tuple(key(a) for a in n.args))


# --------------------------------------------------------------------------- sizes

@dataclass(frozen=True)
class SizeFacts:
    """What is known of the sizes: each axis' size as a form over base symbols, and each base
    symbol's least value (0, or more where a derived dim or a non-empty axis needs it)."""
    graph: Graph
    nonempty: frozenset[str]              # axes a position is evaluated along (size >= 1)

    def spec(self, axis: str) -> AxisSpec:
        try:
            return self.graph.axis_spec(axis)
        except KeyError:
            return AxisSpec(axis)

    def form(self, axis: str) -> SizeForm:
        s = self.spec(axis)
        if s.base is None:
            return SizeForm.size(axis)
        return SizeForm.size(s.base).scale(Fraction(s.mul, s.div)) + SizeForm.of(s.add)

    def multiple(self, symbol: str) -> int:
        return size_multiple(self.graph.tensors, symbol)

    @cached_property
    def least(self) -> dict[str, Fraction]:
        """Each base symbol's least admissible size."""
        need: dict[str, Fraction] = {}

        def at_least(spec: AxisSpec, size: int) -> None:
            base = spec.base or spec.name
            if spec.mul <= 0:
                return
            lo = Fraction((size - spec.add) * spec.div, spec.mul) if spec.base else Fraction(size)
            need[base] = max(need.get(base, Fraction(0)), lo)
        for t in self.graph.tensors:
            for d in t.dims:
                at_least(d, 0)
        for a in self.nonempty:
            at_least(self.spec(a), 1)
        out = {}
        for s, lo in need.items():
            m = self.multiple(s)
            out[s] = Fraction(math.ceil(max(lo, Fraction(0)) / m) * m)
        return out

    def at_least(self, f: SizeForm, bound: Fraction, strict: bool) -> bool:
        """Whether f >= bound (f > bound where `strict`) for every admissible size: every
        coefficient >= 0 and the value at the least sizes past the bound."""
        if any(c < 0 for _, c in f.terms):
            return False
        low = f.const + sum((c * self.least.get(s, Fraction(0)) for s, c in f.terms),
                            Fraction(0))
        return low > bound if strict else low >= bound

    def nonneg_int(self, f: SizeForm) -> bool:
        """A lower bound f of an integer value proves the value >= 0 (f > -1 everywhere)."""
        return self.at_least(f, Fraction(-1), strict=True)

    def exact_div(self, f: SizeForm, k: int) -> bool:
        """Whether f / k is a whole number for every admissible size (each size a multiple
        of its symbol's `multiple`)."""
        return (f.const / k).denominator == 1 and all(
            (c * self.multiple(s) / k).denominator == 1 for s, c in f.terms)


# --------------------------------------------------------------------------- the analysis

class Analysis:
    """The ranges of the values behind one gather's index (one `SizeFacts`)."""

    def __init__(self, sizes: SizeFacts) -> None:
        self.sizes = sizes
        self.memo: dict[tuple[int, Env], Range] = {}
        self.keys: dict[int, object] = {}

    def key(self, n: Node) -> object:
        if id(n) not in self.keys:
            self.keys[id(n)] = key(n)
        return self.keys[id(n)]

    def range(self, n: Node, env: Env = ()) -> Range:
        k = (id(n), env)
        if k not in self.memo:
            r = self._node(n, env)
            extra = [(lo, hi) for key_, lo, hi in env if key_ == self.key(n)]
            if extra:
                lows = [f for lo, _ in extra for f in lo]
                highs = [f for _, hi in extra for f in hi]
                r = _cases(c.with_bounds(lows, highs) for c in r)
            self.memo[k] = r
        return self.memo[k]

    def _node(self, n: Node, env: Env) -> Range:
        op = n.op
        if op == Op.CONST:
            v = n.attr
            return (Case.exact(SizeForm.of(int(v))),) if isinstance(v, (int, bool)) else TOP
        if op == Op.INDEX and _signed(n):
            return (Case((SizeForm.of(0),), (self.sizes.form(n.attr) - SizeForm.of(1),)),)
        if op == Op.SIZE and _signed(n):
            return (Case.exact(self.sizes.form(n.attr)),)
        if op == Op.UNPACK:
            return (Case((SizeForm.of(0),), (SizeForm.of((1 << n.attr) - 1),)),)
        if n.dtype.kind == "bool" and op in (Op.BINARY, Op.UNARY):
            return (Case((SizeForm.of(0),), (SizeForm.of(1),)),)
        if op == Op.CAST:
            return self.range(n.args[0], env) if _keeps_value(n.args[0], n) else TOP
        if op == Op.WHERE and _signed(n) and _widens(n):
            cond, a, b = n.args
            return _cases((*self.range(a, self.narrow(cond, True, env)),
                           *self.range(b, self.narrow(cond, False, env))))
        if op == Op.UNARY and n.attr == UnaryOp.NEG and _signed(n, wide=True) and _widens(n):
            return self._scaled(self.range(n.args[0], env), -1)
        if op == Op.BINARY and _signed(n) and _widens(n):
            rule = _BINARY.get(n.attr)
            if rule is not None:
                return rule(self, n, env)
        return TOP

    # -- arithmetic -------------------------------------------------------------------
    def _pairs(self, n: Node, env: Env, f: Callable[[Case, Case], Case]) -> Range:
        ra, rb = (self.range(a, env) for a in n.args)
        if len(ra) * len(rb) > MAX_CASES:
            return TOP
        return _cases(f(ca, cb) for ca, cb in itertools.product(ra, rb))

    def _add(self, n: Node, env: Env, sign: int = 1) -> Range:
        if not _signed(n, wide=True):
            return TOP

        def add(a: Case, b: Case) -> Case:
            if not (a.both() and b.both()):
                return Case()
            blo, bhi = (b.lowers, b.uppers) if sign > 0 else (
                tuple(f.scale(Fraction(-1)) for f in b.uppers),
                tuple(f.scale(Fraction(-1)) for f in b.lowers))
            return _no_wrap(Case(_cap(x + y for x in a.lowers for y in blo),
                                 _cap(x + y for x in a.uppers for y in bhi)))
        return self._pairs(n, env, add)

    def _sub(self, n: Node, env: Env) -> Range:
        return self._add(n, env, -1)

    def _scaled(self, r: Range, k: int) -> Range:
        def scale(c: Case) -> Case:
            if not c.both():
                return Case()
            lo = tuple(f.scale(Fraction(k)) for f in c.lowers)
            hi = tuple(f.scale(Fraction(k)) for f in c.uppers)
            return _no_wrap(Case(lo, hi) if k >= 0 else Case(hi, lo))
        return _cases(scale(c) for c in r)

    def _mul(self, n: Node, env: Env) -> Range:
        if not _signed(n, wide=True):
            return TOP
        a, b = n.args
        for x, c in ((a, _int_const(b)), (b, _int_const(a))):
            if c is not None:
                return self._scaled(self.range(x, env), c)
        return TOP

    def _divisor(self, d: Node, env: Env) -> Optional[SizeForm]:
        """The divisor as a form provably >= 1, or None."""
        r = self.range(d, env)
        f = r[0].exact_form() if len(r) == 1 else None
        return f if f is not None and self.sizes.at_least(f, Fraction(1), False) else None

    def _nonneg(self, r: Range) -> bool:
        return all(any(self.sizes.nonneg_int(f) for f in c.lowers) for c in r)

    def _floordiv(self, n: Node, env: Env) -> Range:
        x, d = n.args
        rx, k = self.range(x, env), self._divisor(d, env)
        if k is None or not self._nonneg(rx):
            return TOP
        kc = k.constant
        if kc is None:                      # by a size: 0 <= x // d <= x
            return _cases(Case((SizeForm.of(0),), c.uppers) for c in rx)

        def div(c: Case) -> Case:
            e = c.exact_form()
            if e is not None and self.sizes.exact_div(e, int(kc)):
                return Case.exact(e.scale(1 / kc))
            return Case(_cap((SizeForm.of(0), *((f - SizeForm.of(kc - 1)).scale(1 / kc)
                                            for f in c.lowers))),
                        tuple(f.scale(1 / kc) for f in c.uppers))
        return _cases(div(c) for c in rx)

    def _mod(self, n: Node, env: Env) -> Range:
        x, d = n.args
        rx, k = self.range(x, env), self._divisor(d, env)
        if k is None or not self._nonneg(rx):
            return TOP
        return _cases(Case((SizeForm.of(0),), _cap((k - SizeForm.of(1), *c.uppers))) for c in rx)

    def _shr(self, n: Node, env: Env) -> Range:
        s = _int_const(n.args[1])
        rx = self.range(n.args[0], env)
        if s is None or not 0 <= s < 63 or not self._nonneg(rx):
            return TOP
        k = Fraction(1 << s)
        return _cases(Case(_cap((SizeForm.of(0), *((f - SizeForm.of(k - 1)).scale(1 / k)
                                               for f in c.lowers))),
                           tuple(f.scale(1 / k) for f in c.uppers)) for c in rx)

    def _bits(self, n: Node, env: Env) -> Range:
        """x ^ c and x & c with c a non-negative constant (either side)."""
        a, b = n.args
        x, c = (a, _int_const(b)) if _int_const(b) is not None else (b, _int_const(a))
        if c is None or c < 0:
            return TOP
        rx = self.range(x, env)
        if n.attr == BinaryOp.AND:          # x & c is in [0, c], and <= x when x >= 0
            keep = self._nonneg(rx)
            return _cases(Case((SizeForm.of(0),),
                               _cap((SizeForm.of(c), *(c_.uppers if keep else ()))))
                          for c_ in rx)
        if not self._nonneg(rx):            # x ^ c <= x | c <= x + c
            return TOP
        return _cases(Case((SizeForm.of(0),), tuple(f + SizeForm.of(c) for f in c_.uppers))
                      for c_ in rx)

    def _extreme(self, n: Node, env: Env) -> Range:
        """minimum(a, b) is a (in a's range, and under b's upper bounds too) or b (the
        mirror): two cases per pair of cases. maximum: the same with lower bounds."""
        low = n.attr == BinaryOp.MINIMUM
        ra, rb = (self.range(a, env) for a in n.args)
        if 2 * len(ra) * len(rb) > MAX_CASES:
            return TOP

        def one(x: Case, other: Case) -> Case:
            return x.with_bounds((), other.uppers) if low else x.with_bounds(other.lowers, ())
        return _cases(c for ca in ra for cb in rb for c in (one(ca, cb), one(cb, ca)))

    # -- conditions -------------------------------------------------------------------
    def narrow(self, cond: Node, truth: bool, env: Env) -> Env:
        """`env` with what `cond` being `truth` says of the values it compares."""
        if cond.op == Op.UNARY and cond.attr == UnaryOp.NOT:
            return self.narrow(cond.args[0], not truth, env)
        if cond.op != Op.BINARY:
            return env
        f, (a, b) = cond.attr, cond.args
        if (f == BinaryOp.AND and truth) or (f == BinaryOp.OR and not truth):
            if cond.dtype.kind == "bool":
                return self.narrow(b, truth, self.narrow(a, truth, env))
            return env
        if not (_signed(a) and _signed(b)):
            return env
        # each comparison as a <= b + d, true or false
        facts = {BinaryOp.LT: ((a, b, -1), (b, a, 0)), BinaryOp.LE: ((a, b, 0), (b, a, -1)),
                 BinaryOp.GT: ((b, a, -1), (a, b, 0)), BinaryOp.GE: ((b, a, 0), (a, b, -1))}
        if f in facts:
            x, y, d = facts[f][0 if truth else 1]
            return self._le(x, y, d, env)
        if (f == BinaryOp.EQ and truth) or (f == BinaryOp.NE and not truth):
            return self._le(b, a, 0, self._le(a, b, 0, env))
        return env

    def _le(self, x: Node, y: Node, d: int, env: Env) -> Env:
        """x <= y + d: x's upper bounds from y's, y's lower bounds from x's."""
        rx, ry = self.range(x, env), self.range(y, env)
        add: list[tuple[object, tuple[SizeForm, ...], tuple[SizeForm, ...]]] = []
        if len(ry) == 1 and ry[0].uppers:
            add.append((self.key(x), (), tuple(u + SizeForm.of(d) for u in ry[0].uppers)))
        if len(rx) == 1 and rx[0].lowers:
            add.append((self.key(y), tuple(lo - SizeForm.of(d) for lo in rx[0].lowers), ()))
        return env + tuple(add)


def _keeps_value(src: Node, dst: Node) -> bool:
    """A cast that keeps every value: bool or integer into a signed integer at least as wide
    (wider than an unsigned source)."""
    s, t = src.dtype, dst.dtype
    if t.kind != "int":
        return False
    if s.kind == "bool":
        return True
    return (s.kind == "int" and t.itemsize >= s.itemsize) or \
        (s.kind == "uint" and t.itemsize > s.itemsize)


def _widens(n: Node) -> bool:
    """Every value operand of `n` converts to n's dtype unchanged (a where's condition
    aside)."""
    args = n.args[1:] if n.op == Op.WHERE else n.args
    return all(a.dtype == n.dtype or _keeps_value(a, n) for a in args)


def _no_wrap(c: Case) -> Case:
    """The case, or no bounds at all where 64-bit arithmetic could wrap."""
    if all(f.magnitude() < WRAP_LIMIT for f in (*c.lowers, *c.uppers)):
        return c
    return Case()


_BINARY: dict[BinaryOp, Callable[[Analysis, Node, Env], Range]] = {
    BinaryOp.ADD: Analysis._add, BinaryOp.SUB: Analysis._sub, BinaryOp.MUL: Analysis._mul,
    BinaryOp.FLOORDIV: Analysis._floordiv, BinaryOp.MOD: Analysis._mod,
    BinaryOp.SHR: Analysis._shr, BinaryOp.XOR: Analysis._bits, BinaryOp.AND: Analysis._bits,
    BinaryOp.MINIMUM: Analysis._extreme, BinaryOp.MAXIMUM: Analysis._extreme,
}


# --------------------------------------------------------------------------- the sites

def _positions(n: Node) -> frozenset[str]:
    """The axes whose position the expression reads (mf.index) at this element: not under a
    reduction (a reduced axis may be empty)."""
    out, stack, seen = set(), [n], set()
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if m.op == Op.INDEX:
            out.add(m.attr)
        if m.op != Op.REDUCE:
            stack.extend(m.args)
    return frozenset(out)


def index_range(graph: Graph, take: Node) -> Range:
    """The range of gather `take`'s index (a TAKE node of `graph`)."""
    idx = take.args[0]
    return Analysis(SizeFacts(graph, _positions(idx))).range(idx)


def in_range(graph: Graph, take: Node) -> bool:
    """Whether gather `take`'s index is provably in [0, size(axis) - 1] for every admissible
    size and value."""
    return index_in_range(graph, take.args[0], take.attr[1])


def index_in_range(graph: Graph, idx: Node, axis: str) -> bool:
    """Whether the integer value `idx` is provably in [0, size(axis) - 1] for every
    admissible size and value (a gather's index, from memory or of a computed value)."""
    sizes = SizeFacts(graph, _positions(idx))
    if not idx.dtype.is_int:
        return False
    last = sizes.form(axis) - SizeForm.of(1)
    r = Analysis(sizes).range(idx)
    return all(any(sizes.nonneg_int(lo) for lo in c.lowers)
               and any(sizes.nonneg_int(last - hi) for hi in c.uppers) for c in r)


def proven_sites(graph: Graph) -> frozenset[int]:
    """The numbers (in `take_sites`) of the gathers whose index is proven in range: their
    kernels read them without a check."""
    return frozenset(k for k, n in enumerate(take_sites(graph)) if in_range(graph, n))
