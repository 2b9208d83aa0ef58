"""Combining a phase's accumulators across the row: the simd kernels' xor butterfly over the
row's lanes; the threadgroup kernels' simd → threadgroup → simd reduction."""
from __future__ import annotations

from ... import ir
from .. import reduce
from ..hardware import SIMD_WIDTH
from .plan import LANES


def combine(parts: reduce.VariantParts, reds: list[reduce.Reduction]) -> list[ir.Stmt]:
    """Combine `reds` across the row (threadgroup arrays, if any, go to `parts`): every thread
    of the row ends with the row's results."""
    if parts.name in LANES:
        return row_lanes_combine(reds)
    out: list[ir.Stmt] = [ir.Comment("combine across the simdgroup")]
    for r in reds:
        if r.online_max is None:
            out += reduce.simd_combine(r)
    lane, sg = ir.Var("mf_lane"), ir.Var("mf_sg")
    stores, reads = reduce.through_threadgroup(parts, reds, SIMD_WIDTH, sg, lane,
                                               lane < ir.Var("mf_nsg"))
    out += [ir.Comment("across simdgroups: one partial per simdgroup through threadgroup "
                       "memory, then a second simd reduction in every simdgroup"),
            ir.If(lane.eq(ir.Lit(0, "uint")), stores), ir.Barrier()]
    return out + reads


def row_lanes_combine(reds: list[reduce.Reduction]) -> list[ir.Stmt]:
    """Simd variant: combine the row's mf_w lanes by an xor butterfly (partners stay in
    the row's lanes); every lane of the row ends with the row's result."""
    off = ir.Var("mf_off")
    step: list[ir.Stmt] = []
    for r in reds:
        other = ir.Var(f"mf_o{r.i}")
        step.append(ir.Decl(other.name, r.acc_type,
                            ir.Call("simd_shuffle_xor", (r.acc_ref, off))))
        other_idx = None
        if r.has_index:
            other_idx = ir.Var(f"mf_oi{r.i}")
            step.append(ir.Decl(other_idx.name, "uint",
                                ir.Call("simd_shuffle_xor", (ir.Var(r.idx), off))))
        step += reduce.merge(r, other, other_idx)
    return [ir.Comment("combine the row's lanes (xor butterfly; a fixed trip count, so the "
                       "compiler unrolls it)"),
            ir.For(off.name, "uint", ir.Lit(1, "uint"), ir.Lit(SIMD_WIDTH, "uint"),
                   [ir.If(off < ir.Var("mf_w"), step)], step=off, unroll=True)]
