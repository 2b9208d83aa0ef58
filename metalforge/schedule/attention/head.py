"""The threadgroup's place: which tile of query rows and block of keys it takes (`group_head`),
which rows of the tile exist and their positions (`tile`), and the keys its rows can see
(`block_keys`, from the mask's bounds)."""
from __future__ import annotations

from ... import ir
from ..base import IDX
from ..hardware import SIMD_WIDTH
from ..lower import ident
from .bounds import key_bounds, unmasked
from .context import SIMD, CallContext, KernelState, lowering, tile_position
from .loops import each_row


def group_head(ctx: CallContext, ks: KernelState, nsg: int, what: str = "") -> list[ir.Stmt]:
    """Which tile of query rows (mf_own, mf_tile) and block of keys [mf_l0, mf_l1) the
    threadgroup takes (`what` it does with them: the comment), and the lane's place: E
    chunk mf_sub of key stream mf_grp (not with stage_kv, whose lanes place themselves per
    phase)."""
    f = ctx.form
    tiles = (ctx.span(ctx.tile_axes) + ir.Lit(ks.qt - 1, IDX)) / ir.Lit(ks.qt, IDX)
    if what:
        what = f"; {what}"
    elif ctx.policy.stage_kv:
        what = (", a simdgroup per row; the group stages tiles of mf_kt keys of K and V in "
                "threadgroup memory, the simdgroups split each tile's keys")
    else:
        what = (f"; {nsg} simdgroups take turns over steps of keys; "
                + ("each lane scores a key of its own; for the values, " if
                   ctx.policy.lane_scores else "")
                + f"a key's E elements are spread over mf_w lanes, {ks.epl} "
                f"consecutive ones each")
    what = (f"threadgroup: query rows mf_tile * {ks.qt} + t (t < {ks.qt}) of mf_own, "
            f"keys [mf_l0, mf_l1) of block mf_block{what}; an own's last tile first (under "
            f"a causal mask the one with the most keys: the longest groups start first)")
    last = tiles - ir.Lit(1, IDX)
    head: list[ir.Stmt] = [
        ir.Comment(what),
        ir.Decl("mf_block", "uint", ir.Var("mf_group") % ir.Var("mf_splits")),
        ir.Decl("mf_tile", "uint", ir.Cast("uint", last - ir.Cast(
            IDX, ir.Var("mf_group") / ir.Var("mf_splits")) % tiles)),
        ir.Decl("mf_own", "uint", ir.Cast("uint", ir.Cast(IDX, ir.Var("mf_group")
                                                          / ir.Var("mf_splits")) / tiles)),
        ir.If(ir.Cast(IDX, ir.Var("mf_own")) >= ctx.span(ctx.own_axes), [ir.Return()])]
    if not ctx.policy.stage_kv:
        head += [ir.Decl("mf_sub", "uint", ir.Var("mf_lane") % ir.Var("mf_w")),
                 ir.Decl("mf_grp", "uint", ir.Var("mf_lane") / ir.Var("mf_w")),
                 ir.Decl("mf_kp", "uint", SIMD / ir.Var("mf_w"))]
    head += [ir.Decl("mf_vec_ok", "bool", (ctx.size(f.e) % ir.Lit(ctx.vw, IDX)).eq(
                 ir.Lit(0, IDX)))]
    return head


def tile(ctx: CallContext, ks: KernelState, arrays: bool = True) -> list[ir.Stmt]:
    """Which rows of the tile exist (the first mf_nlive: the rows past the tile axes' end
    do not) and, with `arrays`, their positions along the tile axes in registers (kernels
    that read them from `row_positions`' table instead pass False)."""
    first = ir.Cast(IDX, ir.Var("mf_tile") * ir.Lit(ks.qt, "uint"))
    out: list[ir.Stmt] = [
        ir.Comment("the rows of the tile that exist: the first mf_nlive"),
        ir.Decl("mf_nlive", "uint", ir.Cast("uint", ir.Call("min", (
            ir.Cast(IDX, ir.Lit(ks.qt, "uint")), ctx.span(ctx.tile_axes) - first))))]
    if not ctx.tile_axes or not arrays:
        return out
    body: list[ir.Stmt] = []
    for a in ctx.tile_axes:
        name = f"mf_tpos_{ident(a)}"
        out.append(ir.ArrayDecl(name, IDX, ks.qt))
        body.append(ir.Assign(ir.Lane(ir.Var(name), ir.Var("mf_t")),
                              tile_position(ctx, ks, a, ir.Var("mf_t"))))
    return out + [ir.For("mf_t", "uint", ir.Lit(0, "uint"), ir.Lit(ks.qt, "uint"), body,
                         unroll=True)]


def row_positions(ctx: CallContext, ks: KernelState) -> list[ir.Stmt]:
    """The tile's rows' positions along the tile axes in threadgroup memory
    (`mf_tg_tpos_<axis>[row]`, a thread a row), for kernels whose phases pick the row at run
    time (`KernelState.with_row(..., table=True)`): one load where `tile_position` takes a
    division and a remainder (the prefill kernels' mask reads a row position per score);
    computed once, in place of `tile`'s register arrays."""
    if not ctx.tile_axes:
        return []
    tid = ir.Var("mf_sg") * ir.Lit(SIMD_WIDTH, "uint") + ir.Var("mf_lane")
    body: list[ir.Stmt] = []
    for a in ctx.tile_axes:
        name = f"mf_tg_tpos_{ident(a)}"
        ks.out.tg_decls.append(ir.ArrayDecl(name, IDX, ks.qt, "threadgroup"))
        body.append(ir.Assign(ir.Lane(ir.Var(name), tid), tile_position(ctx, ks, a, tid)))
    return [ir.Comment("the tile's rows' positions, once (read by row wherever the row is "
                       "picked at run time)"),
            ir.If(tid < ir.Lit(ks.qt, "uint"), body), ir.Barrier()]


def tiled_head(ctx: CallContext, ks: KernelState, nsg: int, what: str, inner: bool = False
               ) -> list[ir.Stmt]:
    """The prefill kernels' start: `group_head`, the tile's live rows and their positions'
    table (`row_positions`, which the keys' bounds read too), the block of keys."""
    return (group_head(ctx, ks, nsg, what) + tile(ctx, ks, arrays=False)
            + row_positions(ctx, ks)
            + block_keys(ctx, ks.with_row(ir.Var("mf_t"), table=True), inner))


def _row_bounds(ctx: CallContext, ks: KernelState
                ) -> tuple[list[ir.Stmt], ir.Expr, ir.Expr]:
    """The statements and the bounds [lo, hi) (long) of the keys row mf_t can see, from the
    mask's `key_bounds` (at least 0 and at most L)."""
    low = lowering(ctx, ks, "mf_kb")
    bounds = key_bounds(ctx.form, ctx.rows)
    vals = low.lower([n for _, n, _ in bounds])
    ks.out.helpers |= low.helpers
    lo: ir.Expr = ir.Cast("long", ir.Lit(0, IDX))
    hi: ir.Expr = ir.Cast("long", ctx.size(ctx.form.key))
    for kind, n, add in bounds:
        v = ir.Cast("long", low.value(n)) + ir.Cast("long", ir.Lit(add, IDX)) if add \
            else ir.Cast("long", low.value(n))
        lo = ir.Select(v > lo, v, lo) if kind == "lo" else lo
        hi = ir.Select(v < hi, v, hi) if kind == "hi" else hi
    return vals, lo, hi


def block_keys(ctx: CallContext, ks: KernelState, inner: bool = False) -> list[ir.Stmt]:
    """The threadgroup's block of keys [mf_l0, mf_l1): the keys its rows can see (all of
    L, or the union of the rows' `key_bounds`: masked keys are never read) split into
    mf_splits blocks. With `inner`, where the mask is nothing but those bounds
    (`bounds.unmasked`), in the same pass over the rows also [mf_kilo, mf_kihi) (long): the
    keys every live row sees (their intersection; empty where a row sees none), inside which
    a tile needs no mask (`scores.inside_bounds`)."""
    splits, length = ir.Cast(IDX, ir.Var("mf_splits")), ctx.size(ctx.form.key)
    one = ir.Lit(1, IDX)
    if not key_bounds(ctx.form, ctx.rows):
        chunk = (length + splits - one) / splits
        return [ir.Decl("mf_l0", IDX, ir.Cast(IDX, ir.Var("mf_block")) * chunk),
                ir.Decl("mf_l1", IDX, ir.Call("min", (ir.Var("mf_l0") + chunk, length)))]
    vals, lo, hi = _row_bounds(ctx, ks)
    klo, khi = ir.Var("mf_klo"), ir.Var("mf_khi")
    rlo, rhi = ir.Var("mf_rlo"), ir.Var("mf_rhi")
    ilo, ihi = ir.Var("mf_kilo"), ir.Var("mf_kihi")
    chunk = (ir.Var("mf_kn") + splits - one) / splits
    zero = ir.Cast("long", ir.Lit(0, IDX))
    union: list[ir.Stmt] = [
        ir.Decl("mf_klo", "long", ir.Cast("long", length), const=False),
        ir.Decl("mf_khi", "long", zero, const=False)]
    per_row: list[ir.Stmt] = [
        *vals, ir.Decl("mf_rlo", "long", lo), ir.Decl("mf_rhi", "long", hi),
        ir.If(rlo < rhi, [ir.Assign(klo, ir.Select(rlo < klo, rlo, klo)),
                          ir.Assign(khi, ir.Select(rhi > khi, rhi, khi))])]
    if inner and unmasked(ctx.form, ctx.rows) is not None:
        union += [ir.Comment("and the keys every row of the tile sees (no mask needed inside "
                             "them)"),
                  ir.Decl("mf_kilo", "long", zero, const=False),
                  ir.Decl("mf_kihi", "long", ir.Cast("long", length), const=False)]
        per_row += [ir.Assign(ilo, ir.Select(rlo > ilo, rlo, ilo)),
                    ir.Assign(ihi, ir.Select(rhi < ihi, rhi, ihi))]
    return [
        ir.Comment(f"the keys the tile's rows can see (the mask's bounds on "
                   f"'{ctx.form.key}'; masked keys are never read), split into mf_splits "
                   f"blocks"),
        *union, each_row(ctx, ks, per_row),
        ir.Decl("mf_kn", IDX, ir.Select(khi > klo, ir.Cast(IDX, khi - klo),
                                        ir.Lit(0, IDX))),
        ir.Decl("mf_l0", IDX, ir.Select(khi > klo, ir.Cast(IDX, klo), ir.Lit(0, IDX))
                + ir.Cast(IDX, ir.Var("mf_block")) * chunk),
        ir.Decl("mf_l1", IDX, ir.Call("min", (ir.Var("mf_l0") + chunk, ir.Select(
            khi > klo, ir.Cast(IDX, khi), ir.Lit(0, IDX)))))]
