"""kv_prefetch: the key-stream decode kernel's K/V loads one step ahead of its arithmetic.

A step's K/V rows are read as raw vectors (`issue`: 16-byte loads of the storage type into
mf_kv<i>n, nothing converted, so no instruction waits on them) while the step before it
computes; at the end of that step they are converted into the float registers mf_kv<i> that
the scores and values read (`take`). Where E is not a whole number of vectors (mf_vec_ok
false) or a tensor's E is not its innermost axis, `take` reads the elements itself (guarded),
as `staging.load_keys` does: those calls are not prefetched."""
from __future__ import annotations

from ... import ir
from ...graph import Node, Op
from ..base import IDX
from ..lower import compute_type
from .context import CallContext, KernelState, lowering, offset
from .loops import keys, slots


def buffers(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """The float registers of a step's K/V elements (mf_kv<i>: keys_per_step x
    reads_per_thread each) and the raw vectors of the next step (mf_kv<i>n)."""
    out: list[ir.Stmt] = []
    if ctx.vw == 8:
        ks.out.helpers.add("mf_pack8_of")          # the mf_pack8 vectors
    for n, arr in ctx.kv.items():
        t = ctx.tensor_of(n)
        out.append(ir.ArrayDecl(arr, compute_type(t.dtype), ctx.kps * ks.epl))
        if _vector(ctx, n):
            out.append(ir.ArrayDecl(f"{arr}n", ir.vector_type(ctx.in_stype(t), ctx.vw),
                                    ctx.kps * _chunks(ctx, ks)))
    return out


def issue(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """The step at mf_base: each key's vectors of this lane (inside E, keys inside the
    block) loaded into mf_kv<i>n, unconverted; nothing for keys past the block's end."""
    out: list[ir.Stmt] = []
    c = ir.Var("mf_c")
    for n, arr in ctx.kv.items():
        if not _vector(ctx, n):
            continue
        t = ctx.tensor_of(n)
        find, src = _source(ctx, ks, n, arr)
        vec = ir.Lane(ir.Var(f"{arr}n"), ir.Var("mf_u") * ir.Lit(_chunks(ctx, ks), "uint") + c)
        out.append(keys(ctx, ks, find + [_each_chunk(ctx, ks, [
            ir.Assign(vec, ir.Load(ctx.names[t.name], src, ctx.vw, ctx.in_stype(t)))])]))
    return [ir.Comment("the step's K/V vectors, loaded now and converted after the step "
                       "before it has computed"), ir.If(ir.Var("mf_vec_ok"), out)] if out else []


def take(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """The step at mf_base's K/V elements into the float registers mf_kv<i> (0 past E and
    past the keys): from the vectors `issue` loaded, or read here element by element."""
    out: list[ir.Stmt] = [ir.Comment("the step's K/V elements as floats (0 past E and past "
                                     "the block's keys)")]
    slot = ir.Var("mf_u") * ir.Lit(ks.epl, "uint") + ir.Var("mf_j")
    for n, arr in ctx.kv.items():
        t = ctx.tensor_of(n)
        ct = compute_type(t.dtype)
        zero = ir.Lit(0.0, ct) if ct == "float" else ir.Lit(0, ct)
        find, src = _source(ctx, ks, n, arr)
        reg = ir.Lane(ir.Var(arr), slot)
        scalar = find + [slots(ctx, ks, [
            ir.Decl("mf_e", "uint", ir.Var("mf_sub") * ir.Lit(ks.epl, "uint") + ir.Var("mf_j")),
            ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e),
                  [ir.Assign(reg, ir.Cast(ct, ir.Load(ctx.names[t.name], src)))],
                  [ir.Assign(reg, zero)])])]
        body = scalar
        if _vector(ctx, n):
            body = [ir.If(ir.Var("mf_vec_ok"), [_convert(ctx, ks, arr, ct, zero)], scalar)]
        out.append(keys(ctx, ks, body, [slots(ctx, ks, [ir.Assign(reg, zero)])]))
    return out


def _vector(ctx: CallContext, n: Node) -> bool:
    """Whether K/V read `n` is prefetched as vectors (E its innermost axis)."""
    return ctx.vw > 1 and ctx.tensor_of(n).axes[-1] == ctx.form.e


def _chunks(ctx: CallContext, ks: KernelState) -> int:
    """Vectors per key a lane reads (reads_per_thread elements, vw a vector)."""
    return max(1, ks.epl // ctx.vw)


def _source(ctx: CallContext, ks: KernelState, n: Node,
            arr: str) -> tuple[list[ir.Stmt], ir.Expr]:
    """The statements finding key mf_l's row (a gather: the paged cache's block table, its
    index checked) and the element's index at E position mf_e."""
    find: list[ir.Stmt] = []
    moved: dict[str, ir.Expr] = {}
    if n.op == Op.TAKE:
        low = lowering(ctx, ks, f"{arr}_")
        find, pos = low.gather_position(n)
        ks.out.helpers |= low.helpers
        find.append(ir.Decl(f"mf_{arr}_row", IDX, pos))
        moved[n.attr[1]] = ir.Var(f"mf_{arr}_row")
    return find, offset(ctx, ks, ctx.tensor_of(n).axes, moved)


def _each_chunk(ctx: CallContext, ks: KernelState, body: list[ir.Stmt]) -> ir.Stmt:
    """`body` for each of the lane's vectors mf_c of a key inside E (mf_e its first
    element; E is a whole number of vectors here)."""
    c = ir.Var("mf_c")
    return ir.For("mf_c", "uint", ir.Lit(0, "uint"), ir.Lit(_chunks(ctx, ks), "uint"), [
        ir.Decl("mf_e", "uint", ir.Var("mf_sub") * ir.Lit(ks.epl, "uint")
                + c * ir.Lit(ctx.vw, "uint")),
        ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e), body)], unroll=True)


def _convert(ctx: CallContext, ks: KernelState, arr: str, ct: str,
             zero: ir.Expr) -> ir.Stmt:
    """mf_kv<i>[u, j] = the loaded vectors' elements as `ct` (0 for chunks past E)."""
    c, x = ir.Var("mf_c"), ir.Var("mf_x")
    vw = ctx.vw
    vec = ir.Lane(ir.Var(f"{arr}n"), ir.Var("mf_u") * ir.Lit(_chunks(ctx, ks), "uint") + c)
    elem = ir.Call("mf_lane8", (vec, x)) if vw == 8 else ir.Lane(vec, x)
    reg = ir.Lane(ir.Var(arr), ir.Var("mf_u") * ir.Lit(ks.epl, "uint") + c * ir.Lit(vw, "uint")
                  + x)
    return ir.For("mf_c", "uint", ir.Lit(0, "uint"), ir.Lit(_chunks(ctx, ks), "uint"), [
        ir.Decl("mf_e", "uint", ir.Var("mf_sub") * ir.Lit(ks.epl, "uint")
                + c * ir.Lit(vw, "uint")),
        ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e), [
            ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                ir.Assign(reg, ir.Cast(ct, elem))], unroll=True)], [
            ir.For("mf_x", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                ir.Assign(reg, zero)], unroll=True)])], unroll=True)
