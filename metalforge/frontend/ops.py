"""The DSL functions (`mf.exp`, `mf.where`, `mf.sum`, ...). They only work while a kernel is
traced; each records graph nodes through the current `Trace`.

softmax, log_softmax, logsumexp and mean are written here from the primitives (no special
nodes), so every schedule and the reference see only primitives.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from .tracer import Sym, Trace, current

inf = math.inf


def _trace(args: Sequence[Any], fn: str) -> Trace:
    for a in args:
        if isinstance(a, Sym):
            return a._trace
    return current(f"mf.{fn}")


def _unary(op: str):
    def f(x):
        return _trace((x,), op).unary(op, x)
    f.__name__ = f.__qualname__ = op
    keeps = op in ("abs", "floor", "ceil")
    what = f"Elementwise {op}, as torch.{op}" + (
        " (keeps the dtype)." if keeps else "; integer inputs give f32 results as in torch.")
    f.__doc__ = (f"{what}\n\n    x: a tensor value or a Python number.\n\n"
                 f"    Example::\n\n        @mf.kernel\n        def k(x: \"T[N]\"):\n"
                 f"            return mf.{op}(x)\n")
    return f


exp = _unary("exp")
exp2 = _unary("exp2")
log = _unary("log")
log2 = _unary("log2")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
sin = _unary("sin")
cos = _unary("cos")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
erf = _unary("erf")
abs = _unary("abs")     # noqa: A001  (the DSL name)
floor = _unary("floor")
ceil = _unary("ceil")


def where(cond, a, b):
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


def maximum(a, b):
    """Elementwise maximum; NaN propagates (torch.maximum). a, b: values or numbers.

    Example: ``mf.maximum(x, 0.0)`` (a ReLU)."""
    return _trace((a, b), "maximum").binary("maximum", a, b)


def minimum(a, b):
    """Elementwise minimum; NaN propagates (torch.minimum). a, b: values or numbers.

    Example: ``mf.minimum(x, y)``."""
    return _trace((a, b), "minimum").binary("minimum", a, b)


def clamp(x, min=None, max=None):  # noqa: A002  (torch's keyword names)
    """torch.clamp: minimum(maximum(x, min), max); either bound may be left out.

    Example: ``mf.clamp(x, min=-1.0, max=1.0)``."""
    tr = _trace((x, min, max), "clamp")
    if min is None and max is None:
        raise tr.error("mf.clamp needs min=, max= or both")
    y = x if min is None else tr.binary("maximum", x, min)
    return y if max is None else tr.binary("minimum", y, max)


def take(x, axis: str, index):
    """Gather: `x` read at position `index` along `axis` (torch.gather / x[..., index, ...]).

    x:     a tensor argument of the kernel.
    axis:  one of its axes; the result has x's other axes, each element at its own position,
           and the index's axes.
    index: an integer value: an index expression (mf.index, mf.size, integer arithmetic,
           runtime ints) or an integer tensor whose axes broadcast by name. An index outside
           [0, size of axis) raises IndexError after the launch (nothing is read out of
           bounds), naming the kernel, the tensor and the value.

    Example::

        @mf.kernel
        def embed(table: "T[V, D]", ids: "i32[N]") -> "T[N, D]":
            return mf.take(table, axis="V", index=ids)
    """
    return _trace((x, index), "take").take(x, axis, index)


def unpack(w, bits: int):
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


def index(axis: str):
    """The position along `axis` (i64), broadcast over the other axes: for masks and positions.

    axis: the name of a dim of the kernel's annotations.

    Example::

        @mf.kernel
        def causal_mask(scores: "T[S, L]"):
            return mf.where(mf.index("L") <= mf.index("S"), scores, -mf.inf)"""
    return current("mf.index").index(axis)


def size(axis: str):
    """The size of `axis` (i64, weak like a Python int: `x / mf.size("D")` keeps x's dtype).

    Example: ``mf.sum(x, axis="D") / mf.size("D")`` (what mf.mean computes)."""
    return current("mf.size").size(axis)


# --------------------------------------------------------------------------- reductions

def _axes(tr: Trace, axis, fn: str) -> tuple[str, ...]:
    if isinstance(axis, (tuple, list)):
        if not axis:
            raise tr.error(f"mf.{fn}: axis=() names no axis")
        return tuple(axis)
    return (axis,)


def _reduce_many(kind: str, x, axis, fn: str):
    tr = _trace((x,), fn)
    for ax in _axes(tr, axis, fn):
        x = tr.reduce(kind, x, ax, f"mf.{fn}")
    return x


def sum(x, axis):  # noqa: A001
    """Sum over `axis` (a name or a tuple of names), removing it; fp32 accumulation;
    integers sum in i64 as in torch.

    Example: ``mf.sum(x * x, axis="D")`` on ``x: "T[R, D]"`` is ``[R]``."""
    return _reduce_many("sum", x, axis, "sum")


def prod(x, axis):
    """Product over `axis` (a name or a tuple of names); integers multiply in i64 as in torch.

    Example: ``mf.prod(x, axis="D")``."""
    return _reduce_many("prod", x, axis, "prod")


def max(x, axis):  # noqa: A001
    """Maximum over `axis` (a name or a tuple of names); NaN propagates (torch.amax).

    Example: ``x - mf.max(x, axis="D")``."""
    return _reduce_many("max", x, axis, "max")


def min(x, axis):  # noqa: A001
    """Minimum over `axis` (a name or a tuple of names); NaN propagates (torch.amin).

    Example: ``mf.min(x, axis="D")``."""
    return _reduce_many("min", x, axis, "min")


def argmax(x, axis: str):
    """Index (i64) of the first maximum along `axis`; a NaN counts as the maximum
    (torch.argmax).

    Example: ``mf.argmax(logits, axis="V")``."""
    return _trace((x,), "argmax").reduce("argmax", x, axis, "mf.argmax")


def argmin(x, axis: str):
    """Index (i64) of the first minimum along `axis`; a NaN counts as the minimum
    (torch.argmin).

    Example: ``mf.argmin(dist, axis="K")``."""
    return _trace((x,), "argmin").reduce("argmin", x, axis, "mf.argmin")


def mean(x, axis):
    """Mean over `axis` (a name or a tuple of names): sum(x, axis) / size(axis).
    Floating-point values only (torch.mean refuses integers).

    Example::

        @mf.kernel
        def rms_norm(x: "T[*B, D]", w: "T[D]", eps: float = 1e-6):
            return x * mf.rsqrt(mf.mean(x * x, axis="D") + eps) * w"""
    tr = _trace((x,), "mean")
    if isinstance(x, Sym) and not x.dtype.is_float:
        raise tr.error(f"mf.mean needs a floating-point value, got {x.dtype} (torch.mean "
                       "refuses integers too); use mf.mean(x.to(mf.f32), ...)")
    axes = _axes(tr, axis, "mean")
    total = _reduce_many("sum", x, axes, "mean")
    n = tr.size(axes[0])
    for ax in axes[1:]:
        n = n * tr.size(ax)
    return total / n


def _float_only(x, fn: str) -> None:
    """torch.softmax / log_softmax refuse integer and bool tensors ("not implemented for
    'Byte'"); so do we, at the user's line (in integers, x - max(x) would wrap, too)."""
    if isinstance(x, Sym) and not x.dtype.is_float:
        raise _trace((x,), fn).error(
            f"mf.{fn} needs a floating-point value, got {x.dtype} (torch.{fn} refuses integer "
            f"and bool tensors too); convert first, e.g. mf.{fn}(x.to(mf.f32), ...)")


def softmax(x, axis: str):
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


def log_softmax(x, axis: str):
    """Log-softmax over `axis`: (x - max) - log(sum(exp(x - max))), as torch.log_softmax.
    Floating-point values only, as in torch.

    Example: ``mf.log_softmax(logits, axis="V")``."""
    _float_only(x, "log_softmax")
    s = x - max(x, axis)
    return s - log(sum(exp(s), axis))


def logsumexp(x, axis: str):
    """log(sum(exp(x))) over `axis`, computed stably like torch.logsumexp: an infinite max is
    replaced by 0 before shifting, so all -inf gives -inf and +inf gives +inf. Integer and
    bool values are converted to f32 first, as torch converts them to its default float dtype.

    Example: ``mf.logsumexp(x, axis="D")``."""
    if isinstance(x, Sym) and not x.dtype.is_float:
        x = x.to("f32")
    m = max(x, axis)
    m = where(abs(m) == inf, 0.0, m)
    return log(sum(exp(x - m), axis)) + m
