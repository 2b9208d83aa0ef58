"""The attention schedule of a graph: its fixed context, then each kernel from its module (the
decode kernels, the prefill kernel, the merge kernel), and the host-side schedule around them."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from ... import ir
from ...errors import UnsupportedConstruct
from ...graph import Graph, Node, strip_casts
from ...target import get_target
from ..hardware import SIMD_WIDTH
from ..policy import LaunchPolicy, validate
from . import decode, flash, merge, mma, prefill, staged
from .bounds import key_bounds
from .context import CallContext, context
from .match import Form, match
from .params import MATRIX_ROWS, NARROW_LANES, NARROW_PREFILL_E, NARROW_TILE_KEYS
from .schedule import AttentionSchedule

# helpers a prefill kernel does not pass on to the kernels built after it
MATRIX_HELPERS = frozenset({"mf_mma", "mf_mma16", "mf_strides", "mf_tensor_ops"})


def build(graph: Graph, policy: LaunchPolicy, index64: bool,
          form: Optional[Form] = None) -> AttentionSchedule:
    """The attention schedule of `graph` (`form`: its match, when already found)."""
    form = match(graph) if form is None else form
    if form is None:
        raise UnsupportedConstruct(f"kernel '{graph.name}': not an attention graph")
    ctx = context(graph, policy, index64, form)
    stage_kv = bool(ctx.policy.stage_kv)
    epl = ctx.policy.reads_per_thread
    carry = _Carry({"mf_maximum"})
    if stage_kv:
        first = carry(staged.kernel(ctx, "decode"))
        narrow: Optional[ir.LoweredKernel] = carry(staged.kernel(ctx, "narrow"))
        wide = carry(staged.kernel(ctx, "wide")) if epl > ctx.run else None
        tg_bytes = threadgroup_bytes(wide or narrow or first)
    else:
        first = carry(decode.kernel(ctx))
        narrow = wide = None
        tg_bytes = threadgroup_bytes(first)
    pre = _prefill(ctx) if ctx.policy.matrix_rows else Prefill(None)
    matrix, narrow_matrix = (None if k is None else carry(k, also=MATRIX_HELPERS)
                             for k in (pre.kernel, pre.narrow))
    tg_bytes = max([tg_bytes] + [threadgroup_bytes(k) for k in (matrix, narrow_matrix)
                                 if k is not None])
    merged = carry(merge.kernel(ctx))
    return replace(_schedule(ctx, tg_bytes, first, narrow, wide, matrix, merged),
                   prefill_rows=pre.rows, prefill_keys=pre.keys,
                   prefill_narrow=narrow_matrix, prefill_narrow_keys=pre.narrow_keys,
                   prefill_weights=_rounded_weights(ctx) if matrix is not None else None)


def _rounded_weights(ctx: CallContext) -> Optional[tuple[Node, torch.dtype]]:
    """(P, the operand dtype) where the prefill kernel multiplies the softmax weights P into V
    as half / bfloat operands (`mma.operand`, which the register-resident kernel applies too);
    None where its products take fp32 weights."""
    op = mma.operand(ctx, get_target(ctx.policy.target or "apple9"))
    if op is None:
        return None
    out = strip_casts(ctx.form.out.args[0])
    p = out.args[0] if strip_casts(out.args[1]) is strip_casts(ctx.form.values) else out.args[1]
    return p, ctx.tensor_of(strip_casts(ctx.form.values)).dtype.torch


@dataclass(frozen=True)
class Prefill:
    """The prefill kernel, its query rows and keys a tile (0: the host's rule picks them) and,
    for the register-resident one, its narrow twin for E up to NARROW_PREFILL_E and that one's
    keys a tile."""
    kernel: Optional[ir.LoweredKernel]
    rows: int = MATRIX_ROWS
    keys: int = 0
    narrow: Optional[ir.LoweredKernel] = None
    narrow_keys: int = 0


def _prefill(ctx: CallContext) -> Prefill:
    """The prefill kernel: with its scores in registers where the target knows its matrix
    layout and the operands are half / bfloat (`flash`; with a narrow twin where E may exceed
    NARROW_PREFILL_E), else on the matrix block with no layout assumed (`mma`), else fp32
    simdgroup_matrix products (`prefill`), except on a target without Apple GPUs (cuda),
    where those are emulated by shuffles and the decode kernels are faster (S = L = 1024,
    E = 128: 1801 vs 872 us, H100): none there."""
    target = get_target(ctx.policy.target or "apple9")
    resident = flash.kernel(ctx, target)
    if resident is not None:
        emax = SIMD_WIDTH * ctx.run
        narrow = flash.kernel(ctx, target, narrow=True) if emax > NARROW_PREFILL_E else None
        return Prefill(resident, flash.ROWS, flash.tile_keys(emax), narrow,
                       flash.tile_keys(NARROW_PREFILL_E) if narrow is not None else 0)
    matrix = mma.kernel(ctx, target)
    if matrix is not None or not target.gpu_family:
        return Prefill(matrix)
    return Prefill(prefill.kernel(ctx, MATRIX_ROWS, NARROW_TILE_KEYS))


class _Carry:
    """Each kernel also declares the helpers of the kernels built before it (as the one
    builder that made them all did: their MSL keeps those helpers)."""

    def __init__(self, start: set[str]):
        self.helpers = set(start)

    def __call__(self, kernel: ir.LoweredKernel, also: frozenset[str] | set[str] = frozenset()
                 ) -> ir.LoweredKernel:
        self.helpers.update(set(kernel.helpers) - set(also))
        return replace(kernel, helpers=tuple(sorted(self.helpers | set(kernel.helpers))))


def threadgroup_bytes(kernel: ir.LoweredKernel) -> int:
    """The threadgroup memory a kernel declares (at its top: 4-byte floats, 16-byte float4s,
    2-byte halves and bfloats)."""
    size = {"float4": 16, "half": 2, "bfloat": 2}
    return sum(size.get(s.type, 4) * s.length for s in kernel.body
               if isinstance(s, ir.ArrayDecl) and s.space == "threadgroup")


def _schedule(ctx: CallContext, tg_bytes: int, first: ir.LoweredKernel,
              narrow: Optional[ir.LoweredKernel], wide: Optional[ir.LoweredKernel],
              matrix: Optional[ir.LoweredKernel], merged: ir.LoweredKernel
              ) -> AttentionSchedule:
    vector = tuple(dict.fromkeys(ctx.tensor_of(n).name for n in ctx.kv)) if ctx.vw > 1 else ()
    policy = replace(ctx.policy, uses_simd=True, threadgroup_bytes=tg_bytes,
                     vector_width=ctx.vw)
    validate(policy)
    run = ctx.run
    return AttentionSchedule(
        "attention", ctx.graph, policy, first, (*ctx.rows, ctx.form.e), vector, ctx.index64,
        l_axis=ctx.form.key, e_axis=ctx.form.e, rows=ctx.rows,
        max_e=SIMD_WIDTH * ctx.policy.reads_per_thread, merge=merged, narrow=narrow,
        narrow_e=NARROW_LANES * run, wide=wide, mid_e=SIMD_WIDTH * run, prefill=matrix,
        prefill_e=SIMD_WIDTH * run, own_axes=ctx.own_axes, tile_axes=ctx.tile_axes, qt=ctx.qt,
        tile_items=tuple(ctx.tensor_of(n).dtype.itemsize for n in ctx.kv)
        if ctx.policy.stage_kv else (), tile_vw=ctx.vw,
        bounds=tuple(key_bounds(ctx.form, ctx.rows)), kv_reads=tuple(ctx.kv))
