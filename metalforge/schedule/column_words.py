"""Column kernels over words unpacked along a column axis: the transposed quantized sum
(dx[m, k] = sum_n dy[m, n] * w[n, k], w from "u32[N, K/8]" words, `quant.transposed`), whose
tensors have axes derived from the columns' innermost axis K (K/8 words, K/GS groups). A
column's element of such a tensor is at k // d; the `wide` kernel gives a thread the columns of
one word (up to 8) and loads the word (and its group's scale and bias) once a row for all of
them, each column then taking its value from the word at its own slot."""
from __future__ import annotations

from ..graph import AxisSpec, TensorParam
from .reduce import ReductionContext


def column_groups(ctx: ReductionContext) -> list[AxisSpec]:
    """The dim specs of input axes derived from a column axis (K/8 of a kept K)."""
    return [ctx.graph.axis_spec(a) for t in ctx.inputs for a in t.axes
            if a not in ctx.outer and a != ctx.axis and ctx.graph.axis_spec(a).derived]


def grouped(ctx: ReductionContext, inner: str, t: TensorParam) -> bool:
    """Whether `t` has an axis derived from the columns' innermost axis `inner` (K/8)."""
    return any(ctx.graph.axis_spec(a).base == inner and a != inner for a in t.axes)
