"""The outputs: acc / d through the work after the sum (`epilogue`), or a key block's state in
the scratch buffer for the merge kernel (`write_row`)."""
from __future__ import annotations

from typing import Callable, Optional

from ... import ir
from ..base import IDX
from ..lower import compute_type
from .context import MACC, CallContext, KernelState, lowering, offset
from .loops import lanes
from .lse import any_lse, is_lse


def epilogue(ctx: CallContext, ks: KernelState, acc: ir.Expr = MACC,
             each: Optional[Callable[[list[ir.Stmt]], ir.Stmt]] = None) -> ir.Stmt:
    """The outputs at the lane's E elements (`each`: the loop over them declaring mf_e;
    lanes() unless given): the merged acc / d through the work after the sum."""
    f = ctx.form
    low = lowering(ctx, ks, "mf_o")
    low.values[f.out] = ir.Cast(compute_type(f.out.dtype), acc / ir.Var("mf_md"))
    if any_lse(f, ctx.graph.outputs):           # the rows' logsumexp: from the final state
        low.values[f.max], low.values[f.denom] = ir.Var("mf_mm"), ir.Var("mf_md")
    body = low.lower([o.node for o in ctx.graph.outputs])
    ks.out.helpers |= low.helpers
    for k, o in enumerate(ctx.graph.outputs):
        store: ir.Stmt = ir.Store(ctx.out_names[k], offset(ctx, ks, o.axes),
                                  ctx.out_value(k, low))
        if is_lse(f, o.node):                   # one value per row: by E element 0's lane
            store = ir.If(ir.Var("mf_e").eq(ir.Lit(0, "uint")), [store])
        body.append(store)
    return each(body) if each is not None else lanes(ctx, ks, body)


def write_row(ctx: CallContext, ks: KernelState, acc: ir.Expr = MACC,
              each: Optional[Callable[[list[ir.Stmt]], ir.Stmt]] = None,
              first: Optional[ir.Expr] = None) -> ir.Stmt:
    """The row's merged state (mf_mm, mf_md, `acc` at the lane's E elements, which `each`
    loops over: lanes() unless given): the outputs when the keys are one block, else the
    block's state in the scratch buffer (m and d stored where `first`, lane 0 unless
    given)."""
    partial = ir.Var("mf_partial")
    row_id = offset(ctx, ks, ctx.rows)
    if each is None:
        def each(body: list[ir.Stmt]) -> ir.Stmt:
            return lanes(ctx, ks, body)
    if first is None:
        first = ir.Var("mf_lane").eq(ir.Lit(0, "uint"))
    return ir.If(ir.Var("mf_splits").eq(ir.Lit(1, "uint")), [
        ir.Comment("one block: outputs = acc / d (all keys masked: 0 / 0 = NaN, as "
                   "softmax gives)"), epilogue(ctx, ks, acc, each)], [
        ir.Comment("several blocks: this block's state (m, d, acc[E]) for the merge "
                   "kernel"),
        ir.Decl("mf_partial", IDX, (row_id * ir.Cast(IDX, ir.Var("mf_splits"))
                                    + ir.Cast(IDX, ir.Var("mf_block")))
                * ir.Lit(ctx.scratch_e + 2, IDX)),
        ir.If(first, [
            ir.Store("mf_scratch", partial, ir.Var("mf_mm")),
            ir.Store("mf_scratch", partial + ir.Lit(1, IDX), ir.Var("mf_md"))]),
        each([ir.Store("mf_scratch", partial + ir.Lit(2, IDX) + ir.Cast(IDX, ir.Var("mf_e")),
                       acc)])])
