"""stage_kv's K/V tiles in threadgroup memory: their arrays (`tile_arrays`), the group's copies
into them (`fill_tiles`, `batched_copies`) and reads of a tile's element (`tile_reads`)."""
from __future__ import annotations

from typing import Optional

from ... import ir
from ...graph import Node, Op
from ..base import IDX
from ..hardware import SIMD_WIDTH
from ..lower import compute_type
from .context import CallContext, KernelState, lowering, offset
from .params import BATCHED_COPIES, PAD_BYTES, TILE_BYTES


def tile_arrays(ctx: CallContext, ks: KernelState, runs: bool = True,
                width: Optional[int] = None) -> list[ir.Stmt]:
    """Each K/V read's tile: TILE_BYTES of threadgroup memory declared as float4 (16-byte
    units, aligned for vector access of any element type), used as `threadgroup T*
    mf_kv<i>` with rows of mf_chunks chunks of vw elements (E rounded up; `width`: that many
    elements, whatever E) padded by PAD_BYTES (`mf_kv<i>_stride` elements apart); with
    `runs`, whether the values loop may read runs of `run` elements (mf_run_ok)."""
    out: list[ir.Stmt] = [ir.Comment(
        "the K/V tiles: key mf_key's element e at mf_kv<i>[mf_key * mf_kv<i>_stride + e] "
        f"(rows padded by {PAD_BYTES} bytes: lanes reading different rows hit different "
        "banks)")]
    for n, arr in ctx.kv.items():
        t = ctx.tensor_of(n)
        st, size = ctx.in_stype(t), t.dtype.itemsize
        if ctx.vw == 8:
            ks.out.helpers.add("mf_pack8_of")
        ks.out.tg_decls.append(ir.ArrayDecl(f"mf_tg_{arr[3:]}", "float4", TILE_BYTES // 16,
                                          "threadgroup"))
        out += [ir.Decl(arr, f"threadgroup {st}*", ir.Call(
                    f"reinterpret_cast<threadgroup {st}*>", (ir.Var(f"mf_tg_{arr[3:]}"),)),
                    const=False),
                ir.Decl(f"{arr}_stride", "uint", (
                    ir.Var("mf_chunks") * ir.Lit(ctx.vw, "uint") if width is None
                    else ir.Lit(width, "uint")) + ir.Lit(PAD_BYTES // size, "uint"))]
    chunks = (ctx.size(ctx.form.e) + ir.Lit(ctx.vw - 1, IDX)) / ir.Lit(ctx.vw, IDX)
    run_ok = (ctx.size(ctx.form.e) % ir.Lit(ctx.run, IDX)).eq(ir.Lit(0, IDX))
    head: list[ir.Stmt] = [ir.Decl("mf_chunks", "uint", ir.Cast("uint", chunks))]
    if runs:
        head += [ir.Comment(f"the values' reads: {ctx.run} consecutive elements a lane at "
                            f"once where E is a multiple of {ctx.run}"),
                 ir.Decl("mf_run_ok", "bool", run_ok)]
    return head + out


def tile_reads(ctx: CallContext, ks: KernelState) -> dict[Node, ir.Expr]:
    """Each K/V read as its staged tile's element of key mf_u and E element mf_e, in its
    compute type."""
    return {n: ir.Cast(compute_type(ctx.tensor_of(n).dtype), ir.Lane(
        ir.Var(arr), ir.Var("mf_u") * ir.Var(f"{arr}_stride") + ir.Var("mf_e")))
        for n, arr in ctx.kv.items()}


def key_row(ctx: CallContext, ks: KernelState, n: Node, arr: str) -> tuple[list[ir.Stmt], dict[str,
            ir.Expr]]:
    """For a gathered K/V read (a paged cache): the statements finding and checking key
    mf_l's row, and that row as the position along the gathered axis."""
    if n.op != Op.TAKE:
        return [], {}
    low = lowering(ctx, ks, f"{arr}_")
    find, pos = low.gather_position(n)
    ks.out.helpers |= low.helpers
    return find + [ir.Decl(f"mf_{arr}_row", IDX, pos)], {n.attr[1]: ir.Var(f"mf_{arr}_row")}


def fill_tiles(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """Every thread of the group copies its share of the tile's mf_tn keys of each K/V
    read into threadgroup memory, a chunk of vw elements (16 bytes) a copy: one vector
    copy when E is a multiple of vw (and innermost in every read), else the chunk's
    elements inside E one by one (a chunk is still one thread's)."""
    vw, group = ctx.vw, ir.Lit(ks.group, "uint")
    key = ir.Var("mf_r")                         # copy mf_i: key mf_r, E from mf_e0
    whole = vw > 1 and all(ctx.tensor_of(n).axes[-1] == ctx.form.e for n in ctx.kv)
    vector: list[ir.Stmt] = [ir.Decl("mf_e", "uint", ir.Var("mf_e0"))]
    scalar: list[ir.Stmt] = []
    for n, arr in ctx.kv.items():
        t = ctx.tensor_of(n)
        find, moved = key_row(ctx, ks, n, arr)
        src = offset(ctx, ks, t.axes, moved)
        dst = key * ir.Var(f"{arr}_stride") + ir.Var("mf_e")
        st = ctx.in_stype(t)
        vector.append(ir.Block(find + [ir.Store(arr, dst, ir.Load(
            ctx.names[t.name], src, vw, st), vw, st, space="threadgroup")]))
        find, moved = key_row(ctx, ks, n, arr)
        scalar.append(ir.Block(find + [ir.For("mf_x", "uint", ir.Lit(0, "uint"),
                                              ir.Lit(vw, "uint"), [
            ir.Decl("mf_e", "uint", ir.Var("mf_e0") + ir.Var("mf_x")),
            ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e), [
                ir.Store(arr, dst, ir.Load(ctx.names[t.name], src))])], unroll=True)]))
    chunks, cc = ir.Var("mf_chunks"), ir.Var("mf_cc")
    body: list[ir.Stmt] = [
        ir.Decl("mf_e0", "uint", cc * ir.Lit(vw, "uint")),
        ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, key))]
    body += [ir.If(ir.Var("mf_vec_ok"), vector, scalar)] if whole else scalar
    body += [ir.Comment(f"the next copy: {ks.group} further (mf_dr keys and mf_dc "
                        "chunks), no division per copy"),
             ir.Assign(key, key + ir.Var("mf_dr")), ir.Assign(cc, cc + ir.Var("mf_dc")),
             ir.If(cc >= chunks, [ir.Assign(cc, cc - chunks),
                                  ir.Assign(key, key + ir.Lit(1, "uint"))])]
    copies: ir.Stmt = ir.For("mf_i", "uint", ir.Var("mf_tid"), ir.Var("mf_tn") * chunks,
                             body, step=group)
    per = ks.kt_max * (SIMD_WIDTH * ks.epl // vw) // ks.group
    if whole and 1 < per <= BATCHED_COPIES and not any(m.op == Op.TAKE for m in ctx.kv):
        full = ir.Var("mf_vec_ok").and_(ir.Var("mf_dc").eq(ir.Lit(0, "uint"))).and_(
            (ir.Var("mf_tn") * chunks).eq(ir.Lit(per * ks.group, "uint")))
        copies = ir.If(full, batched_copies(ctx, ks, per), [copies])
    return [
        ir.Comment(f"stage keys [mf_tk, mf_tk + mf_tn) of K and V: all {ks.group} "
                   f"threads copy, a chunk of {vw} elements (16 bytes) a copy; copy i is "
                   f"key i / mf_chunks, chunk i % mf_chunks"),
        ir.Decl("mf_r", "uint", ir.Var("mf_tid") / chunks, const=False),
        ir.Decl("mf_cc", "uint", ir.Var("mf_tid") % chunks, const=False),
        ir.Decl("mf_dr", "uint", group / chunks),
        ir.Decl("mf_dc", "uint", group % chunks),
        copies,
        ir.Barrier()]


def _key_stride(ctx: CallContext, axes: tuple[str, ...]) -> ir.Expr:
    """How far apart consecutive keys lie in a read over `axes` (row-major): the product of
    the sizes of the axes after the key axis."""
    out: ir.Expr = ir.Lit(1, IDX)
    for a in axes[axes.index(ctx.form.key) + 1:]:
        out = ctx.size(a) if isinstance(out, ir.Lit) else out * ctx.size(a)
    return out


def batched_copies(ctx: CallContext, ks: KernelState, n: int) -> list[ir.Stmt]:
    """A full tile whose copies keep their chunk (mf_dc = 0): the thread's n copies (keys
    mf_r + j * mf_dr, chunk mf_cc) of each K/V read, all n loads before their stores, so
    that they are in flight together (`BATCHED_COPIES`); the loads from one pointer to the
    first key's chunk (`<array>_src`), the others a fixed step past it."""
    vw = ctx.vw
    e = ir.Var("mf_e")
    out: list[ir.Stmt] = [
        ir.Comment(f"a full tile: this thread's {n} copies of each read (keys mf_r + j * "
                   f"mf_dr, E from mf_e), every load before its store"),
        ir.Decl(e.name, "uint", ir.Var("mf_cc") * ir.Lit(vw, "uint"))]
    for node, arr in ctx.kv.items():
        t = ctx.tensor_of(node)
        st = ctx.in_stype(t)
        held = ir.Var(f"{arr}_cp")
        keys = [ir.Var("mf_r") + ir.Lit(j, "uint") * ir.Var("mf_dr") for j in range(n)]
        out.append(ir.ArrayDecl(held.name, ir.vector_type(st, vw), n))
        src, step = f"{arr}_src", _key_stride(ctx, t.axes) * ir.Cast(IDX, ir.Var("mf_dr"))
        first = {ctx.form.key: ir.Var("mf_tk") + ir.Cast(IDX, ir.Var("mf_r"))}
        out.append(ir.Decl(src, f"device const {st}*", ir.Var(ctx.names[t.name]) + offset(
            ctx, ks, t.axes, first), const=False))
        for j in range(n):
            at = ir.Lit(j, IDX) * step if j else ir.Lit(0, IDX)
            out.append(ir.Assign(ir.Lane(held, ir.Lit(j, "uint")), ir.Load(src, at, vw, st)))
        for j, key in enumerate(keys):
            out.append(ir.Store(arr, key * ir.Var(f"{arr}_stride") + e,
                                ir.Lane(held, ir.Lit(j, "uint")), vw, st,
                                space="threadgroup"))
    return out
