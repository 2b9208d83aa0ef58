"""The K/V tiles' copies split in two halves, for a kernel whose loop keeps the next tile's
copies in flight while it multiplies the current one (the register-resident prefill, flash.py):

    tile_loads(first)    the thread's copies of the tile from key `first` into registers
    tile_stores()        ... from registers into the staged tiles (`tiles.tile_arrays`)

Copy i of a tile (i = mf_tid + j x group, j < `per`) is key i / mf_chunks, chunk i % mf_chunks,
vw elements (16 bytes) a copy, as `tiles.fill_tiles` deals them; only where E is a multiple
of vw (mf_vec_ok: else the kernel copies with `fill_tiles`' element path) and the reads are
plain loads along the keys (`applies`)."""
from __future__ import annotations

from ... import ir
from ...graph import Op
from ..base import IDX
from .context import CallContext, KernelState, offset


def applies(ctx: CallContext) -> bool:
    """Whether the copies can be split: vector copies of every read, none a gather."""
    whole = ctx.vw > 1 and all(ctx.tensor_of(n).axes[-1] == ctx.form.e for n in ctx.kv)
    return whole and not any(n.op == Op.TAKE for n in ctx.kv)


def copies(ks: KernelState, chunks_max: int) -> int:
    """Copies a thread makes of a full tile (each read), for rows of up to chunks_max
    chunks."""
    return -(-ks.kt_max * chunks_max // ks.group)


def declare(ctx: CallContext, per: int) -> list[ir.Stmt]:
    """Each read's registers for the thread's copies of a tile."""
    return [ir.ArrayDecl(f"{arr}_cp", ir.vector_type(ctx.in_stype(ctx.tensor_of(n)), ctx.vw),
                         per) for n, arr in ctx.kv.items()]


def tile_loads(ctx: CallContext, ks: KernelState, per: int, first: ir.Expr,
               count: ir.Expr) -> list[ir.Stmt]:
    """The thread's copies of the `count` keys from key `first` into registers (copies past
    them: none)."""
    vw = ctx.vw
    out: list[ir.Stmt] = []
    for j in range(per):
        loads: list[ir.Stmt] = [ir.Decl("mf_l", IDX, first + ir.Cast(IDX, ir.Var("mf_r")))]
        for n, arr in ctx.kv.items():
            t = ctx.tensor_of(n)
            loads.append(ir.Assign(ir.Lane(ir.Var(f"{arr}_cp"), ir.Lit(j, "uint")), ir.Load(
                ctx.names[t.name], offset(ctx, ks, t.axes), vw, ctx.in_stype(t))))
        out.append(ir.Block(_placed(j, ks, vw) + [
            ir.If(ir.Var("mf_ci") < count * ir.Var("mf_chunks"), loads)]))
    return out


def tile_stores(ctx: CallContext, ks: KernelState, per: int) -> list[ir.Stmt]:
    """The thread's copies of the tile's mf_tn keys from registers into the staged tiles."""
    vw = ctx.vw
    out: list[ir.Stmt] = []
    for j in range(per):
        stores: list[ir.Stmt] = []
        for n, arr in ctx.kv.items():
            st = ctx.in_stype(ctx.tensor_of(n))
            stores.append(ir.Store(arr, ir.Var("mf_r") * ir.Var(f"{arr}_stride") + ir.Var("mf_e"),
                                   ir.Lane(ir.Var(f"{arr}_cp"), ir.Lit(j, "uint")), vw, st,
                                   space="threadgroup"))
        out.append(ir.Block(_placed(j, ks, vw) + [
            ir.If(ir.Var("mf_ci") < ir.Var("mf_tn") * ir.Var("mf_chunks"), stores)]))
    return out


def _placed(j: int, ks: KernelState, vw: int) -> list[ir.Stmt]:
    """Copy j's index (mf_ci), key in the tile (mf_r) and first E element (mf_e)."""
    i = ir.Var("mf_ci")
    return [ir.Decl("mf_ci", "uint", ir.Var("mf_tid") + ir.Lit(j * ks.group, "uint")
                    if j else ir.Var("mf_tid")),
            ir.Decl("mf_r", "uint", i / ir.Var("mf_chunks")),
            ir.Decl("mf_e", "uint", i % ir.Var("mf_chunks") * ir.Lit(vw, "uint"))]
