"""The prefill kernel with its scores in registers (FlashAttention-2's structure), on Metal 4
tensor operations where the target knows its cooperative tensors' element layout (apple10:
M5's neural accelerators; cuda: the shim's tensor cores; `Target.row_lanes`):

    S[16 rows x KT keys] = Q x K^T, one product over E up to EMAX    (Q held in registers)
    online softmax of S, per row, in fp32, in registers             (P: its weights, as operands)
    O[16 rows x EMAX]    += P x V, one product over the tile's keys (O held in registers)

A threadgroup of four simdgroups takes a tile of ROWS = 64 query rows that read the same
keys, each simdgroup 16 of them, all the tile's keys; the group stages the keys a tile of KT
at a time (the decode kernels' `fill_tiles`) in rows EMAX wide, whose columns past E are
zeroed once. Each simdgroup's q rows are one left input cooperative tensor (16 x EMAX, 0
past E), filled once: the scores' product is one run, whose fragment loads the target may
all issue ahead of its products (NVIDIA H200: a run per 16-block of E, each behind a branch
and a dependent product, was 37% of the kernel's time at E = 128). Its scores are one fp32
destination cooperative tensor (16 x KT), read and rewritten element by element where the
lane holds them; the weights become the left input of the values' products by a copy of each
element (`P[c] = op(S[c])`: the two tensors' elements lie alike on these targets); its
outputs are one destination (16 x EMAX, 0 past E). A row's max is lazy (`online.raise_lazily`)
and a whole tile inside every row's bounds goes without the mask (`scores.inside_bounds`).
Nothing of a row but the K/V tiles goes through threadgroup memory, and a tile takes two
barriers.

Each lane holds elements of two rows of its simdgroup's 16 (one of rows 0..7, one of 8..15:
`row_lanes`), so it keeps two rows' state (max m0 / m1, lane-partial sums d0 / d1), picks an
element's by its row (`get_multidimensional_index`) and combines a row's over the lanes that
hold it with `simd_shuffle_xor` over the target's masks.

Built where `mma.operand` finds half / bfloat operands read from the staged tiles (loads or
gathers: paged K/V) and the target's `row_lanes` is known; elsewhere `mma.kernel` (no layout
assumed) or `prefill.kernel`. Two of it where E may exceed NARROW_PREFILL_E: the kernel of
E up to 32 x run (tiles of 32 keys at 128) and a narrow twin for E up to 64 (tiles of 64
keys, half the registers), which the host picks per call (`tile_keys`: KT, static, is what
the host stages).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ... import ir
from ...graph import Node, strip_casts
from ...target import Target
from .. import online
from ..base import IDX
from ..fragments import UINT, u
from ..hardware import SIMD_WIDTH
from ..lower import as_float, ident
from ..matrix.mpp import each_element, zeroed
from ..matrix.resident import declare_matmul, view
from ..matrix.strided import SIDE, threadgroup_tensor
from ..online import NEG_INF
from .context import CallContext, Emitted, KernelState, lowering
from .head import tiled_head
from .mma import operand, zero_fill
from .mma_phases import state
from .params import NARROW_PREFILL_E, PAD_BYTES, TILE_BYTES
from .prefill import finish, matrix_operands
from .scores import element_score, inside_bounds
from .tiles import fill_tiles, tile_arrays
from .write import epilogue

SIMDGROUPS = 4
ROWS = SIDE * SIMDGROUPS          # query rows a threadgroup
MAX_KEYS = 64                     # keys a tile, at most


def applies(ctx: CallContext, target: Target) -> Optional[str]:
    """The operands' MSL type where this kernel applies, else None."""
    op = operand(ctx, target)
    return op if op is not None and target.tensor_ops and target.row_lanes else None


def tile_keys(emax: int) -> int:
    """Keys a staged tile holds for rows of E up to `emax` (2-byte K/V, rows padded by
    PAD_BYTES, within TILE_BYTES): a power of two from 16 to MAX_KEYS. Static: the scores'
    cooperative tensor is that wide."""
    kt = MAX_KEYS
    while kt > SIDE and kt * (emax * 2 + PAD_BYTES) > TILE_BYTES:
        kt //= 2
    return kt


def _upper(at_row: ir.Expr) -> ir.Expr:
    """Whether an element's row (in the simdgroup's 16) is the lane's second (8..15)."""
    return at_row >= u(8)


def _pick(at_row: ir.Expr, lo: str, hi: str) -> ir.Expr:
    return ir.Select(_upper(at_row), ir.Var(hi), ir.Var(lo))


def _across_row(var: str, fn: str, masks: tuple[int, ...]) -> list[ir.Stmt]:
    """`var` combined (`fn`: fmax or a sum) over the lanes holding the same row."""
    v = ir.Var(var)
    out: list[ir.Stmt] = []
    for m in masks:
        other = ir.Call("simd_shuffle_xor", (v, u(m)))
        out.append(ir.Assign(v, ir.Call(fn, (v, other)) if fn else v + other))
    return out


def kernel(ctx: CallContext, target: Target, narrow: bool = False
           ) -> Optional[ir.LoweredKernel]:
    """The register-resident prefill kernel for E up to 32 x run (`narrow`: up to
    NARROW_PREFILL_E, "prefill_narrow": a row's registers and tiles of that E), or None where
    `applies` says it does not."""
    op = applies(ctx, target)
    if op is None:
        return None
    f = ctx.form
    emax = NARROW_PREFILL_E if narrow else SIMD_WIDTH * ctx.run
    kt = tile_keys(emax)
    ks = KernelState(Emitted(), qt=ROWS, group=SIMD_WIDTH * SIMDGROUPS,
                     epl=emax // SIMD_WIDTH, kt_max=kt)
    ks.out.helpers |= {"mf_tensor_ops", "mf_strides"}
    head = tiled_head(ctx, ks, SIMDGROUPS, (
        f"4 simdgroups of 16 rows, each with all of a tile's keys; the group stages tiles of "
        f"{kt} keys of K and V in threadgroup memory"), inner=True)
    row = ks.with_row(ir.Var("mf_qrow"), table=True)
    operands = matrix_operands(ctx)
    assert operands is not None                      # `operand` found them
    q, k = operands
    k_arr, v_arr = ctx.kv[strip_casts(k)], ctx.kv[strip_casts(f.values)]
    body = _places(ctx) + tile_arrays(ctx, row, runs=False, width=emax)
    body += _zero_columns(ctx, kt, emax) + _declare(op, kt, emax)
    body += _fill_q(ctx, row, q, op) + _lane_rows(ctx)
    weights = _scores(ctx, replace(row, row_pick=ir.Var("mf_qhi")), op, kt, emax, k_arr)
    weights += _softmax(op, target.row_lanes)
    body += _pass(ctx, row, kt, weights, _values(op, kt, emax, v_arr))
    body += _write(ctx, row, target.row_lanes)
    return finish(ctx, ks, head, body, emax, ROWS, (
        f"4 simdgroups of 16 rows; K and V staged as {op} in threadgroup memory, {kt} keys a "
        f"tile; q, the scores, the weights and the outputs in registers (cooperative "
        f"tensors): S = Q K^T and O += P V on Metal 4 tensor ops with {op} operands and fp32 "
        f"accumulation, the online softmax in fp32 (P cast to {op}), one pass"),
        "prefill_narrow" if narrow else "prefill")


def _pass(ctx: CallContext, ks: KernelState, kt: int, weights: list[ir.Stmt],
          values: list[ir.Stmt]) -> list[ir.Stmt]:
    """One pass over the block's keys, `kt` at a time: the tile's K and V staged, the scores
    and their weights (`weights`), the values' products (`values`), a barrier. (Holding the
    next tile's copies in registers while they are in flight, as FlashAttention-2 overlaps
    its copies, took the E = 128 kernel from 168 registers to 232-237 on the H200, two groups
    a core instead of three, and was slower, whether they were held across both products or
    across the values' only: bench/README.md, eleventh session.)"""
    kt_i, tk = ir.Cast(IDX, ir.Lit(kt, "uint")), ir.Var("mf_tk")
    fill = fill_tiles(ctx, ks)
    assert isinstance(fill[-1], ir.Barrier)
    fill[-1:-1] = zero_fill(ctx, kt, columns=False)
    step: list[ir.Stmt] = [ir.Decl("mf_tn", UINT, ir.Cast(UINT, ir.Call("min", (
        ir.Var("mf_l1") - tk, kt_i))))]
    step += fill + weights + values + [
        ir.Comment("every simdgroup is done with the tiles before they are refilled"),
        ir.Barrier()]
    return [ir.Comment(f"one pass over the block's keys along '{ctx.form.key}', {kt} at a time"),
            ir.For("mf_tk", IDX, ir.Var("mf_l0"), ir.Var("mf_l1"), step, step=kt_i)]


def _places(ctx: CallContext) -> list[ir.Stmt]:
    """The thread's place, the simdgroup's rows, E rounded up to a 16-block (mf_ew)."""
    sg, lane = ir.Var("mf_sg"), ir.Var("mf_lane")
    return [ir.Decl("mf_tid", UINT, sg * u(SIMD_WIDTH) + lane),
            ir.Comment("the simdgroup's 16 rows of the tile"),
            ir.Decl("mf_row0", UINT, sg * u(SIDE)),
            ir.Decl("mf_ew", UINT, ir.Cast(UINT, (ctx.size(ctx.form.e) + ir.Lit(15, IDX))
                                           / ir.Lit(16, IDX) * ir.Lit(16, IDX)))]


def _zero_columns(ctx: CallContext, kt: int, emax: int) -> list[ir.Stmt]:
    """The K/V tiles' columns past E (up to `emax`, which the scores' one run reads), 0 in
    every row, once, then a barrier: no copy writes them. A thread zeroes the elements of
    E or later in a 4-byte word of a row (two 2-byte elements): threads never share a word,
    and the copies of the word's element before E come after the barrier."""
    e, words = ir.Var("mf_e_in"), ir.Var("mf_zw")
    r, c = ir.Var("mf_z") / words, (ir.Var("mf_e_in") / u(2) + ir.Var("mf_z") % words) * u(2)
    col = c + ir.Var("mf_x")
    stores: list[ir.Stmt] = [
        ir.Store(arr, r * ir.Var(f"{arr}_stride") + col,
                 ir.Cast(ctx.in_stype(ctx.tensor_of(n)), ir.Lit(0.0, "float")),
                 space="threadgroup") for n, arr in ctx.kv.items()]
    return [ir.Comment(f"the tiles' columns past E (up to {emax}, which the scores' run "
                       "reads whole) are 0, once: no copy writes them; a 4-byte word a thread"),
            ir.Decl("mf_e_in", UINT, ir.Cast(UINT, ctx.size(ctx.form.e))),
            ir.Decl("mf_zw", UINT, ir.Select(e < u(emax), u(emax // 2) - e / u(2), u(0))),
            ir.For("mf_z", UINT, ir.Var("mf_tid"), u(kt) * words, [
                ir.For("mf_x", UINT, u(0), u(2), [ir.If(col >= e, stores)], unroll=True)],
                step=u(SIMD_WIDTH * SIMDGROUPS)),
            ir.Barrier()]


def _declare(op: str, kt: int, emax: int) -> list[ir.Stmt]:
    """The two products' ops and the simdgroup's cooperative tensors: q (the left input, all
    of E up to `emax`), the scores (fp32), the weights (a left input of the values'), the
    outputs (fp32, E up to `emax`, zeroed); the rows' state."""
    k_view, v_view = threadgroup_tensor(op), threadgroup_tensor(op)
    return [
        ir.Comment(f"S (16 x {kt}) += Q (16 x {emax}) K^T and O (16 x {emax}) += "
                   f"P (16 x {kt}) V, a run each"),
        *declare_matmul("mf_s_op", SIDE, kt, emax, True),
        *declare_matmul("mf_p_op", SIDE, emax, kt, False),
        ir.Comment(f"the simdgroup's q rows, E up to {emax} (the left input; 0 past E)"),
        ir.Decl("mf_q", "auto", ir.Call(
            f"mf_s_op.get_left_input_cooperative_tensor<{op}, {op}, float>", ()), const=False),
        ir.Comment("its scores of a tile (fp32), their weights (the values' left input)"),
        ir.Decl("mf_s_tile", "auto", ir.Call(
            f"mf_s_op.get_destination_cooperative_tensor<decltype(mf_q), {k_view}, float>",
            ()), const=False),
        ir.Decl("mf_p_tile", "auto", ir.Call(
            f"mf_p_op.get_left_input_cooperative_tensor<{op}, {op}, float>", ()), const=False),
        ir.Comment(f"its outputs, E up to {emax} (fp32; 0 past E)"),
        ir.Decl("mf_o", "auto", ir.Call(
            f"mf_p_op.get_destination_cooperative_tensor<decltype(mf_p_tile), {v_view}, float>",
            ()), const=False), zeroed("mf_o"),
        ir.Comment("the lane's two rows' state: running max, lane-partial sum"),
        *(ir.Decl(n, "float", v, const=False) for n, v in (
            ("mf_m0", NEG_INF), ("mf_m1", NEG_INF), ("mf_d0", ir.Lit(0.0, "float")),
            ("mf_d1", ir.Lit(0.0, "float"))))]


def _fill_q(ctx: CallContext, ks: KernelState, qn: Node, op: str) -> list[ir.Stmt]:
    """The q cooperative tensor's elements, once: the q side at the element's row and E
    element (0 past E and for rows past the tile's end)."""
    low = lowering(ctx, ks, "mf_q")
    body = low.lower([qn])
    value = as_float(low.value(qn), qn)
    ks.out.helpers |= low.helpers
    live = (ir.Var("mf_qrow") < ir.Var("mf_nlive")).and_(
        ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e))
    def elem(r: ir.Expr, c: ir.Expr, ref: ir.Expr) -> list[ir.Stmt]:
        qv = ir.Var("mf_qv")
        return [ir.Decl("mf_qrow", UINT, ir.Var("mf_row0") + r),
                ir.Decl("mf_e", UINT, c),
                ir.Decl("mf_qv", "float", ir.Lit(0.0, "float"), const=False),
                ir.If(live, body + [ir.Assign(qv, value)]),
                ir.Assign(ref, ir.Cast(op, qv))]
    return [ir.Comment(f"q: each element the lane holds, as {op} (0 past E and past the "
                       "tile's rows)"), each_element("mf_q", elem)]


def _lane_rows(ctx: CallContext) -> list[ir.Stmt]:
    """The lane's two rows of its simdgroup's 16 (mf_lr0 of 0..7, mf_lr1 of 8..15, from the
    scores' elements) and their positions along the tile axes in registers (`mf_rpos_<axis>0`
    / `1`), read from the table once: the scores' masks read them per element without a load
    (`KernelState.row_pick`), so the work on a row's positions is the compiler's to share."""
    lr0, lr1 = ir.Var("mf_lr0"), ir.Var("mf_lr1")

    def elem(r: ir.Expr, c: ir.Expr, ref: ir.Expr) -> list[ir.Stmt]:
        return [ir.Assign(lr1, ir.Select(_upper(r), r, lr1)),
                ir.Assign(lr0, ir.Select(_upper(r), lr0, r))]
    out: list[ir.Stmt] = [
        ir.Comment("the lane's two rows (one of 0..7, one of 8..15) and their positions, once"),
        ir.Decl("mf_lr0", UINT, u(0), const=False), ir.Decl("mf_lr1", UINT, u(8), const=False),
        each_element("mf_s_tile", elem)]
    for a in ctx.tile_axes:
        table = ir.Var(f"mf_tg_tpos_{ident(a)}")
        out += [ir.Decl(f"mf_rpos_{ident(a)}{j}", IDX,
                        ir.Lane(table, ir.Var("mf_row0") + lr)) for j, lr in enumerate((lr0, lr1))]
    return out


def _scores(ctx: CallContext, ks: KernelState, op: str, kt: int, emax: int, k_arr: str
            ) -> list[ir.Stmt]:
    """S = Q K^T in one run over E up to `emax` (q and the tile are 0 past E: one run lets
    the target schedule every fragment load ahead of the products, where a run per 16-block
    of E left a branch and a dependent product between each), then per element the score's
    work (`score`: scale, masks, caps; -inf past the tile's keys and rows) and the lane's
    rows' maxima over it (ignoring NaN: a NaN score's weight is NaN, and so is its row's
    sum). A whole tile of live rows inside every row's bounds (`head.block_keys`) takes the
    score without its mask (`bounds.unmasked`) and no guard: all but the tiles along a
    causal diagonal."""
    k_view = view(threadgroup_tensor(op), ir.Var(k_arr), emax, ir.Var(f"{k_arr}_stride"), kt)
    run = ir.Eval(ir.Call("mf_s_op.run", (ir.Var("mf_q"), k_view, ir.Var("mf_s_tile"))))
    guard = (ir.Var("mf_u") < ir.Var("mf_tn")).and_(ir.Var("mf_qrow") < ir.Var("mf_nlive"))

    def elem(guarded: bool, r: ir.Expr, c: ir.Expr, ref: ir.Expr) -> list[ir.Stmt]:
        sv, hi = ir.Var("mf_sv"), _upper(r)
        return [ir.Decl("mf_qrow", UINT, ir.Var("mf_row0") + r),
                ir.Decl("mf_qhi", "bool", hi),
                ir.Decl("mf_u", UINT, c),
                ir.Decl("mf_l", IDX, ir.Var("mf_tk") + ir.Cast(IDX, ir.Var("mf_u"))),
                ir.Decl("mf_dot", "float", ref),
                *element_score(ctx, ks, guard if guarded else None),
                ir.Assign(ref, sv),
                ir.Assign(ir.Var("mf_t0"), ir.Select(hi, ir.Var("mf_t0"), ir.Call(
                    "fmax", (ir.Var("mf_t0"), sv)))),
                ir.Assign(ir.Var("mf_t1"), ir.Select(hi, ir.Call(
                    "fmax", (ir.Var("mf_t1"), sv)), ir.Var("mf_t1")))]
    work: ir.Stmt = each_element("mf_s_tile", lambda r, c, ref: elem(True, r, c, ref))
    whole = inside_bounds(ctx, u(kt))
    if whole is not None:
        work = ir.If(whole, [
            ir.Comment("a whole tile inside every row's bounds: no mask, no guard"),
            each_element("mf_s_tile", lambda r, c, ref: elem(False, r, c, ref))], [work])
    return [ir.Comment(f"scores: S = Q K^T, 16 rows x {kt} keys, one run over E up to {emax}"),
            zeroed("mf_s_tile"), run,
            ir.Comment("the score's elementwise work on each element the lane holds, and the "
                       "tile's max of each of its two rows"),
            ir.Decl("mf_t0", "float", NEG_INF, const=False),
            ir.Decl("mf_t1", "float", NEG_INF, const=False), work]


def _softmax(op: str, masks: tuple[int, ...]) -> list[ir.Stmt]:
    """The online update of the lane's two rows: the tile's maxima over the row's lanes, each
    row's lazy max (`online.raise_lazily`) and its sum's factor, then the weights p into the
    lane's partial sums and, as the operand type, into P (element for element: the weights'
    layout is the scores')."""
    out: list[ir.Stmt] = [ir.Comment("online softmax of the lane's two rows: the tile's max "
                                     "over each row's lanes; each row's lazy max")]
    out += _across_row("mf_t0", "fmax", masks) + _across_row("mf_t1", "fmax", masks)
    for j in "01":
        out += online.raise_lazily(ir.Var(f"mf_m{j}"), ir.Var(f"mf_t{j}"), f"mf_up{j}",
                                   f"mf_c{j}")
        out += [ir.Assign(ir.Var(f"mf_d{j}"), ir.Var(f"mf_d{j}") * ir.Var(f"mf_c{j}")),
                ir.Decl(f"mf_ms{j}", "float", online.safe_max(ir.Var(f"mf_m{j}")))]

    def elem(r: ir.Expr, c: ir.Expr, ref: ir.Expr) -> list[ir.Stmt]:
        p, hi = ir.Var("mf_pw"), _upper(r)
        return [ir.Decl("mf_pw", "float", online.fast2(ref, _pick(r, "mf_ms0", "mf_ms1"))),
                ir.Assign(ir.Var("mf_d0"), ir.Var("mf_d0") + ir.Select(
                    hi, ir.Lit(0.0, "float"), p)),
                ir.Assign(ir.Var("mf_d1"), ir.Var("mf_d1") + ir.Select(
                    hi, p, ir.Lit(0.0, "float"))),
                ir.Assign(ir.Lane(ir.Var("mf_p_tile"), ir.Var("mf_c")), ir.Cast(op, p))]
    return out + [ir.Comment("the weights: into the lane's partial sums and P"),
                  each_element("mf_s_tile", elem)]


def _values(op: str, kt: int, emax: int, v_arr: str) -> list[ir.Stmt]:
    """O rescaled by its rows' factors where a max of the simdgroup's rows moved, then
    O += P V in one run over E up to `emax` (V's columns past E are 0)."""
    v_view = view(threadgroup_tensor(op), ir.Var(v_arr), emax, ir.Var(f"{v_arr}_stride"), kt)
    moved = ir.Call("simd_any", (ir.Var("mf_up0").or_(ir.Var("mf_up1")),))
    return [ir.Comment(f"the values: O rescaled by its rows' factors (where a row's max "
                       f"moved), then O += P V ({kt} keys x E up to {emax}, one run)"),
            ir.If(moved, [each_element("mf_o", lambda r, c, ref: [
                ir.Assign(ref, ref * _pick(r, "mf_c0", "mf_c1"))])]),
            ir.Eval(ir.Call("mf_p_op.run", (ir.Var("mf_p_tile"), v_view, ir.Var("mf_o"))))]


def _write(ctx: CallContext, ks: KernelState, masks: tuple[int, ...]) -> list[ir.Stmt]:
    """After the keys: each row's sum over its lanes, then each output element the lane
    holds: acc / d through the work after the sum (one block of keys), else the block's state
    for the merge kernel."""
    def each(body: list[ir.Stmt]) -> ir.Stmt:
        def elem(r: ir.Expr, c: ir.Expr, ref: ir.Expr) -> list[ir.Stmt]:
            live = (ir.Var("mf_qrow") < ir.Var("mf_nlive")).and_(
                ir.Cast(IDX, ir.Var("mf_e")) < ctx.size(ctx.form.e))
            return [ir.Decl("mf_qrow", UINT, ir.Var("mf_row0") + r),
                    ir.Decl("mf_e", UINT, c),
                    ir.If(live, [ir.Decl("mf_mm", "float", _pick(r, "mf_m0", "mf_m1")),
                                 ir.Decl("mf_md", "float", _pick(r, "mf_d0", "mf_d1")),
                                 ir.Decl("mf_ov", "float", ref), *body])]
        return each_element("mf_o", elem)
    return [
        ir.Comment("each row's sum over the lanes that hold it"),
        *_across_row("mf_d0", "", masks), *_across_row("mf_d1", "", masks),
        ir.If(ir.Var("mf_splits").eq(u(1)), [
            ir.Comment("one block: outputs = acc / d (all keys masked: 0 / 0 = NaN, as "
                       "softmax gives)"), epilogue(ctx, ks, ir.Var("mf_ov"), each)],
            [ir.Comment("several blocks: this block's state (m, d, acc[E]) for the merge "
                        "kernel"), each(state(ctx, ks))])]
