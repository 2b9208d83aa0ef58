"""The attention backward kernels on 8x8 simdgroup matrices (`fragments`: fp32 products), for
E up to MAT_E: a threadgroup of KSG simdgroups per 8 x KSG keys (dk/dv) or query rows (dq) of
one kv head, each simdgroup's own 8 rows of its A operands held as fragments in registers.

    dkdv   a simdgroup's K, V in registers; per block of 8 query rows (every row reading the
           keys, in order: deterministic) q and dO staged by the group (and transposed),
           then S^T = K Q^T and dP^T = V dO^T (E / 8 products each), per element P^T,
           dc^T (`kernels.pair`: the score's work and its derivative, lse and delta of the
           row), dV += P^T dO, dK += dc^T Q.
    dq     a simdgroup's q, dO in registers; per block of 8 keys K staged by the group
           (and transposed), V transposed, S = Q K^T, dP = dO V^T, per element dc,
           dQ += dc K.

A pair past the keys or the rows gets P = dc = 0 (its staged rows are zeros); key blocks an
index mask hides from a block's rows are skipped (`bounds`). The products are
`products_from` and `accumulate`, small functions to move onto a matrix block.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ... import ir
from ...dtypes import F32
from ...graph import Node
from ..base import IDX
from ..fragments import UINT, frag, lane_place, mat_load, mma, u, unrolled, zero
from ..hardware import SIMD_WIDTH
from ..lower import convert
from .bounds import LONG, block_bounds, masked_by_index
from .kernels import Ctx, kernel_of, load, offset, pair, positions

FRAG = 8
MAT_E = 128                      # E a lane's fragments hold (16 blocks of 8)
BLOCKS = MAT_E // FRAG
KSG = 4                          # simdgroups (of 8 keys each) of a dk/dv threadgroup


def stage(ctx: Ctx, arr: str, node: Node, first: ir.Expr, count: ir.Expr,
          place: Callable[[ir.Expr], list[ir.Stmt]], plain: bool = True,
          transposed: bool = False, rows: tuple[ir.Expr, ir.Expr] = (u(0), u(1))
          ) -> list[ir.Stmt]:
    """Rows first .. first + 7 (those below `count`) of tensor read `node` into threadgroup
    array `arr` ([8][MAT_E], where `plain`) and its transpose `arr`t ([MAT_E][8], where
    `transposed`), zeros past the rows and past E (up to the E blocks the products read):
    row by row (`rows`: the first and the step: a simdgroup's share), `place(index)`
    declaring the row's positions once, the lanes along E."""
    r, e = ir.Var("mf_r"), ir.Var("mf_e")
    idx = ir.Cast(IDX, r) + first
    value = ir.Var("mf_x")
    stores: list[ir.Stmt] = []
    if plain:
        stores.append(ir.Assign(ir.Lane(ir.Var(arr), r * u(MAT_E) + e), value))
    if transposed:
        stores.append(ir.Assign(ir.Lane(ir.Var(f"{arr}t"), e * u(FRAG) + r), value))
    inside = ir.Var("mf_row_ok").and_(ir.Cast(IDX, e) < ctx.size(ctx.roles.e))
    return [ir.For("mf_r", UINT, rows[0], u(FRAG), [
        ir.Decl("mf_row_ok", "bool", idx < count), *place(idx),
        ir.For("mf_e", UINT, ir.Var("mf_lane"), ir.Var("mf_eb") * u(FRAG), [
            ir.Decl("mf_x", "float", ir.Lit(0.0, "float"), const=False),
            ir.If(inside, [ir.Assign(value, ir.Cast("float", load(ctx, node)))]),
            *stores], step=u(SIMD_WIDTH))], step=rows[1])]


def key_place(idx: ir.Expr) -> list[ir.Stmt]:
    return [ir.Decl("mf_l", IDX, idx)]


def row_place(ctx: Ctx) -> Callable[[ir.Expr], list[ir.Stmt]]:
    return lambda idx: positions(ctx, idx, ctx.roles.tile)


def products_from(frags: str, b: str, out: str) -> list[ir.Stmt]:
    """out = A B^T over the E blocks (8 x 8, fp32): sum_d A[:, d] B^T[d, :], A held in
    registers (fragments `frags`[d]), B^T from `b` ([MAT_E][8]: a transposed staging)."""
    d = ir.Var("mf_d")
    return [ir.Decl(out, "float2", zero(), const=False), unrolled("mf_d", BLOCKS, [
        ir.If(d < ir.Var("mf_eb"), [ir.Assign(ir.Var(out), mma(
            frag(frags, d), mat_load(b, FRAG, u(0), d * u(FRAG)), ir.Var(out)))])])]


def accumulate(acc: str, a: ir.Expr, b: str) -> ir.Stmt:
    """acc[d] += a B[:, d] for each E block d: `a` a fragment (8 x 8), B from `b` ([8][MAT_E])."""
    d = ir.Var("mf_d")
    return unrolled("mf_d", BLOCKS, [ir.If(d < ir.Var("mf_eb"), [ir.Assign(
        frag(acc, d), mma(a, mat_load(b, MAT_E, d * u(FRAG), u(0)), frag(acc, d)))])])


def fragments(names: Sequence[str]) -> list[ir.Stmt]:
    out: list[ir.Stmt] = []
    for n in names:
        out += [ir.ArrayDecl(n, "float2", BLOCKS),
                unrolled("mf_d", BLOCKS, [ir.Assign(frag(n, ir.Var("mf_d")), zero())])]
    return out


def head(ctx: Ctx, count: ir.Expr, per: int = FRAG) -> list[ir.Stmt]:
    """The group's kv head (own axes) and its block mf_blk of 8 of `count` rows or keys; the
    number of E blocks mf_eb; the lane's place in a fragment."""
    grp = ir.Cast(IDX, ir.Var("mf_group"))
    r = ctx.roles
    nblk = ir.Var("mf_nblk")
    return [
        ir.Comment("the group's kv head and block of 8; the lane's place in a fragment"),
        ir.Decl("mf_nblk", IDX, (count + ir.Lit(per - 1, IDX)) / ir.Lit(per, IDX)),
        ir.If(grp >= ctx.span(r.own) * nblk, [ir.Return()]),
        *positions(ctx, grp / nblk, r.own),
        ir.Decl("mf_b0", IDX, grp % nblk * ir.Lit(per, IDX)),
        ir.Decl("mf_eb", UINT, ir.Cast(UINT, (ctx.size(r.e) + ir.Lit(FRAG - 1, IDX))
                                       / ir.Lit(FRAG, IDX))),
        *lane_place(ir.Var("mf_lane"))]


def element(ctx: Ctx, key: ir.Expr, row: ir.Expr, roots: Sequence[Node],
            helpers: set[str]) -> tuple[list[ir.Stmt], list[ir.Expr]]:
    """The fragments' element mf_k as the pair (key, tile row): the roots' values from the
    dots mf_c, mf_dp (`kernels.pair`: the score's work, P, dc), 0 past the keys or rows."""
    r = ctx.roles
    body, values = pair(ctx, "mf_g", {r.lse: ir.Var("mf_lse"), r.delta: ir.Var("mf_delta")},
                        roots, helpers)
    inside = (key < ctx.size(r.key)).and_(row < ctx.span(r.tile))
    names = [f"mf_w{i}" for i in range(len(roots))]
    return [*(ir.Decl(n, "float", ir.Lit(0.0, "float"), const=False) for n in names),
            ir.If(inside, [ir.Decl("mf_l", IDX, key), *positions(ctx, row, r.tile),
                           ir.Decl("mf_lse", "float", load(ctx, r.lse)),
                           ir.Decl("mf_delta", "float", load(ctx, r.delta)), *body,
                           *(ir.Assign(ir.Var(n), v) for n, v in zip(names, values))])], \
        [ir.Var(n) for n in names]


def each_element(ctx: Ctx, key: ir.Expr, row: ir.Expr, roots: Sequence[Node],
                 outs: Sequence[str], helpers: set[str]) -> ir.Stmt:
    """Per element mf_k of the lane's two: mf_c, mf_dp from fragments mf_sf, mf_pf, the
    roots into fragments `outs`."""
    k = ir.Var("mf_k")
    body, values = element(ctx, key, row, roots, helpers)
    return unrolled("mf_k", 2, [
        ir.Decl("mf_c", "float", frag("mf_sf", k)), ir.Decl("mf_dp", "float", frag("mf_pf", k)),
        *body, *(ir.Assign(frag(o, k), v) for o, v in zip(outs, values))])


def store_blocks(ctx: Ctx, kind: str, acc: str) -> list[ir.Stmt]:
    """Output `kind` from fragments acc[d]: the lane's row's elements d * 8 + mf_mc (+ 1)."""
    r = ctx.roles
    if kind not in r.outputs:
        return []
    k = r.outputs.index(kind)
    o = ctx.graph.outputs[k]
    d, i = ir.Var("mf_d"), ir.Var("mf_i")
    value = ir.Cast(ctx.out_stype(k), convert(frag(acc, d, i), F32, o.dtype))
    return [unrolled("mf_d", BLOCKS, [unrolled("mf_i", 2, [
        ir.Decl("mf_e", UINT, d * u(FRAG) + ir.Var("mf_mc") + i),
        ir.If(ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(r.e),
              [ir.Store(ctx.out_names[k], offset(ctx, o.axes), value)])])])]


def key_range(ctx: Ctx, t0: ir.Expr, step: list[ir.Stmt], rows: int) -> list[ir.Stmt]:
    """The loop over the key blocks the `rows` rows from t0 can see (all keys without an
    index mask: `bounds`)."""
    r = ctx.roles
    loop = ir.For("mf_k0", IDX, ir.Var("mf_kbeg"), ir.Var("mf_kend"), step,
                  step=ir.Lit(FRAG, IDX))
    if r.form is None or not masked_by_index(r.form, r.rows):
        return [ir.Comment("every key, 8 at a time"),
                ir.Decl("mf_kbeg", IDX, ir.Lit(0, IDX)), ir.Decl("mf_kend", IDX,
                                                                 ctx.size(r.key)), loop]
    zero = ir.Cast(LONG, ir.Lit(0, "int"))
    return [*block_bounds(ctx, r.form, t0, rows),
            ir.Comment("the key blocks they see, 8 keys at a time"),
            ir.Decl("mf_kbeg", IDX, ir.Cast(IDX, ir.Call("max", (ir.Var("mf_klo"), zero)))
                    / ir.Lit(FRAG, IDX) * ir.Lit(FRAG, IDX)),
            ir.Decl("mf_kend", IDX, ir.Cast(IDX, ir.Call("max", (ir.Call("min", (
                ir.Var("mf_khi"), ir.Cast(LONG, ctx.size(r.key)))), zero)))), loop]


def seen(ctx: Ctx, k0: ir.Expr, step: list[ir.Stmt], keys: int) -> list[ir.Stmt]:
    """`step` for the block of rows mf_t0 .. + 7 where some row sees one of the `keys` keys
    from k0 (always without an index mask: `bounds`)."""
    r = ctx.roles
    if r.form is None or not masked_by_index(r.form, r.rows):
        return step
    k = ir.Cast(LONG, k0)
    k8 = k + ir.Cast(LONG, ir.Lit(keys, "int"))
    return [*block_bounds(ctx, r.form, ir.Var("mf_t0")),
            ir.If((ir.Var("mf_khi") > k).and_(ir.Var("mf_klo") < k8), step)]


def regions(names: Sequence[str] = ("mf_tq", "mf_tqt", "mf_tdo", "mf_tdot")
            ) -> list[ir.Stmt]:
    """One threadgroup array of KSG x 8 x MAT_E floats: a simdgroup's own 8 rows (keys, or
    query rows) of one tensor while they are staged (region mf_sg, `mf_tks`), then the
    arrays `names` ([8][MAT_E] or its transpose each) of the blocks the group shares."""
    out: list[ir.Stmt] = [ir.ArrayDecl("mf_tall", "float", KSG * FRAG * MAT_E, "threadgroup")]
    for i, name in enumerate(names):
        out.append(ir.Decl(name, "threadgroup float*", ir.Var("mf_tall")
                           + u(i * FRAG * MAT_E), const=False))
    out.append(ir.Decl("mf_tks", "threadgroup float*", ir.Var("mf_tall")
                       + ir.Var("mf_sg") * u(FRAG * MAT_E), const=False))
    return out


def own_fragments(ctx: Ctx, name: str, node: Node, first: ir.Expr, count: ir.Expr,
                  place: Callable[[ir.Expr], list[ir.Stmt]]) -> list[ir.Stmt]:
    """The simdgroup's 8 rows from `first` of `node` as fragments `name`[d] in registers
    (the A operands of its products), staged through its region."""
    d = ir.Var("mf_d")
    return [*stage(ctx, "mf_tks", node, first, count, place),
            ir.Barrier(),
            ir.ArrayDecl(name, "float2", BLOCKS),
            unrolled("mf_d", BLOCKS, [ir.Assign(frag(name, d), zero()), ir.If(
                d < ir.Var("mf_eb"), [ir.Assign(frag(name, d), mat_load(
                    "mf_tks", MAT_E, d * u(FRAG), u(0)))])]),
            ir.Barrier()]


def _lanes(own: ir.Var, other: ir.Var) -> tuple[ir.Expr, ir.Expr]:
    """A lane's key or row among the simdgroup's own 8 from `own` (its fragment row), and
    among the block's 8 from `other` that they meet (its fragment column, + mf_k)."""
    return (own + ir.Cast(IDX, ir.Var("mf_mr")),
            other + ir.Cast(IDX, ir.Var("mf_mc") + ir.Var("mf_k")))


def _own_first(name: str) -> ir.Stmt:
    """`name` = the simdgroup's first own key or row: mf_b0 + 8 mf_sg."""
    return ir.Decl(name, IDX, ir.Var("mf_b0") + ir.Cast(IDX, ir.Var("mf_sg") * u(FRAG)))


K0, T0 = ir.Var("mf_k0"), ir.Var("mf_t0")   # the first key, query row of a block (or own)
SHARE = (ir.Var("mf_sg"), u(KSG))   # staging shared by the group: a row per simdgroup


def dkdv_kernel(ctx: Ctx) -> ir.LoweredKernel:
    r = ctx.roles
    helpers: set[str] = {"mf_mma", "mf_mat_load"}
    key, row = _lanes(K0, T0)
    step: list[ir.Stmt] = [
        ir.Comment("the block's 8 query rows: q and dO staged, with their transposes, by the "
                   "whole group"),
        *stage(ctx, "mf_tq", r.q, T0, ctx.span(r.tile), row_place(ctx), transposed=True,
               rows=SHARE),
        *stage(ctx, "mf_tdo", r.dy, T0, ctx.span(r.tile), row_place(ctx), transposed=True,
               rows=SHARE),
        ir.Barrier(),
        ir.Comment("S^T = K Q^T, dP^T = V dO^T; per element P and dc; dV += P^T dO, "
                   "dK += dc^T Q"),
        *products_from("mf_kf", "mf_tqt", "mf_sf"), *products_from("mf_vf", "mf_tdot", "mf_pf"),
        ir.Decl("mf_qf", "float2", zero(), const=False),
        ir.Decl("mf_cf", "float2", zero(), const=False),
        each_element(ctx, key, row, [r.p, r.dc], ["mf_qf", "mf_cf"], helpers),
        accumulate("mf_dvf", ir.Var("mf_qf"), "mf_tdo"),
        accumulate("mf_dkf", ir.Var("mf_cf"), "mf_tq"),
        ir.Barrier()]
    body: list[ir.Stmt] = [
        *regions(),
        *head(ctx, ctx.size(r.key), FRAG * KSG),
        _own_first("mf_k0"),
        ir.Comment("the simdgroup's 8 keys of K and V, as fragments in registers"),
        *own_fragments(ctx, "mf_kf", r.k, K0, ctx.size(r.key), key_place),
        *own_fragments(ctx, "mf_vf", r.v, K0, ctx.size(r.key), key_place),
        *fragments(["mf_dkf", "mf_dvf"]),
        ir.Comment("every query row reading the keys (GQA: the kv head's query heads too), "
                   "8 at a time, in order"),
        ir.For("mf_t0", IDX, ir.Lit(0, IDX), ctx.span(r.tile),
               seen(ctx, ir.Var("mf_b0"), step, FRAG * KSG), step=ir.Lit(FRAG, IDX)),
        ir.Comment("the lane's key's dk and dv"),
        ir.Decl("mf_l", IDX, key),
        ir.If(ir.Var("mf_l") < ctx.size(r.key), store_blocks(ctx, "dk", "mf_dkf")
              + store_blocks(ctx, "dv", "mf_dvf"))]
    summary = (f"{ctx.graph.name} (attention backward, dk dv, simdgroup matrices): a "
               f"threadgroup per {FRAG * KSG} keys of a kv head, 8 a simdgroup (K, V in "
               "registers); dk = sum dc q, dv = sum P dO over the query rows reading them "
               "(staged by the group, 8 at a time), as 8x8 fp32 products")
    return kernel_of(ctx, body, "dkdv_matrix", summary, helpers, SIMD_WIDTH * KSG)


def dq_kernel(ctx: Ctx) -> ir.LoweredKernel:
    r = ctx.roles
    helpers: set[str] = {"mf_mma", "mf_mat_load"}
    row, key = _lanes(T0, K0)
    step: list[ir.Stmt] = [
        ir.Comment("the block's 8 keys: K staged with its transpose, V transposed, by the "
                   "whole group"),
        *stage(ctx, "mf_tk", r.k, K0, ctx.size(r.key), key_place, transposed=True,
               rows=SHARE),
        *stage(ctx, "mf_tv", r.v, K0, ctx.size(r.key), key_place, plain=False,
               transposed=True, rows=SHARE),
        ir.Barrier(),
        ir.Comment("S = Q K^T, dP = dO V^T; per element dc; dQ += dc K"),
        *products_from("mf_qf", "mf_tkt", "mf_sf"), *products_from("mf_dof", "mf_tvt",
                                                                   "mf_pf"),
        ir.Decl("mf_cf", "float2", zero(), const=False),
        each_element(ctx, key, row, [r.dc], ["mf_cf"], helpers),
        accumulate("mf_dqf", ir.Var("mf_cf"), "mf_tk"),
        ir.Barrier()]
    body: list[ir.Stmt] = [
        *regions(("mf_tk", "mf_tkt", "mf_tvt")),
        *head(ctx, ctx.span(r.tile), FRAG * KSG),
        _own_first("mf_t0"),
        ir.Comment("the simdgroup's 8 query rows of q and dO, as fragments in registers"),
        *own_fragments(ctx, "mf_qf", r.q, T0, ctx.span(r.tile), row_place(ctx)),
        *own_fragments(ctx, "mf_dof", r.dy, T0, ctx.span(r.tile), row_place(ctx)),
        *fragments(["mf_dqf"]),
        *key_range(ctx, ir.Var("mf_b0"), step, FRAG * KSG),
        ir.Comment("the lane's row's dq"),
        ir.If(row < ctx.span(r.tile), [*positions(ctx, row, r.tile),
                                       *store_blocks(ctx, "dq", "mf_dqf")])]
    summary = (f"{ctx.graph.name} (attention backward, dq, simdgroup matrices): a "
               f"threadgroup per {FRAG * KSG} query rows of a kv head, 8 a simdgroup (q, dO "
               "in registers); dq = sum_L dc k over the keys (staged by the group, 8 at a "
               "time) as 8x8 fp32 products")
    return kernel_of(ctx, body, "dq_matrix", summary, helpers, SIMD_WIDTH * KSG)
