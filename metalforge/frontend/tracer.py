"""Tracing: symbolic values with named axes that record graph Nodes.

A `Trace` holds what one specialisation needs while the user's function runs: the axis table
(canonical order, derived-dim specs), bound dtype variables and the user's code, to attach
file:line to nodes and errors. `Sym` is the value the user's code sees; its operators build
Nodes with torch's type promotion:

* operands are ranked as torch ranks them: tensors with dims > zero-dim tensors (a value whose
  axes were all reduced away) > weak Python scalars (literals, runtime `float`/`int`/`bool`
  arguments, `mf.size`). A weak scalar only decides the result dtype's *category*
  (f16 * 2.0 -> f16, i32 * 2.5 -> f32, bool + 1 -> i64), as `torch.result_type` does.
* every binary/where node gets operands of one dtype: non-weak operands of another dtype are
  wrapped in explicit "cast" nodes (i32 + f16 -> cast(i32 -> f16) + f16, like torch casts
  to the common dtype); weak scalars stay as they are (f32 width) unless an int/bool scalar
  meets a float computation, where they become f32, so f16 math never rounds a scalar to f16.
* true division of integers, and math functions of integers, produce f32 (torch's default).
"""
from __future__ import annotations

import contextvars
import linecache
import numbers
import os
import re
import sys
from types import FrameType, ModuleType
from typing import Any, Callable, Iterable, NoReturn, Optional

import torch

from .. import dtypes
from ..dtypes import BOOL, F32, I32, I64, U32, DType
from ..errors import TraceError
from ..graph import AxisSpec, BinaryOp, Node, Op, ReduceOp, UnaryOp, broadcasts_over
from .literals import getitem

UNPACK_BITS = (1, 2, 4, 8, 16)      # widths that pack whole values into a 32-bit word

_CURRENT: contextvars.ContextVar[Optional["Trace"]] = contextvars.ContextVar(
    "metalforge_trace", default=None)



def _module_dir(m: ModuleType) -> str:
    assert m.__file__ is not None
    return os.path.dirname(os.path.abspath(m.__file__))


_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP_DIRS: tuple[str, ...] = (_module_dir(torch), _PKG_DIR)
_BOOLS: tuple[type, ...] = (bool,)          # what a Python bool operand may be
try:
    import numpy as _np
    _SKIP_DIRS += (_module_dir(_np),)
    _BOOLS += (_np.bool_,)
except ImportError:     # numpy is a dependency, but tracing does not need it
    pass

MATH_FUNCTIONS = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh",
                  "sigmoid", "erf", "abs", "floor", "ceil")
_FLOAT_FUNCTIONS = frozenset(UnaryOp(f) for f in MATH_FUNCTIONS) - {
    UnaryOp.ABS, UnaryOp.FLOOR, UnaryOp.CEIL}
_COMPARE = (BinaryOp.EQ, BinaryOp.NE, BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE)
_BITWISE = (BinaryOp.AND, BinaryOp.OR, BinaryOp.XOR, BinaryOp.SHL, BinaryOp.SHR)
_SYMBOL = {BinaryOp.ADD: "+", BinaryOp.SUB: "-", BinaryOp.MUL: "*", BinaryOp.DIV: "/",
           BinaryOp.POW: "**", BinaryOp.MOD: "%", BinaryOp.FLOORDIV: "//", BinaryOp.EQ: "==",
           BinaryOp.NE: "!=", BinaryOp.LT: "<", BinaryOp.LE: "<=", BinaryOp.GT: ">",
           BinaryOp.GE: ">=", BinaryOp.AND: "&", BinaryOp.OR: "|", BinaryOp.XOR: "^",
           BinaryOp.SHL: "<<", BinaryOp.SHR: ">>", BinaryOp.MAXIMUM: "mf.maximum",
           BinaryOp.MINIMUM: "mf.minimum"}


def current(what: str) -> "Trace":
    tr = _CURRENT.get()
    if tr is None:
        raise TraceError(f"{what} can only be used inside an @mf.kernel function, while "
                         "metalforge traces it")
    return tr


def user_frame_loc() -> tuple[str, int]:
    """(file, line) of the innermost frame that is the user's code (not metalforge, torch,
    numpy or the standard library)."""
    f: Optional[FrameType] = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not (fn.startswith(_SKIP_DIRS) or fn.startswith("<frozen")):
            return fn, f.f_lineno
        f = f.f_back
    return "<unknown>", 0


# --------------------------------------------------------------------------- promotion

def _category(dt: DType) -> int:
    return 2 if dt.is_float else (0 if dt is BOOL else 1)


class PromotionError(Exception):
    pass


def promote(a: Optional[DType], b: Optional[DType]) -> Optional[DType]:
    if a is None:
        return b
    if b is None:
        return a
    try:
        return dtypes.promote(a, b)
    except RuntimeError as e:
        raise PromotionError(f"torch does not promote {a} with {b} ({e}); convert one side "
                             "explicitly with .to(...)") from None


def _combine(higher: Optional[DType], lower: Optional[DType]) -> Optional[DType]:
    """torch's combine_categories: a lower-priority operand only lifts the category."""
    if higher is None:
        return lower
    if lower is None or higher.is_float:
        return higher
    if higher is BOOL or lower.is_float:
        return promote(higher, lower)
    return higher


def result_type(nodes: Iterable[Node]) -> DType:
    """torch.result_type over nodes: dim tensors > zero-dim tensors > weak scalars."""
    dim = zero = weak = None
    for n in nodes:
        if n.weak:
            weak = promote(weak, n.dtype)
        elif n.axes:
            dim = promote(dim, n.dtype)
        else:
            zero = promote(zero, n.dtype)
    out = _combine(dim, _combine(zero, weak))
    assert out is not None, "the result type of no operand"
    return out


# --------------------------------------------------------------------------- the trace

class Trace:
    def __init__(self, kernel_name: str, kernel_loc: tuple[str, int],
                 axis_specs: dict[str, AxisSpec], dtype_vars: dict[str, DType],
                 param_axes: Optional[dict[str, tuple[str, ...]]] = None):
        self.kernel_name = kernel_name
        self.param_axes = dict(param_axes or {})     # tensor argument -> annotation's axes
        self.kernel_loc = kernel_loc
        self.axis_specs = dict(axis_specs)               # canonical order = insertion order
        self.order = {a: i for i, a in enumerate(self.axis_specs)}
        self.dtype_vars = dict(dtype_vars)

    # -- context ------------------------------------------------------------------------
    def __enter__(self) -> "Trace":
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._token)

    # -- errors -------------------------------------------------------------------------
    def error(self, msg: str, loc: Optional[tuple[str, int]] = None) -> TraceError:
        file, line = loc or user_frame_loc()
        code = linecache.getline(file, line).strip() if line else ""
        shown = f"\n    {code}" if code else ""
        return TraceError(f"{file}:{line}: in kernel '{self.kernel_name}': {msg}{shown}")

    # -- nodes --------------------------------------------------------------------------
    def node(self, op: Op, args: tuple[Node, ...], dtype: DType, axes: tuple[str, ...],
             attr: Any = None, weak: bool = False) -> Node:
        return Node(op, args, dtype, axes, attr=attr, weak=weak, loc=user_frame_loc())

    def sym(self, node: Node) -> "Sym":
        return Sym(node, self)

    def as_node(self, v: Any, what: str = "an operand") -> Node:
        if isinstance(v, Sym):
            if v._trace is not self:
                raise self.error("a value from another kernel's trace was used here")
            return v.node
        if isinstance(v, _BOOLS):
            return self.node(Op.CONST, (), BOOL, (), attr=bool(v), weak=True)
        if isinstance(v, numbers.Integral):
            return self.node(Op.CONST, (), I64, (), attr=int(v), weak=True)
        if isinstance(v, numbers.Real):
            return self.node(Op.CONST, (), F32, (), attr=float(v), weak=True)
        if isinstance(v, torch.Tensor):
            raise self.error("a torch.Tensor captured from outside the kernel cannot be used "
                             "inside it; pass it as an annotated argument")
        raise self.error(f"cannot use {type(v).__name__} {v!r} as {what} in a kernel "
                         "expression (expected a kernel value or a Python number)")

    def axes_of(self, *nodes: Node) -> tuple[str, ...]:
        """Broadcast by axis name: the union of the axes, in canonical order. A derived axis
        that divides its base (K/64) broadcasts against the base (K): element k reads k // 64."""
        names = {a for n in nodes for a in n.axes}
        for a in list(names):
            spec = self.axis_specs[a]
            if spec.derived and spec.base in names:
                if not broadcasts_over(spec):
                    raise self.error(
                        f"cannot combine axis '{a}' with its base '{spec.base}' in one "
                        f"elementwise operation: only a whole division of the base (like "
                        f"'{spec.base}/64') broadcasts against it, element k reading k // 64")
                names.discard(a)
        axes = tuple(sorted(names, key=self.order.__getitem__))
        anonymous = [a for a in axes if self.axis_specs[a].anonymous]    # "w[1]": w's own
        if len({a.split("[")[0] for a in anonymous}) > 1:
            raise self.error(
                f"cannot combine the unnamed literal dims '{anonymous[0]}' and "
                f"'{anonymous[-1]}' of two arguments in one elementwise operation: each is its "
                "own axis, so this would be an outer product; name them alike (\"T[C, K=4]\" "
                "in both annotations) to combine them element by element, or differently "
                "(K=4, J=4) for an outer product")
        for a in axes:
            spec = self.axis_specs[a]
            if spec.derived:
                clash = [b for b in axes if b != a and self.axis_specs[b].base == spec.base]
                if clash:
                    raise self.error(
                        f"cannot combine axis '{a}' with axis '{clash[0]}' in one elementwise "
                        f"operation: both are sizes derived from '{spec.base}'; combine each "
                        f"with '{spec.base}' itself (e.g. after mf.unpack)")
        return axes

    def take(self, x: Any, axis: Any, index: Any) -> "Sym":
        """mf.take: x (a tensor argument) read at position `index` along `axis`."""
        src = self.as_node(x, "the tensor to take from")
        if src.op != Op.LOAD:
            return self.take_value(src, axis, index)
        axis = self.check_axis(axis, "mf.take")
        if axis not in src.axes:
            raise self.error(f"mf.take: '{src.attr}' has axes {list(src.axes)}, not '{axis}'")
        idx = self.as_node(index, "the index")
        if idx.dtype.is_float or idx.dtype is BOOL:
            raise self.error(f"mf.take: the index must be an integer value (an integer tensor, "
                             f"mf.index, mf.size or integer arithmetic), got {idx.dtype}")
        rest = [a for a in src.axes if a != axis]
        names = set(rest) | set(idx.axes)
        axes = tuple(sorted(names, key=self.order.__getitem__))
        if idx.op == Op.CONST:
            idx = self.node(Op.CONST, (), I64, (), attr=idx.attr)
        return self.sym(self.node(Op.TAKE, (idx,), src.dtype, axes, attr=(src.attr, axis)))

    def take_value(self, src: Node, axis: Any, index: Any) -> "Sym":
        """mf.take of a computed value (a TAKE_VALUE node): `src` at position `index` along
        `axis`; only a quantized matvec's epilogue lowers it (the partner of RoPE's rotation
        from the same kernel's sums)."""
        axis = self.check_axis(axis, "mf.take")
        if axis not in src.axes:
            raise self.error(f"mf.take: the value taken from has axes {list(src.axes)}, not "
                             f"'{axis}'")
        idx = self.as_node(index, "the index")
        if idx.dtype.is_float or idx.dtype is BOOL:
            raise self.error(f"mf.take: the index must be an integer value (an integer tensor, "
                             f"mf.index, mf.size or integer arithmetic), got {idx.dtype}")
        names = {a for a in src.axes if a != axis} | set(idx.axes)
        axes = tuple(sorted(names, key=self.order.__getitem__))
        return self.sym(self.node(Op.TAKE_VALUE, (src, idx), src.dtype, axes, attr=axis))

    def unpack(self, w: Any, bits: Any) -> "Sym":
        """mf.unpack: the `bits`-bit integers packed in the u32 words of `w` (MLX layout)."""
        x = self.as_node(w, "the packed words")
        if isinstance(bits, bool) or bits not in UNPACK_BITS:
            raise self.error(f"mf.unpack: bits={bits!r} is not supported; bits must be one of "
                             f"{', '.join(map(str, UNPACK_BITS))} (whole values per 32-bit word; "
                             "MLX's 3, 5 and 6-bit layouts straddle words)")
        if x.dtype is not U32:
            raise self.error(f"mf.unpack needs u32 words, got a {x.dtype} value; annotate the "
                             "packed tensor like \"u32[N, K/8]\"")
        per_word = 32 // bits
        inner = x.axes[-1] if x.axes else None
        spec = self.axis_specs.get(inner) if inner else None
        if spec is None or not (spec.derived and spec.mul == 1 and spec.add == 0
                                and spec.div == per_word):
            raise self.error(f"mf.unpack(..., bits={bits}): the words' innermost axis must be "
                             f"K/{per_word} for some axis K ({per_word} values per word), got "
                             f"axes {list(x.axes)}; annotate it like \"u32[N, K/{per_word}]\"")
        base = spec.base
        assert base is not None
        if base not in self.axis_specs:
            self.axis_specs[base] = AxisSpec(base)
            self.order[base] = len(self.order)
        axes = tuple(sorted((*x.axes[:-1], base), key=self.order.__getitem__))
        return self.sym(self.node(Op.UNPACK, (x,), I32, axes, attr=bits))

    def check_axis(self, axis: Any, fn: str) -> str:
        if not isinstance(axis, str):
            raise self.error(f"{fn}: axis must be an axis name like \"D\", got {axis!r}")
        if axis not in self.axis_specs and any(s.base == axis for s in self.axis_specs.values()):
            self.axis_specs[axis] = AxisSpec(axis)         # L of a "L/BS" dim: its size binds
            self.order[axis] = len(self.order)             # from the derived dim
        if axis not in self.axis_specs:
            raise self.error(f"{fn}: unknown axis '{axis}'; the kernel's axes are "
                             f"{list(self.axis_specs)}")
        return axis

    def promote_or_fail(self, nodes: Iterable[Node], opname: str) -> DType:
        try:
            return result_type(nodes)
        except PromotionError as e:
            raise self.error(f"'{opname}': {e}") from None

    def cast(self, n: Node, dt: DType) -> Node:
        """Bring an operand to the dtype an operation computes in (see module doc)."""
        if n.dtype is dt:
            return n
        if n.weak:
            if not dt.is_float or n.dtype.is_float:
                return n
            if n.op == Op.CONST:
                return self.node(Op.CONST, (), F32, (), attr=float(n.attr), weak=True)
            return self.node(Op.CAST, (n,), F32, n.axes, weak=True)
        return self.node(Op.CAST, (n,), dt, n.axes)

    def round_weak(self, n: Node, dt: DType) -> Node:
        """A weak float scalar rounded to `dt` (kept weak: it already took part in promotion)."""
        if not n.weak or n.dtype is dt:
            return n
        if n.op == Op.CONST:
            v = torch.tensor(float(n.attr), dtype=dt.torch).item()
            return self.node(Op.CONST, (), F32, (), attr=float(v), weak=True)
        return self.node(Op.CAST, (n,), dt, n.axes, weak=True)

    # -- operations ---------------------------------------------------------------------
    def binary(self, op: BinaryOp, a: Any, b: Any) -> "Sym":
        x, y = self.as_node(a), self.as_node(b)
        axes = self.axes_of(x, y)
        sym = _SYMBOL.get(op, op.value)
        common = self.promote_or_fail((x, y), sym)
        if op == BinaryOp.SUB and BOOL in (x.dtype, y.dtype):
            raise self.error("subtracting with a bool operand is not supported (torch refuses "
                             "it too); use ^ or ~ on masks, or .to(...) a number dtype first")
        if op in _BITWISE:
            if common.is_float:
                raise self.error(f"'{sym}' needs integer or bool operands, got {x.dtype} and "
                                 f"{y.dtype}")
            if op in (BinaryOp.SHL, BinaryOp.SHR) and common is BOOL:
                raise self.error(f"'{sym}' on bools is not supported (torch refuses it too)")
        if op == BinaryOp.DIV and not common.is_float:
            common = F32                    # true division of integers gives the default float
        out = BOOL if op in _COMPARE else common
        x, y = self.cast(x, common), self.cast(y, common)
        if op in _COMPARE and common.is_float and common is not F32:
            # torch compares in the common dtype: a float scalar is rounded to f16/bf16 first
            x, y = self.round_weak(x, common), self.round_weak(y, common)
        return self.sym(self.node(Op.BINARY, (x, y), out, axes, attr=op,
                                  weak=x.weak and y.weak))

    def unary(self, op: UnaryOp, a: Any) -> "Sym":
        x = self.as_node(a)
        if op in _FLOAT_FUNCTIONS:
            if not x.dtype.is_float:
                x = self.cast(x, F32)   # torch: math functions of integers give f32
            return self.sym(self.node(Op.UNARY, (x,), x.dtype, x.axes, attr=op, weak=x.weak))
        if op == UnaryOp.NEG and x.dtype is BOOL:
            raise self.error("negating a bool is not supported (torch refuses it too); "
                             "use ~ for logical not")
        if op == UnaryOp.ABS and x.dtype is BOOL:
            raise self.error("abs of a bool is not supported (torch refuses it too)")
        if op in (UnaryOp.FLOOR, UnaryOp.CEIL):
            if x.dtype is BOOL:
                raise self.error(f"{op} of a bool is not supported (torch refuses it too)")
            if not x.dtype.is_float:
                return self.sym(x)     # torch: floor/ceil of an integer is the integer
        if op == UnaryOp.INVERT:
            if x.dtype.is_float:
                raise self.error(f"'~' needs an integer or bool operand, got {x.dtype}")
            if x.dtype is BOOL:
                op = UnaryOp.NOT
        return self.sym(self.node(Op.UNARY, (x,), x.dtype, x.axes, attr=op, weak=x.weak))

    def pow(self, a: Any, b: Any) -> "Sym":
        """x ** n for a Python int 2 <= n <= 4 becomes multiplications (exact, like torch's
        own special cases); n == 1 is x in the promoted dtype; anything else is a pow node."""
        if isinstance(b, numbers.Integral) and not isinstance(b, bool) and 1 <= int(b) <= 4 \
                and isinstance(a, Sym):
            x = self.as_node(a)
            dt = self.promote_or_fail((x, self.as_node(b)), "**")
            xs = self.sym(self.cast(x, dt)) if x.dtype is not dt else a
            if b == 1:
                return xs
            sq = self.binary(BinaryOp.MUL, xs, xs)
            if b == 2:
                return sq
            return self.binary(BinaryOp.MUL, sq, xs if b == 3 else sq)
        x, y = self.as_node(a), self.as_node(b)
        common = self.promote_or_fail((x, y), "**")
        if not common.is_float and y.op == Op.CONST and y.attr < 0:
            raise self.error("integers to negative integer powers are not allowed (as in "
                             "torch); convert to a float dtype first")
        return self.binary(BinaryOp.POW, a, b)

    def where(self, cond: Any, a: Any, b: Any) -> "Sym":
        c = self.as_node(cond, "the condition")
        if c.dtype is not BOOL:
            raise self.error(f"mf.where needs a bool condition, got {c.dtype}; compare "
                             "explicitly, e.g. mf.where(m != 0, a, b)")
        x, y = self.as_node(a), self.as_node(b)
        axes = self.axes_of(c, x, y)
        common = self.promote_or_fail((x, y), "mf.where")
        x, y = self.cast(x, common), self.cast(y, common)
        return self.sym(self.node(Op.WHERE, (c, x, y), common, axes,
                                  weak=c.weak and x.weak and y.weak))

    def to(self, a: Any, dtype: Any) -> "Sym":
        x = self.as_node(a)
        dt = self.resolve_dtype(dtype)
        if dt is x.dtype and not x.weak:
            return self.sym(x)
        return self.sym(self.node(Op.CAST, (x,), dt, x.axes))

    def resolve_dtype(self, dtype: Any) -> DType:
        if isinstance(dtype, DType):
            return dtype
        if isinstance(dtype, torch.dtype):
            try:
                return dtypes.from_torch(dtype)
            except TypeError as e:
                raise self.error(str(e)) from None
        if isinstance(dtype, str):
            if dtype in dtypes.ALL:
                return dtypes.ALL[dtype]
            if dtype in self.dtype_vars:
                return self.dtype_vars[dtype]
        raise self.error(f".to(): unknown dtype {dtype!r}; use a name ({' '.join(dtypes.ALL)}),"
                         f" a dtype variable of the kernel ({', '.join(self.dtype_vars) or 'none'})"
                         ", mf.f16 and friends, or a torch dtype")

    def reduce(self, kind: ReduceOp, a: Any, axis: Any, fn: str) -> "Sym":
        if not isinstance(a, Sym):
            raise self.error(f"{fn}: expected a kernel value to reduce, got {a!r}")
        x = a._node
        axis = self.check_axis(axis, fn)
        if axis not in x.axes:
            raise self.error(f"{fn}: the value has axes {list(x.axes)}, not '{axis}'; a "
                             "reduction removes an axis the value has")
        if kind in (ReduceOp.SUM, ReduceOp.PROD):
            out = x.dtype if x.dtype.is_float else I64   # torch sums integers in int64
        elif kind in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
            out = I64
        else:
            out = x.dtype
        if kind in (ReduceOp.SUM, ReduceOp.PROD):
            x = self.cast(x, out)
        axes = tuple(ax for ax in x.axes if ax != axis)
        return self.sym(self.node(Op.REDUCE, (x,), out, axes, attr=(kind, axis)))

    def index(self, axis: Any) -> "Sym":
        axis = self.check_axis(axis, "mf.index")
        return self.sym(self.node(Op.INDEX, (), I64, (axis,), attr=axis))

    def size(self, axis: Any) -> "Sym":
        axis = self.check_axis(axis, "mf.size")
        return self.sym(self.node(Op.SIZE, (), I64, (), attr=axis, weak=True))


# --------------------------------------------------------------------------- the symbol

Operator = Callable[["Sym", Any], "Sym"]


def _binop(op: BinaryOp) -> tuple[Operator, Operator]:
    """The operator `op` and its reflected form, as methods of Sym."""
    def f(self: Sym, other: Any) -> Sym:
        return self._trace.binary(op, self, other)

    def r(self: Sym, other: Any) -> Sym:
        return self._trace.binary(op, other, self)
    return f, r


class Sym:
    """A traced value: a graph node plus the trace it belongs to. Named axes, torch dtype
    promotion; Python control flow on it is an error (use mf.where)."""
    __slots__ = ("_node", "_trace")
    _node: Node
    _trace: Trace
    __array_priority__ = 1000       # numpy: let our reflected operators win

    def __init__(self, node: Node, trace: Trace):
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_trace", trace)

    @property
    def node(self) -> Node:
        return self._node

    @property
    def dtype(self) -> DType:
        return self._node.dtype

    @property
    def axes(self) -> tuple[str, ...]:
        return self._node.axes

    def __repr__(self) -> str:
        return f"<metalforge value {self._node.dtype}[{', '.join(self._node.axes)}]>"

    __add__, __radd__ = _binop(BinaryOp.ADD)
    __sub__, __rsub__ = _binop(BinaryOp.SUB)
    __mul__, __rmul__ = _binop(BinaryOp.MUL)
    __truediv__, __rtruediv__ = _binop(BinaryOp.DIV)
    __floordiv__, __rfloordiv__ = _binop(BinaryOp.FLOORDIV)
    __mod__, __rmod__ = _binop(BinaryOp.MOD)
    __and__, __rand__ = _binop(BinaryOp.AND)
    __or__, __ror__ = _binop(BinaryOp.OR)
    __xor__, __rxor__ = _binop(BinaryOp.XOR)
    __lshift__, __rlshift__ = _binop(BinaryOp.SHL)
    __rshift__, __rrshift__ = _binop(BinaryOp.SHR)

    def __pow__(self, other: Any) -> "Sym":
        return self._trace.pow(self, other)

    def __rpow__(self, other: Any) -> "Sym":
        return self._trace.pow(other, self)

    def __eq__(self, other: Any) -> "Sym":  # type: ignore[override]
        return self._trace.binary(BinaryOp.EQ, self, other)

    def __ne__(self, other: Any) -> "Sym":  # type: ignore[override]
        return self._trace.binary(BinaryOp.NE, self, other)

    def __lt__(self, other: Any) -> "Sym":
        return self._trace.binary(BinaryOp.LT, self, other)

    def __le__(self, other: Any) -> "Sym":
        return self._trace.binary(BinaryOp.LE, self, other)

    def __gt__(self, other: Any) -> "Sym":
        return self._trace.binary(BinaryOp.GT, self, other)

    def __ge__(self, other: Any) -> "Sym":
        return self._trace.binary(BinaryOp.GE, self, other)

    __hash__ = object.__hash__

    def __neg__(self) -> "Sym":
        return self._trace.unary(UnaryOp.NEG, self)

    def __pos__(self) -> "Sym":
        return self

    def __abs__(self) -> "Sym":
        return self._trace.unary(UnaryOp.ABS, self)

    def __invert__(self) -> "Sym":
        return self._trace.unary(UnaryOp.INVERT, self)

    def to(self, dtype: Any) -> "Sym":
        return self._trace.to(self, dtype)

    # -- what cannot be traced ----------------------------------------------------------
    def __bool__(self) -> NoReturn:
        raise self._trace.error(
            "Python control flow (if, while, and/or/not, bool(), chained comparisons, the "
            "builtins max/min) cannot depend on a traced value: its value is only known when "
            "the kernel runs. Use mf.where(cond, a, b), mf.maximum/mf.minimum, or make the "
            "deciding argument an mf.Const")

    def __len__(self) -> NoReturn:
        raise self._trace.error("len() of a traced value is not known while tracing; use "
                                "mf.size(\"AXIS\") for the size of an axis")

    def __iter__(self) -> NoReturn:
        raise self._trace.error("a traced value cannot be iterated over (loops run at trace "
                                "time); use a reduction like mf.sum(x, axis=\"D\")")

    def __contains__(self, item: Any) -> NoReturn:
        raise self._trace.error("'in' on a traced value is not supported")

    def __getitem__(self, key: Any) -> "Sym":
        """`w[:, j]`: element j (a Python int) of a literal dim, that axis removed
        (see frontend/literals.py); any other index is a TraceError."""
        return self._trace.sym(getitem(self._trace, self._node, key))

    def __matmul__(self, other: Any) -> NoReturn:
        raise self._matmul_error(self, other)

    def __rmatmul__(self, other: Any) -> NoReturn:
        raise self._matmul_error(other, self)

    def _matmul_error(self, a: Any, b: Any) -> TraceError:
        """`a @ b`: axes are named, not positional, so which axis a matrix product contracts
        is not said by `@`; the message spells the product with the axis the operands share."""
        shared = [x for x in getattr(a, "axes", ()) if x in getattr(b, "axes", ())]
        axis = shared[0] if len(shared) == 1 else "K"
        which = (f"'{axis}', the axis both operands have" if len(shared) == 1 else
                 f"the operands share {', '.join(repr(x) for x in shared)}: name the one to "
                 "contract" if shared else "the operands share no axis to contract")
        return self._trace.error(
            "'@' (matrix product) is not supported on traced values: axes are named, not "
            f"positional, so '@' cannot say which one it contracts; write "
            f"mf.sum(a * b, axis=\"{axis}\") ({which})")

    def __setitem__(self, key: Any, value: Any) -> NoReturn:
        raise self._trace.error("assigning into a traced value (x[...] = v) is not supported; "
                                "build a new value with mf.where")

    def _no_python_number(self, *_: Any) -> NoReturn:
        file, line = user_frame_loc()
        called = re.findall(r"\bmath\.(\w+)\s*\(", linecache.getline(file, line))
        hint = (f"use mf.{called[0]}(x) instead of math.{called[0]}(x)"
                if called and called[0] in MATH_FUNCTIONS else
                "use the metalforge functions instead: mf.exp, mf.sqrt, mf.floor, ...")
        raise self._trace.error(
            "a traced value cannot become a Python number (float(), int(), round(), or a "
            f"math.* function called on it); {hint}", (file, line))

    __float__ = __int__ = __index__ = __complex__ = _no_python_number
    __round__ = __trunc__ = __floor__ = __ceil__ = _no_python_number

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise self._trace.error(f"cannot set attribute '{name}' on a traced value")

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):
            raise AttributeError(name)
        trace = object.__getattribute__(self, "_trace")
        hint = (f"; call mf.{name}(x) instead" if name in MATH_FUNCTIONS or name in
                ("sum", "mean", "max", "min", "prod", "argmax", "argmin", "softmax",
                 "log_softmax", "logsumexp", "clamp", "maximum", "minimum") else
                "; traced values have .to(dtype), .dtype and .axes")
        raise trace.error(f"a traced value has no attribute '{name}'{hint}")

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> NoReturn:
        tr = next((a._trace for a in list(args) + list((kwargs or {}).values())
                   if isinstance(a, Sym)), None) or current("torch functions")
        name = getattr(func, "__name__", str(func))
        alt = f"mf.{name}" if name in MATH_FUNCTIONS or name in ("where", "maximum", "minimum",
                                                                 "clamp", "sum", "mean") \
            else "the matching mf function"
        raise tr.error(f"torch.{name} cannot be called on a traced value; use {alt}")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> NoReturn:
        name = getattr(ufunc, "__name__", str(ufunc))
        raise self._trace.error(f"numpy.{name} cannot be called on a traced value; use "
                                f"mf.{name} (or the matching mf function)")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> NoReturn:
        name = getattr(func, "__name__", str(func))
        raise self._trace.error(f"numpy.{name} cannot be called on a traced value; use the "
                                "matching mf function")
