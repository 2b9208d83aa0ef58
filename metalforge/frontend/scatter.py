"""Tracing `mf.scatter_add`: the checks at the user's line and the SCATTER node.

The node's axes: the values' and the index's axes (broadcast by name, as elementwise operands
are), less the index's, plus the scattered `axis`, in canonical order. Its dtype is the
output's: `dtype=` where given, else the values' (a Python int counts in i32, a Python float
in f32). Only dtypes the kernels can add atomically, or through an f32 accumulator, are
accepted (`SCATTER_DTYPES`).
"""
from __future__ import annotations

from typing import Any, Optional

from ..dtypes import BF16, BOOL, F16, F32, I32, U32, DType
from ..graph import Node, Op, strip_casts
from .tracer import Sym, Trace

# f32, i32, u32: Metal's atomic_float / atomic_int / atomic_uint; f16, bf16: an f32 accumulator
SCATTER_DTYPES = (F32, F16, BF16, I32, U32)


def scatter_add(tr: Trace, values: Any, axis: Any, index: Any, deterministic: Any,
                dtype: Optional[Any]) -> Sym:
    """The SCATTER node of `mf.scatter_add(values, axis, index, ...)` (see its docstring)."""
    if not isinstance(deterministic, bool):
        raise tr.error(f"mf.scatter_add: deterministic must be True or False, got "
                       f"{deterministic!r}")
    axis = tr.check_axis(axis, "mf.scatter_add")
    idx = tr.as_node(index, "the index")
    if idx.dtype.is_float or idx.dtype is BOOL:
        raise tr.error(f"mf.scatter_add: the index must be an integer value (an integer tensor "
                       f"or integer arithmetic on one), got {idx.dtype}")
    if not idx.axes:
        raise tr.error("mf.scatter_add: the index has no axes (one position for the whole "
                       "kernel); pass an integer tensor whose elements say where each value goes")
    vals = tr.as_node(values, "the values")
    out = _out_dtype(tr, vals, dtype)
    grid = tr.axes_of(vals, idx)
    if axis in grid:
        raise tr.error(f"mf.scatter_add: '{axis}' is the axis the values are scattered along; "
                       f"the values and the index must not have it (they have "
                       f"{list(vals.axes)} and {list(idx.axes)})")
    if deterministic:
        _check_sortable(tr, idx)
    names = (set(grid) - set(idx.axes)) | {axis}
    axes = tuple(sorted(names, key=tr.order.__getitem__))
    vals = tr.cast(vals, out)
    return tr.sym(tr.node(Op.SCATTER, (vals, idx), out, axes, attr=(axis, deterministic)))


def _out_dtype(tr: Trace, vals: Node, dtype: Optional[Any]) -> DType:
    """The output's dtype: `dtype` where given, else the values' (i32 / f32 for numbers)."""
    if dtype is not None:
        out = tr.resolve_dtype(dtype)
    elif vals.weak and not vals.dtype.is_float:
        out = I32                   # a count: mf.scatter_add(1, ...)
    elif vals.weak:
        out = F32
    else:
        out = vals.dtype
    if out not in SCATTER_DTYPES:
        given = "dtype=" if dtype is not None else "the values are"
        raise tr.error(f"mf.scatter_add: cannot accumulate {out} values ({given} {out}); "
                       f"the output can be {', '.join(d.name for d in SCATTER_DTYPES)} "
                       f"(Metal adds 32-bit values atomically; f16/bf16 through an f32 "
                       f"accumulator): pass dtype=mf.i32 or dtype=mf.f32")
    if vals.dtype.is_float and not out.is_float:
        raise tr.error(f"mf.scatter_add: float values ({vals.dtype}) into an integer output "
                       f"({out}); convert them explicitly with .to(mf.{out.name})")
    return out


def _check_sortable(tr: Trace, idx: Node) -> None:
    """deterministic=True sorts the index before the launch: it must be a tensor argument."""
    src = strip_casts(idx)
    if src.op != Op.LOAD:
        raise tr.error("mf.scatter_add(..., deterministic=True): the index must be an integer "
                       "tensor argument of the kernel itself (the call sorts it on the device "
                       "before the launch), not a computed value; compute the index in another "
                       "kernel, or use the atomic mode (deterministic=False)")
    if any(a.op == Op.CAST and not _widening(a) for a in _casts(idx)):
        raise tr.error("mf.scatter_add(..., deterministic=True): the index may only be "
                       "converted to a wider integer type (the sort reads the tensor as it is)")


def _casts(n: Node) -> list[Node]:
    out = []
    while n.op == Op.CAST:
        out.append(n)
        n = n.args[0]
    return out


def _widening(c: Node) -> bool:
    src, dst = c.args[0].dtype, c.dtype
    return dst.is_int and src.is_int and dst.itemsize >= src.itemsize and (
        dst.kind == src.kind or dst.itemsize > src.itemsize)

