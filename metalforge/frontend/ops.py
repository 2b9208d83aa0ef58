"""The DSL functions (`mf.exp`, `mf.where`, `mf.sum`, ...). They only work while a kernel is
traced; each records graph nodes through the current `Trace`.

softmax, log_softmax, logsumexp and mean are written here from the primitives (no special
nodes), so every schedule and the reference see only primitives.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Union

from ..dtypes import F32, I64
from ..graph import BinaryOp, Op, RandomOp, ReduceOp, ScanOp, UnaryOp
from . import random as _random
from . import scatter as _scatter
from .tracer import Sym, Trace, current

inf = math.inf


def _trace(args: Sequence[Any], fn: str) -> Trace:
    for a in args:
        if isinstance(a, Sym):
            return a._trace
    return current(f"mf.{fn}")


def _unary(op: UnaryOp) -> Callable[[Any], Sym]:
    def f(x: Any) -> Sym:
        return _trace((x,), op).unary(op, x)
    f.__name__ = f.__qualname__ = op.value
    keeps = op in (UnaryOp.ABS, UnaryOp.FLOOR, UnaryOp.CEIL)
    what = f"Elementwise {op}, as torch.{op}" + (
        " (keeps the dtype)." if keeps else "; integer inputs give f32 results as in torch.")
    f.__doc__ = (f"{what}\n\n    x: a tensor value or a Python number.\n\n"
                 f"    Example::\n\n        @mf.kernel\n        def k(x: \"T[N]\"):\n"
                 f"            return mf.{op}(x)\n")
    return f


exp = _unary(UnaryOp.EXP)
exp2 = _unary(UnaryOp.EXP2)
log = _unary(UnaryOp.LOG)
log2 = _unary(UnaryOp.LOG2)
sqrt = _unary(UnaryOp.SQRT)
rsqrt = _unary(UnaryOp.RSQRT)
sin = _unary(UnaryOp.SIN)
cos = _unary(UnaryOp.COS)
tanh = _unary(UnaryOp.TANH)
sigmoid = _unary(UnaryOp.SIGMOID)
erf = _unary(UnaryOp.ERF)
abs = _unary(UnaryOp.ABS)     # noqa: A001  (the DSL name)
floor = _unary(UnaryOp.FLOOR)
ceil = _unary(UnaryOp.CEIL)


def where(cond: Any, a: Any, b: Any) -> Any:
    """Elementwise select, as torch.where: a where cond is true, else b.

    cond: a bool value (a Python bool picks a branch while tracing); a, b: values or numbers,
    promoted together as torch does.

    Example::

        @mf.kernel
        def relu(x: "T[N]"):
            return mf.where(x > 0, x, 0.0)"""
    if isinstance(cond, bool):
        return a if cond else b
    return _trace((cond, a, b), "where").where(cond, a, b)


def maximum(a: Any, b: Any) -> Sym:
    """Elementwise maximum; NaN propagates (torch.maximum). a, b: values or numbers.

    Example: ``mf.maximum(x, 0.0)`` (a ReLU)."""
    return _trace((a, b), "maximum").binary(BinaryOp.MAXIMUM, a, b)


def minimum(a: Any, b: Any) -> Sym:
    """Elementwise minimum; NaN propagates (torch.minimum). a, b: values or numbers.

    Example: ``mf.minimum(x, y)``."""
    return _trace((a, b), "minimum").binary(BinaryOp.MINIMUM, a, b)


def clamp(x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002  (torch's keyword names)
    """torch.clamp: minimum(maximum(x, min), max); either bound may be left out.

    Example: ``mf.clamp(x, min=-1.0, max=1.0)``."""
    tr = _trace((x, min, max), "clamp")
    if min is None and max is None:
        raise tr.error("mf.clamp needs min=, max= or both")
    y = x if min is None else tr.binary(BinaryOp.MAXIMUM, x, min)
    return y if max is None else tr.binary(BinaryOp.MINIMUM, y, max)


def take(x: Any, axis: str, index: Any) -> Sym:
    """Gather: `x` read at position `index` along `axis` (torch.gather / x[..., index, ...]).

    x:     a tensor argument of the kernel; or, in a quantized projection's epilogue, a value
           computed from its sums, taken along its weight rows with an index proven in range
           (RoPE's partner row inside the q/k projection; docs/reference/quantization.md).
    axis:  one of its axes; the result has x's other axes, each element at its own position,
           and the index's axes.
    index: an integer value: an index expression (mf.index, mf.size, integer arithmetic,
           runtime ints) or an integer tensor whose axes broadcast by name. An index outside
           [0, size of axis) raises IndexError after the launch (nothing is read out of
           bounds), naming the kernel, the tensor and the value.

    With an index per row (``t: "i32[R]"`` into ``x: "T[R, V]"`` along V) the result is one
    value per row, fused into a row reduction: cross-entropy's
    ``mf.logsumexp(x, axis="V") - mf.take(x, axis="V", index=t)``.

    Example::

        @mf.kernel
        def embed(table: "T[V, D]", ids: "i32[N]") -> "T[N, D]":
            return mf.take(table, axis="V", index=ids)
    """
    return _trace((x, index), "take").take(x, axis, index)


def unpack(w: Any, bits: int) -> Sym:
    """The `bits`-bit unsigned integers packed in the u32 words `w`, as i32 values in
    [0, 2**bits): MLX's affine quantization layout (`mx.quantize`, `metalforge.quant`), value k
    at bits [(k % (32/bits)) * bits, ...) of word k / (32/bits), lowest bits first.

    w:    a u32 value whose innermost axis is K/(32/bits) (annotate it "u32[N, K/8]" for 4
          bits); the result is over K instead.
    bits: 1, 2, 4, 8 or 16 (whole values per word).

    Example::

        @mf.kernel
        def dequantize(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]",
                       GS: mf.Const[int] = 64) -> "T[N, K]":
            return mf.unpack(wq, bits=4) * scales + biases   # K/GS broadcasts as k // GS
    """
    return _trace((w,), "unpack").unpack(w, bits)


def index(axis: str) -> Sym:
    """The position along `axis` (i64), broadcast over the other axes: for masks and positions.

    axis: the name of a dim of the kernel's annotations.

    Example::

        @mf.kernel
        def causal_mask(scores: "T[S, L]"):
            return mf.where(mf.index("L") <= mf.index("S"), scores, -mf.inf)"""
    return current("mf.index").index(axis)


def size(axis: str) -> Sym:
    """The size of `axis` (i64, weak like a Python int: `x / mf.size("D")` keeps x's dtype).

    Example: ``mf.sum(x, axis="D") / mf.size("D")`` (what mf.mean computes)."""
    return current("mf.size").size(axis)


# --------------------------------------------------------------------------- reductions

Axes = Union[str, Sequence[str]]       # one axis name, or several (a tuple or a list);
# axis=None: every axis of the value (a full reduction, a 0-d result)


def _axes(tr: Trace, axis: Any, fn: str, x: Any = None) -> tuple[str, ...]:
    if axis is None:                    # every axis of the value: a full reduction
        if not isinstance(x, Sym) or not x._node.axes:
            raise tr.error(f"mf.{fn}: axis=None reduces every axis of the value, but it has "
                           f"none (a scalar)")
        return tuple(x._node.axes)
    if isinstance(axis, (tuple, list)):
        if not axis:
            raise tr.error(f"mf.{fn}: axis=() names no axis")
        if len(set(axis)) != len(axis):
            raise tr.error(f"mf.{fn}: axis={tuple(axis)!r} names an axis twice")
        return tuple(axis)
    return (axis,)


def _reduce_many(kind: ReduceOp, x: Any, axis: Optional[Axes], fn: str,
                 keep_f32: bool = False) -> Sym:
    """One reduction node per axis, each reducing the last's result. A float sum or product
    over several axes adds in f32 throughout and rounds to x's dtype once at the end (as
    torch's x.sum(dim=(...)) does; `keep_f32`: the f32 result, for mf.mean); the schedules
    treat the chain as one reduction over the axes together (schedule/multiaxis)."""
    tr = _trace((x,), fn)
    axes = _axes(tr, axis, fn, x)
    wide = len(axes) > 1 and kind in (ReduceOp.SUM, ReduceOp.PROD) and isinstance(x, Sym) \
        and x.dtype.is_float and x.dtype.itemsize < 4
    out = tr.reduce(kind, x.to("f32") if wide else x, axes[0], f"mf.{fn}")
    for ax in axes[1:]:
        out = tr.reduce(kind, out, ax, f"mf.{fn}")
    return out.to(x.dtype) if wide and not keep_f32 else out


def sum(x: Any, axis: Optional[Axes]) -> Sym:  # noqa: A001
    """Sum over `axis` (a name, a tuple of names, or None for every axis of x), removing it;
    fp32 accumulation; integers sum in i64 as in torch.

    Example: ``mf.sum(x * x, axis="D")`` on ``x: "T[R, D]"`` is ``[R]``;
    ``mf.sum(x, axis=("C", "H", "W"))`` on ``x: "T[N, G, C, H, W]"`` is ``[N, G]``."""
    return _reduce_many(ReduceOp.SUM, x, axis, "sum")


def prod(x: Any, axis: Optional[Axes]) -> Sym:
    """Product over `axis` (a name, a tuple of names, or None for every axis); integers
    multiply in i64 as in torch.

    Example: ``mf.prod(x, axis="D")``."""
    return _reduce_many(ReduceOp.PROD, x, axis, "prod")


def max(x: Any, axis: Optional[Axes]) -> Sym:  # noqa: A001
    """Maximum over `axis` (a name, a tuple of names, or None for every axis); NaN propagates
    (torch.amax).

    Example: ``x - mf.max(x, axis="D")``."""
    return _reduce_many(ReduceOp.MAX, x, axis, "max")


def min(x: Any, axis: Optional[Axes]) -> Sym:  # noqa: A001
    """Minimum over `axis` (a name, a tuple of names, or None for every axis); NaN propagates
    (torch.amin).

    Example: ``mf.min(x, axis="D")``."""
    return _reduce_many(ReduceOp.MIN, x, axis, "min")


def argmax(x: Any, axis: str) -> Sym:
    """Index (i64) of the first maximum along `axis`; a NaN counts as the maximum
    (torch.argmax).

    Example: ``mf.argmax(logits, axis="V")``."""
    _one_axis(x, axis, "argmax")
    return _trace((x,), "argmax").reduce(ReduceOp.ARGMAX, x, axis, "mf.argmax")


def argmin(x: Any, axis: str) -> Sym:
    """Index (i64) of the first minimum along `axis`; a NaN counts as the minimum
    (torch.argmin).

    Example: ``mf.argmin(dist, axis="K")``."""
    _one_axis(x, axis, "argmin")
    return _trace((x,), "argmin").reduce(ReduceOp.ARGMIN, x, axis, "mf.argmin")


def _one_axis(x: Any, axis: Any, fn: str) -> None:
    """argmax/argmin reduce one axis: the flat index over several (torch.argmax without dim)
    is refused at the call, with what to write instead."""
    if axis is None or isinstance(axis, (tuple, list)):
        raise _trace((x,), fn).error(
            f"mf.{fn}(..., axis={axis!r}): {fn} reduces one axis; the flat index over several "
            f"axes (torch.{fn} without dim) is not supported. Annotate the axes as one dim "
            f"(e.g. \"T[N, HW]\" for x.flatten(-2)) and reduce that")


def mean(x: Any, axis: Optional[Axes]) -> Sym:
    """Mean over `axis` (a name, a tuple of names, or None for every axis): sum(x, axis) /
    size(axis) (over several axes: divided by the product of their sizes in f32, rounded once).
    Floating-point values only (torch.mean refuses integers).

    Example::

        @mf.kernel
        def rms_norm(x: "T[*B, D]", w: "T[D]", eps: float = 1e-6):
            return x * mf.rsqrt(mf.mean(x * x, axis="D") + eps) * w"""
    tr = _trace((x,), "mean")
    if isinstance(x, Sym) and not x.dtype.is_float:
        raise tr.error(f"mf.mean needs a floating-point value, got {x.dtype} (torch.mean "
                       "refuses integers too); use mf.mean(x.to(mf.f32), ...)")
    axes = _axes(tr, axis, "mean", x)
    total = _reduce_many(ReduceOp.SUM, x, axes, "mean", keep_f32=True)
    n = tr.size(axes[0])
    for ax in axes[1:]:
        n = n * tr.size(ax)
    out = total / n
    return out.to(x.dtype) if out.dtype != x.dtype else out


def _float_only(x: Any, fn: str) -> None:
    """torch.softmax / log_softmax refuse integer and bool tensors ("not implemented for
    'Byte'"); so do we, at the user's line (in integers, x - max(x) would wrap, too)."""
    if isinstance(x, Sym) and not x.dtype.is_float:
        raise _trace((x,), fn).error(
            f"mf.{fn} needs a floating-point value, got {x.dtype} (torch.{fn} refuses integer "
            f"and bool tensors too); convert first, e.g. mf.{fn}(x.to(mf.f32), ...)")


def softmax(x: Any, axis: str) -> Sym:
    """Softmax over `axis`: exp(x - max) / sum(exp(x - max)); a row of all -inf gives
    NaN, as torch does.

    Example::

        @mf.kernel
        def softmax(x: "T[R, D]"):
            return mf.softmax(x, axis="D")
    Floating-point values only, as in torch."""
    _float_only(x, "softmax")
    e = exp(x - max(x, axis))
    # times the reciprocal of the sum: one division per row instead of one per element (on an
    # H100, f16 softmax over 16384x4096 went from 119 to 97 us). Exact to an ulp of fp32: the
    # sum is at least 1 (the max's own term), so 1 / sum never overflows or goes subnormal
    return e * (1.0 / sum(e, axis))


def log_softmax(x: Any, axis: str) -> Sym:
    """Log-softmax over `axis`: (x - max) - log(sum(exp(x - max))), as torch.log_softmax.
    Floating-point values only, as in torch.

    Example: ``mf.log_softmax(logits, axis="V")``."""
    _float_only(x, "log_softmax")
    s: Sym = x - max(x, axis)
    return s - log(sum(exp(s), axis))


def logsumexp(x: Any, axis: str) -> Sym:
    """log(sum(exp(x))) over `axis`, computed stably like torch.logsumexp: an infinite max is
    replaced by 0 before shifting, so all -inf gives -inf and +inf gives +inf. Integer and
    bool values are converted to f32 first, as torch converts them to its default float dtype.

    Example: ``mf.logsumexp(x, axis="D")``."""
    if isinstance(x, Sym) and not x.dtype.is_float:
        x = x.to("f32")
    m = max(x, axis)
    m = m._trace.where(abs(m) == inf, 0.0, m)
    return log(sum(exp(x - m), axis)) + m


# --------------------------------------------------------------------------- scatters

def scatter_add(values: Any, axis: str, index: Any, *, deterministic: bool = False,
                dtype: Any = None) -> Sym:
    """Scatter-add: a zeroed output along `axis` where element e of `values` is added at
    position `index[e]` (torch's index_add_ / scatter_add_). The kernel's output.

    values: a value (a Python number counts: 1 makes a histogram).
    axis:   the output's scattered axis: an axis of a tensor argument, whose size it takes
            (V of an embedding table "T[V, D]", B of a bin-edges tensor "T[B]").
    index:  an integer value; its axes are consumed (summed over), the values' other axes
            stay and are matched by name, as gathers match them. An index outside
            [0, size of axis) raises mf.GatherIndexError after the launch (nothing is written
            out of bounds).
    deterministic: False: atomic adds (f32, i32, u32 atomics; f16/bf16 through an f32
            accumulator, cast at the end): fast, but float sums land in a run-dependent order.
            True: the call sorts the index on the device (stable) and each output element sums
            its segment in index order, no atomics: bit-identical across runs (the index must
            be a tensor argument). Integer outputs are exact either way.
    dtype:  the output dtype (f32, f16, bf16, i32, u32); default the values' (i32 for a
            Python int, f32 for a Python float).

    Example::

        @mf.kernel
        def embedding_grad(grad: "T[N, E]", ids: "i32[N]", table: "T[V, E]") -> "T[V, E]":
            return mf.scatter_add(grad, "V", ids)      # table only gives V its size
    """
    return _scatter.scatter_add(_trace((values, index), "scatter_add"), values, axis, index,
                                deterministic, dtype)


# -- scans: inclusive scans along one axis, keeping it --------------------------------------

def _scan(kind: ScanOp, x: Any, axis: str, reverse: bool = False) -> Sym:
    """The SCAN node of `kind` over `axis` of x, with torch's result dtype: cumsum and cumprod
    of integers and bools give i64 (as torch.cumsum does), the others keep x's dtype."""
    fn = f"mf.{kind}"
    tr = _trace((x,), str(kind))
    if not isinstance(x, Sym):
        raise tr.error(f"{fn}: expected a kernel value to scan, got {x!r}")
    axis = tr.check_axis(axis, fn)
    n = x._node
    if axis not in n.axes:
        raise tr.error(f"{fn}: the value has axes {list(n.axes)}, not '{axis}'; a scan runs "
                       f"along an axis the value has")
    if kind in (ScanOp.CUMSUM, ScanOp.CUMPROD) and not n.dtype.is_float:
        n = tr.cast(n, I64)                   # torch.cumsum of an int or bool is int64
    if not isinstance(reverse, bool):
        raise tr.error(f"{fn}: reverse= takes True or False (a trace-time choice), got "
                       f"{reverse!r}")
    attr = (kind, axis, True) if reverse else (kind, axis)
    return tr.sym(tr.node(Op.SCAN, (n,), n.dtype, n.axes, attr=attr))


def cumsum(x: Any, axis: str, *, reverse: bool = False) -> Sym:
    """Inclusive cumulative sum along `axis`, keeping it (torch.cumsum): element i is
    x[0] + ... + x[i]; fp32 accumulation for f16/bf16. Integers and bools give i64 in torch,
    which scan kernels do not compute: write ``mf.cumsum(x.to(mf.f32), axis)``.

    reverse=True (every scan takes it; torch has no such flag): the scan runs from the axis's
    end, element i is x[i] + ... + x[n-1] (torch: ``x.flip(d).cumsum(d).flip(d)``), without
    copying x: the kernel reads and writes mirrored positions. The backward of a scan is one.

    Example::

        @mf.kernel
        def masked_mean_so_far(x: "T[B, L]", m: "T[B, L]"):
            return mf.cumsum(x * m, "L") / mf.cumsum(m, "L")"""
    return _scan(ScanOp.CUMSUM, x, axis, reverse)


def cumprod(x: Any, axis: str, *, reverse: bool = False) -> Sym:
    """Inclusive cumulative product along `axis`, keeping it (torch.cumprod); fp32
    accumulation for f16/bf16; integers give i64 as in torch (use ``x.to(mf.f32)``).

    Example: ``mf.cumprod(1.0 - p, "T")`` (survival probabilities)."""
    return _scan(ScanOp.CUMPROD, x, axis, reverse)


def cummax(x: Any, axis: str, *, reverse: bool = False) -> Sym:
    """Running maximum along `axis`, keeping it and x's dtype. torch.cummax returns
    (values, indices); metalforge returns the values only. A NaN propagates to every later
    element, as in torch. Differentiable as torch's: the gradient goes to the running
    maximum's position (ties: the latest element).

    Example: ``x - mf.cummax(x, "T")`` (drawdown)."""
    return _scan(ScanOp.CUMMAX, x, axis, reverse)


def cummin(x: Any, axis: str, *, reverse: bool = False) -> Sym:
    """Running minimum along `axis`, keeping it and x's dtype (the values of torch.cummin,
    not its indices); a NaN propagates to every later element, as in torch. Differentiable
    as torch's: the gradient goes to the running minimum's position (ties: the latest).

    Example: ``mf.cummin(loss, "step")``."""
    return _scan(ScanOp.CUMMIN, x, axis, reverse)


def logcumsumexp(x: Any, axis: str, *, reverse: bool = False) -> Sym:
    """log(cumsum(exp(x))) along `axis`, computed stably as torch.logcumsumexp (no overflow
    for large x; all -inf so far gives -inf). Floating-point values only, as in torch.

    Example: ``mf.exp(mf.logcumsumexp(x, "T") - y)``."""
    if isinstance(x, Sym) and not x.dtype.is_float:
        raise _trace((x,), "logcumsumexp").error(
            f"mf.logcumsumexp needs a floating-point value, got {x.dtype} (torch.logcumsumexp "
            f"refuses integers too); convert first: mf.logcumsumexp(x.to(mf.f32), ...)")
    return _scan(ScanOp.LOGCUMSUMEXP, x, axis, reverse)


# -- random numbers: counter-based (Philox-4x32-10), one independent draw per element ---------

def rand(seed: Any, *axes: str, like: Any = None, offset: Any = 0, dtype: Any = F32) -> Sym:
    """Uniform random numbers in [0, 1), one per element of the draw's axes: Philox-4x32-10
    keyed by `seed`, its counter the element's row-major position over those axes and
    `offset` (docs/reference/dsl.md, "Random numbers", gives the exact mapping). The kernel,
    its reference and every backend draw bit-identical numbers; nothing is stored, so a
    backward kernel regenerates them from the seed.

    seed:   an integer: a runtime `int` argument (64 bits: the Philox key's two words), a
            Python int or an mf.Const[int]. Anything else is a TraceError at this line.
    axes:   the axes the draw varies over, by name ("R", "D"), or ``like=x`` for x's axes.
            Kept in the kernel's canonical order. A draw over fewer axes than the kernel's
            output repeats along the others, as any value over fewer axes broadcasts.
    offset: an integer like the seed (default 0) selecting another stream of the same seed:
            pass a training step's number as a runtime int, no recompile.
    dtype:  f32 (default, 24 random bits), f16 (11 bits) or bf16 (8 bits): every value is
            exact in its dtype and below 1.

    Example::

        @mf.kernel
        def dropout(x: "T[*B, D]", p: float, seed: int, step: int = 0):
            keep = mf.rand(seed, like=x, offset=step) >= p
            return mf.where(keep, x / (1 - p), 0.0)
    """
    tr = _trace((seed, offset, like), "rand")
    return _random.random(tr, RandomOp.RAND, seed, axes, like, offset, dtype)


def randn(seed: Any, *axes: str, like: Any = None, offset: Any = 0, dtype: Any = F32) -> Sym:
    """Standard normal random numbers, one per element of the draw's axes: two Philox words
    per element through Box-Muller, sqrt(-2 log u1) * cos(2 pi u2), in f32 (|value| <= 5.77).
    The words and u1, u2 are bit-identical everywhere; log, cos and sqrt are each backend's
    f32 functions (a few ulp apart). Arguments as `mf.rand`'s.

    Example::

        @mf.kernel
        def noisy(x: "T[N, D]", sigma: float, seed: int):
            return x + sigma * mf.randn(seed, "N", "D")
    """
    tr = _trace((seed, offset, like), "randn")
    return _random.random(tr, RandomOp.RANDN, seed, axes, like, offset, dtype)
