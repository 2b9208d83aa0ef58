"""Graph nodes → IR statements computing one element: shared by every schedule family.

`ElementLowering` walks the nodes a set of outputs needs, in dependency order, and emits one
`Decl` per computed value. f16/bf16 values are computed in f32 (`DType.compute`); conversions
between compute types are explicit casts. How a tensor element, an axis position or an axis size
is read is the schedule's business, passed in as callbacks.

Integer arithmetic wraps at the value's own width, as torch's does (`wrap_int`): MSL promotes
char/short operands to int, so a narrow result is converted back to its type explicitly
(unsigned narrow values compute in uint, where u16 * u16 cannot overflow an int); signed
32/64-bit add, sub, mul and negation, whose overflow is undefined in MSL as in C++, compute in the
unsigned type of the same width and convert back (two's complement wrap). Shifts by the width or
more and min // -1 follow torch through helpers (`mf_shl`, `mf_shr`, `mf_floordiv`).
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

from .. import ir
from ..dtypes import BOOL, F32, DType, promote
from ..errors import UnsupportedConstruct, at
from ..graph import BinaryOp, Graph, Node, Op, UnaryOp, literal_index, take_sites, topo_order
from . import random, ranges
from .base import IDX
from .names import index_name, value_name

# math functions that have a precise:: form in MSL (the fast forms lose accuracy)
_PRECISE_UNARY = {f: f.value for f in (UnaryOp.EXP, UnaryOp.EXP2, UnaryOp.LOG, UnaryOp.LOG2,
                                         UnaryOp.SQRT, UnaryOp.RSQRT, UnaryOp.SIN, UnaryOp.COS,
                                         UnaryOp.TANH)}   # the MSL function of the same name
_FLOAT_RESULT = set(_PRECISE_UNARY) | {UnaryOp.SIGMOID, UnaryOp.ERF}
_ARITH = {BinaryOp.ADD: "+", BinaryOp.SUB: "-", BinaryOp.MUL: "*", BinaryOp.DIV: "/",
          BinaryOp.AND: "&", BinaryOp.OR: "|", BinaryOp.XOR: "^", BinaryOp.SHL: "<<",
          BinaryOp.SHR: ">>"}
_COMPARE = {BinaryOp.EQ: "==", BinaryOp.NE: "!=", BinaryOp.LT: "<", BinaryOp.LE: "<=",
            BinaryOp.GT: ">", BinaryOp.GE: ">="}
_UNSIGNED = {"int": "uint", "long": "ulong"}       # signed types whose overflow is undefined


def wrap_int(op: str, args: tuple[ir.Expr, ...], dt: DType) -> ir.Expr:
    """C operator `op` ("+", "-", "*", "-" unary with one arg, ...) on integer operands of
    dtype dt, with torch's wrapping at dt's width and no undefined behaviour in MSL. A shift
    ("<<", ">>") must have an amount in [0, width)."""
    t = compute_type(dt)

    def e(xs: tuple[ir.Expr, ...]) -> ir.Expr:
        return ir.Unary(op, xs[0]) if len(xs) == 1 else ir.Binary(op, *xs)
    if dt.itemsize < 4:
        # narrow: the operands promote to int (uint for unsigned types); convert back. Left
        # shifts go through uint (shifting a negative int left is undefined)
        if dt.kind == "uint" and op in ("+", "-", "*"):
            args = tuple(ir.Cast("uint", a) for a in args)
        elif op == "<<":
            args = (ir.Cast("uint", args[0]), args[1])
        return ir.Cast(t, e(args))
    if t in _UNSIGNED and op in ("+", "-", "*"):
        return ir.Cast(t, e(tuple(ir.Cast(_UNSIGNED[t], a) for a in args)))
    if t in _UNSIGNED and op == "<<":
        return ir.Cast(t, e((ir.Cast(_UNSIGNED[t], args[0]), args[1])))
    return e(args)


def unpack_value(word: ir.Expr, shift: ir.Expr, bits: int) -> ir.Expr:
    """The packing building block: the `bits`-bit value at bit `shift` of a u32 `word`, as an
    int: `int((word >> shift) & mask)`."""
    mask = ir.Lit((1 << bits) - 1, "uint")
    return ir.Cast("int", (word >> shift) & mask)


def compute_type(dt: DType) -> str:
    """The MSL type a value of dtype `dt` is computed in."""
    return dt.compute.msl


def as_float(e: ir.Expr, n: Node) -> ir.Expr:
    """Node `n`'s lowered value `e` as fp32 (accumulators, threadgroup tiles)."""
    return e if compute_type(n.dtype) == "float" else ir.Cast("float", e)


def lit(value: int | float | bool, dt: DType) -> ir.Lit:
    c = dt.compute
    if c.kind == "bool":
        return ir.Lit(bool(value), "bool")
    if c.is_float:
        return ir.Lit(float(value), compute_type(dt))
    return ir.Lit(int(value), compute_type(dt))


def convert(e: ir.Expr, src: DType, dst: DType) -> ir.Expr:
    """e (computed as src.compute) as a dst.compute value."""
    s, d = src.compute, dst.compute
    if s == d:
        return e
    if isinstance(e, ir.Lit):
        return lit(e.value, dst)
    return ir.Cast(compute_type(dst), e)


def value_gather_refused(n: Node) -> UnsupportedConstruct:
    """The error for a gather of a computed value (TAKE_VALUE) where no schedule serves it."""
    return UnsupportedConstruct(
        f"mf.take(..., axis={n.attr!r}){at(n.loc)} gathers a computed value, not a tensor "
        f"argument: only a quantized matvec's epilogue gathers its own results (along the "
        f"weight rows, index proven in range); elsewhere compute the value in one kernel and "
        f"take from it, an argument, in the next")


class ElementLowering:
    """Lowers the nodes behind some outputs into per-element statements.

    load(node) -> Expr        the stored element of tensor node.attr, as its compute type
    position(axis) -> Expr    this element's position along an axis (index type)
    size(axis) -> Expr        the size of an axis (index type)
    scalar(name) -> str       the MSL name of a runtime scalar parameter
    shift(node) -> Expr       for an UNPACK node: the bit offset of this element's value in its
                              word (default: (position % values per word) * bits); schedules
                              that know the element's slot in the word pass a literal
    take(node, pos) -> Expr   for a TAKE node: its tensor's element at position `pos` (checked
                              to be in range) along the node's axis, this element's elsewhere
    linear(axes) -> DrawPosition   for a RANDOM node: the element's position over `axes`
                              where the schedule has it at hand (the grid's own index, a
                              vector chunk's start and lane: `schedule.random.DrawPosition`),
                              None to build it from positions and sizes (default)
    """

    def __init__(self, graph: Graph, load: Callable[[Node], ir.Expr],
                 position: Callable[[str], ir.Expr], size: Callable[[str], ir.Expr],
                 scalar: Callable[[str], str], prefix: str = "mf_v",
                 shift: Optional[Callable[[Node], ir.Expr]] = None,
                 take: Optional[Callable[[Node, ir.Expr], ir.Expr]] = None,
                 proven: Optional[frozenset[int]] = None,
                 linear: Optional[Callable[[tuple[str, ...]],
                                         Optional[random.DrawPosition]]] = None,
                 take_value: Optional[Callable[[Node, ir.Expr],
                                               tuple[list[ir.Stmt], ir.Expr]]] = None):
        self.graph = graph
        self.linear = linear        # a schedule's own linear position over some axes, or None
        # the gathers (take_sites numbers) read without a check; None: those `ranges` proves
        self.proven = ranges.proven_sites(graph) if proven is None else proven
        self.load, self.position, self.size, self.scalar = load, position, size, scalar
        self.shift = shift or self._shift
        self.take = take
        self.take_value = take_value      # mf.take of a computed value: (statements, value)
        self.pending: list[ir.Stmt] = []          # statements a value needs before its Decl
        self.prefix = prefix
        self.helpers: set[str] = set()
        self.values: dict[Node, ir.Expr] = {}
        self._positions: dict[tuple[object, DType], Node] = {}   # the INDEX node of each axis
        self._ids = itertools.count(1)          # numbers of mf_v<k> values, mf_take<k> checks

    # -- walking ------------------------------------------------------------------------
    def lower(self, roots: list[Node]) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        for n in topo_order(roots, seen=self.values):
            if n in self.values:
                continue
            if n.op == Op.INDEX:        # mf.index("L") read twice: one mf_index_L
                first = self._positions.setdefault((n.attr, n.dtype), n)
                if first is not n:
                    self.values[n] = self.values[first]
                    continue
            e = self._expr(n)
            out += self._drain()
            if isinstance(e, (ir.Lit, ir.Var)) or n.op in (Op.SCALAR, Op.CONST, Op.SIZE):
                self.values[n] = e
                continue
            name = self._name(n)
            out.append(ir.Decl(name, compute_type(n.dtype), e))
            self.values[n] = ir.Var(name)
        return out

    def value(self, n: Node) -> ir.Expr:
        return self.values[n]

    def _drain(self) -> list[ir.Stmt]:
        """The pending statements (a gather's index check), handed over once."""
        out = list(self.pending)
        self.pending.clear()
        return out

    def _name(self, n: Node) -> str:
        if n.op == Op.LOAD:         # a tensor named like a schedule's own variable: mf_in_k
            return value_name(n.attr)
        if n.op == Op.INDEX:
            return index_name(_ident(n.attr))
        return f"{self.prefix}{next(self._ids)}"

    # -- one node -----------------------------------------------------------------------
    def _arg(self, n: Node, i: int, dt: DType) -> ir.Expr:
        a = n.args[i]
        return convert(self.values[a], a.dtype, dt)

    def _expr(self, n: Node) -> ir.Expr:
        op = n.op
        if op == Op.LOAD:
            return self.load(n)
        if op == Op.SCALAR:
            p = self.graph.scalar(n.attr)
            return convert(ir.Var(self.scalar(n.attr)), p.dtype, n.dtype)
        if op == Op.CONST:
            return lit(n.attr, n.dtype)
        if op == Op.INDEX:
            return ir.Cast(compute_type(n.dtype), self.position(n.attr))
        if op == Op.SIZE:
            return ir.Cast(compute_type(n.dtype), self.size(n.attr))
        if op == Op.CAST:
            return self._cast(n)
        if op == Op.WHERE:
            return ir.Select(self._arg(n, 0, BOOL), self._arg(n, 1, n.dtype),
                             self._arg(n, 2, n.dtype))
        if op == Op.UNARY:
            return self._unary(n)
        if op == Op.BINARY:
            return self._binary(n)
        if op == Op.TAKE:
            return self._take(n)
        if op == Op.TAKE_VALUE:
            return self._take_value(n)
        if op == Op.UNPACK:
            return unpack_value(self.values[n.args[0]], self.shift(n), n.attr)
        if op == Op.RANDOM:
            return self._random(n)
        if op == Op.REDUCE:
            kind, axis = n.attr
            raise UnsupportedConstruct(f"mf.{kind} over axis '{axis}'{at(n.loc)} is a reduction, "
                                       f"which this schedule cannot lower")
        raise UnsupportedConstruct(f"graph op '{op}'{at(n.loc)} is not supported")

    def _random(self, n: Node) -> ir.Expr:
        """mf.rand / mf.randn: Philox at this element's linear position over the draw's axes
        (`schedule.random`); f16/bf16 draws round from f32, as any f16 value computes."""
        at_ = self.linear(n.axes) if self.linear is not None else None
        pos = at_ if at_ is not None else random.linear_position(n.axes, self.position,
                                                                 self.size)
        e, helpers = random.random_value(n, self.values[n.args[0]], self.values[n.args[1]], pos)
        self.helpers.update(helpers)
        return e

    def _take(self, n: Node) -> ir.Expr:
        """A gather: the index checked against the axis; out of range, the kernel records the
        error (flag, which gather, the value) in mf_err and reads position 0 instead."""
        name, axis = n.attr
        known = literal_index(self.graph, n)
        if self.take is None and known is not None:
            return self._literal_load(n, known)
        if self.take is None:
            raise UnsupportedConstruct(f"mf.take(..., axis={axis!r}){at(n.loc)}: gathers are "
                                       "supported in elementwise kernels, in row reductions "
                                       "(per element or one value per row), as one value per "
                                       "column of a column reduction and in attention (not in "
                                       "column reductions' element values, nor in quantized "
                                       "reductions)")
        return self.take(n, self._checked(n))

    def _take_value(self, n: Node) -> ir.Expr:
        """mf.take of a computed value, where the schedule serves it (a quantized matvec's
        staged epilogue: `schedule/quant/gathers.py`); refused elsewhere."""
        if self.take_value is None:
            raise value_gather_refused(n)
        stmts, value = self.take_value(n, ir.Cast(IDX, self.values[n.args[1]]))
        self.pending.extend(stmts)
        return value

    def _literal_load(self, n: Node, known: int) -> ir.Expr:
        """`w[:, j]` where the schedule serves no gathers (a row's per-row values): the
        tensor's element at position j of the literal axis, this element's elsewhere (the
        tensor is dense: the offset is the row-major sum over its axes)."""
        name, axis = n.attr
        t = self.graph.tensor(name)
        e: ir.Expr = ir.Lit(0, IDX)
        for i, a in enumerate(t.axes):
            p = ir.Lit(known, IDX) if a == axis else ir.Cast(IDX, self.position(a))
            e = p if i == 0 else e * self.size(a) + p
        return ir.Cast(compute_type(t.dtype), ir.Load(self.scalar(name), e))

    def gather_position(self, n: Node, report_if: Optional[ir.Expr] = None
                        ) -> tuple[list[ir.Stmt], ir.Expr]:
        """For a TAKE node: the statements that compute and check its index, and the checked
        position along its axis (for schedules that load or fetch the gathered elements
        themselves). `report_if`: an out-of-range index is reported only where this holds
        (a thread computing indices for positions past the end of its row)."""
        out = self.lower([n.args[0]])
        pos = self._checked(n, report_if)
        return out + self._drain(), pos

    def _checked(self, n: Node, report_if: Optional[ir.Expr] = None) -> ir.Expr:
        """The index of gather `n`, checked: out of range, the error is recorded in mf_err
        (where `report_if` holds, if given) and position 0 read instead. A gather in
        `proven` is read as it is (where `report_if` holds: elsewhere, past the end of a row,
        position 0, as its index is proven only for positions inside the row)."""
        name, axis = n.attr
        known = literal_index(self.graph, n)
        if known is not None:           # w[:, j]: a constant element of a literal dim
            return ir.Lit(known, IDX)
        site = take_sites(self.graph).index(n)
        if site in self.proven:     # in range by `ranges.in_range`: no check, no report
            self.pending.append(ir.Comment(f"gather {site} from '{name}' along {axis}: index "
                                           f"proven in range, read unchecked"))
            pos = ir.Cast(IDX, self.values[n.args[0]])
            return pos if report_if is None else ir.Select(report_if, pos, ir.Lit(0, IDX))
        count = next(self._ids)
        i, ok = f"mf_take{count}", f"mf_take{count}_ok"
        idx = ir.Var(i)
        zero = ir.Lit(0, "long")
        bad = ir.Unary("!", ir.Var(ok))
        self.pending.extend([
            ir.Decl(i, "long", ir.Cast("long", self.values[n.args[0]])),
            ir.Decl(ok, "bool", (idx >= zero).and_(idx < ir.Cast("long", self.size(axis)))),
            ir.If(bad if report_if is None else bad.and_(report_if), [
                ir.Comment(f"index out of range: report it (gather {site}, from '{name}')"),
                ir.Store("mf_err", ir.Lit(0, "uint"), ir.Lit(1, "int")),
                ir.Store("mf_err", ir.Lit(1, "uint"), ir.Lit(site, "int")),
                ir.Store("mf_err", ir.Lit(2, "uint"), ir.Cast("int", idx)),
                ir.Store("mf_err", ir.Lit(3, "uint"), ir.Cast("int", idx >> ir.Lit(32, "long")))])])
        return ir.Select(ir.Var(ok), ir.Cast(IDX, idx), ir.Lit(0, IDX))

    def _shift(self, n: Node) -> ir.Expr:
        """Where this element's value sits in its word: (k % values per word) * bits."""
        base = next(a for a in n.axes if a not in n.args[0].axes)
        k = self.position(base)
        per_word = ir.Lit(32 // n.attr, "uint")
        return ir.Cast("uint", k % per_word) * ir.Lit(n.attr, "uint")

    def _cast(self, n: Node) -> ir.Expr:
        src = n.args[0]
        x = self.values[src]
        dst = n.dtype
        if dst.compute == F32 and dst != F32:
            if src.op == Op.UNPACK and src.attr <= 8:
                # unpacked values, 0 .. 2^bits - 1, are exact in half and bfloat alike
                return convert(x, src.dtype, F32)
            # round through the narrow storage type so the value is what torch would hold
            return ir.Cast("float", ir.Cast(dst.msl, convert(x, src.dtype, F32)))
        if dst.kind == "bool" and src.dtype.kind != "bool":
            return x.ne(lit(0, src.dtype))
        return convert(x, src.dtype, dst)

    def _unary(self, n: Node) -> ir.Expr:
        f = n.attr
        dt = n.dtype
        x = self._arg(n, 0, dt)
        if f in _PRECISE_UNARY:
            return ir.Call(_PRECISE_UNARY[f], (x,), precise=True)
        if f == UnaryOp.SIGMOID:
            one = lit(1.0, dt)
            y = one + ir.Call("exp", (ir.Unary("-", x),), precise=True)
            if compute_type(dt) != "float":
                return one / y
            # y = 1 + exp(-x) lies in [1, inf] (or is NaN): fast::divide's range, except that
            # where y > 2^126 the quotient (below 2^-126) may flush to 0; 1 / inf is 0
            return ir.Call("fast::divide", (one, y))
        if f == UnaryOp.ERF:
            self.helpers.add("mf_erf")
            return ir.Call("mf_erf", (x,))
        if f == UnaryOp.NEG:
            return wrap_int("-", (x,), dt) if dt.is_int else ir.Unary("-", x)
        if f == UnaryOp.ABS:
            if dt.kind in ("uint", "bool"):
                return x
            # abs(min) is min, as in torch (and Metal's abs)
            if dt.itemsize < 4 and dt.is_int:
                return ir.Cast(compute_type(dt), ir.Call("abs", (x,)))
            return ir.Call("abs", (x,))
        if f in (UnaryOp.FLOOR, UnaryOp.CEIL):
            return ir.Call(f, (x,)) if dt.is_float else x
        if f == UnaryOp.INVERT:
            return ir.Unary("!", x) if dt.kind == "bool" else wrap_int("~", (x,), dt)
        if f == UnaryOp.NOT:
            return ir.Unary("!", self._arg(n, 0, BOOL))
        raise UnsupportedConstruct(f"unary function '{f}'{at(n.loc)} is not supported")

    def _binary(self, n: Node) -> ir.Expr:
        f = n.attr
        dt = n.dtype
        if f in _COMPARE:
            a, b = n.args
            common = promote(a.dtype, b.dtype)
            return ir.Binary(_COMPARE[f], self._arg(n, 0, common), self._arg(n, 1, common))
        x, y = self._arg(n, 0, dt), self._arg(n, 1, dt)
        if f in _ARITH:
            if dt.kind == "bool" and f in (BinaryOp.ADD, BinaryOp.MUL):   # bool + bool: logical
                return ir.Binary("|" if f == BinaryOp.ADD else "&", x, y)
            if dt.is_int and f in (BinaryOp.SHL, BinaryOp.SHR):
                if isinstance(y, ir.Lit) and 0 <= int(y.value) < 8 * dt.itemsize:
                    return wrap_int(_ARITH[f], (x, y), dt)
                # a shift by the width or more is undefined in MSL; torch gives 0 (or -1)
                self.helpers.add(f"mf_{f}")
                return ir.Call(f"mf_{f}", _typed(x, y))
            if dt.is_int:
                return wrap_int(_ARITH[f], (x, y), dt)
            if f == BinaryOp.DIV and compute_type(dt) == "float":
                # within 2.5 ulp (codegen/helpers.metal): no correctly rounded division
                self.helpers.add("mf_divide")
                return ir.Call("mf_divide", (x, y))
            return ir.Binary(_ARITH[f], x, y)
        x, y = _typed(x, y)
        if f in (BinaryOp.MAXIMUM, BinaryOp.MINIMUM):
            self.helpers.add(f"mf_{f}")
            return ir.Call(f"mf_{f}", (x, y))
        if f == BinaryOp.POW:
            if dt.is_float:
                self.helpers.add("mf_pow")
                return ir.Call("mf_pow", (x, y))
            self.helpers.add("mf_ipow")
            return ir.Call("mf_ipow", (x, y))
        if f == BinaryOp.MOD:
            h = "mf_fremainder" if dt.is_float else "mf_remainder"
            self.helpers.add(h)
            return ir.Call(h, (x, y))
        if f == BinaryOp.FLOORDIV:
            if dt.is_float:
                return ir.Call("floor", (x / y,))
            self.helpers.add("mf_floordiv")
            return ir.Call("mf_floordiv", (x, y))
        raise UnsupportedConstruct(f"binary operation '{f}'{at(n.loc)} is not supported")


def _typed(*args: ir.Expr) -> tuple[ir.Expr, ...]:
    """Operands of a helper that is a template over one type: a literal takes that type
    explicitly (an MSL literal is an int or uint, never a char, short or long)."""
    return tuple(ir.Cast(a.type, a) if isinstance(a, ir.Lit) and
                 a.type not in ("int", "uint", "float", "bool") else a for a in args)


def _ident(axis: str) -> str:
    """An axis name as part of an identifier: "K/8" → "K_div8", "w[1]" → "w_dim1"."""
    out = axis
    for a, b in (("/", "_div"), ("*", "_mul"), ("+", "_add"), ("-", "_sub"), (" ", ""),
                 ("[", "_dim"), ("]", "")):
        out = out.replace(a, b)
    return out


ident = _ident
