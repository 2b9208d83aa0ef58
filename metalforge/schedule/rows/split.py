"""Few long rows split over several threadgroups (`RowSchedule.slices`): 64 rows of 65536 run
the looped kernel in 64 threadgroups, half of an H200's 132 cores idle. Where the rows are
fewer than the policy's fill_groups, each row's chunks (threads_per_group x R elements) are
split into mf_slices slices of whole chunks, one threadgroup each, in a launch per phase and
one more:

- ``split`` (and ``split_2``, ``split_3`` for the later phases of layer_norm-like graphs: the
  mean, then the variance around it): the slice's pass over its chunks (the looped kernel's
  phase: online (max, sum) pairs, compensated sums), after merging the earlier phases'
  partials of the row (as `finish` does), combined across the group; its first thread writes
  the partial results to scratch, value after value per slice (`layout`).
- ``finish``: every threadgroup of the row reads the row's mf_slices partials and merges
  them in slice order (deterministic; argmax keeps the first index; the online pairs'
  merge as the group combine's, `mf_online_merge`), so each holds the row's results; then the
  epilogue over its own slice stores the outputs along the row, and the first thread of slice
  0 the row's values.

The input is read once per launch, as the looped kernel reads it once per phase and once more
for the epilogue, so the traffic is the same; the slices fill the GPU. Taken by graphs with a
row axis, at most three phases (rms_norm, softmax, log_softmax, logsumexp, add_rms_norm,
argmax: one; layer_norm: two, one with `centered`) and no gather along the row
(`passes`)."""
from __future__ import annotations

from typing import Callable

from ... import ir
from .. import centered, reduce
from ..base import make_kernel
from .context import RowContext, RowKernel, row_gathers, row_kernel
from .loads import lit
from .phases import epilogue, section
from .place import header, parts
from .plan import SPLIT_PASSES

Built = tuple[ir.LoweredKernel, reduce.VariantParts]
SCRATCH = "mf_scratch"


def one_pass(ctx: RowContext) -> list[reduce.Reduction]:
    """The graph's reductions as the streamed kernels fold them (online pairs, centered pairs
    unless the policy says not to, compensated sums)."""
    return reduce.phases(ctx.graph, online=True, compensated=True,
                         centered=ctx.policy.centered is not False)


def passes(ctx: RowContext) -> tuple[str, ...]:
    """The split kernels built for this graph (one per phase, then `finish`; none without a
    row axis, where a single row would always split and the looped kernel never run, with
    more than three phases, or with gathers along the row)."""
    n = 1 + max(r.phase for r in one_pass(ctx))
    if not ctx.outer or n > len(SPLIT_PASSES) or row_gathers(ctx):
        return ()
    return SPLIT_PASSES[:n] + ("finish",)


def held(r: reduce.Reduction) -> list[tuple[str, str]]:
    """(variable, MSL type) of each value a slice leaves in scratch for reduction r: its
    accumulator, argmax/argmin's index, an online max's running sum, a centered pair's state
    of the squares (none for the sum of an online pair: its max holds it)."""
    if r.online_max is not None:
        return []
    out = [(r.acc, r.acc_type)]
    if r.has_index:
        out.append((r.idx, "uint"))
    if r.online_sum is not None:
        out.append((r.online_sum.acc, "float"))
    if r.squares_of is not None:
        out += [(x.name, "float") for x in centered.state(r.i)]
    return out


def layout(reds: list[reduce.Reduction]) -> dict[int, tuple[int, int]]:
    """{reduction number: (first scratch value, values)} of a slice's partials, phase by
    phase."""
    out: dict[int, tuple[int, int]] = {}
    q = 0
    for r in sorted(reds, key=lambda r: (r.phase, r.i)):
        out[r.i] = (q, len(held(r)))
        q += len(held(r))
    return out


def _bits(e: ir.Expr, frm: str, to: str) -> ir.Expr:
    """A 4-byte value of type `frm` as type `to`, bit for bit (partials in fp32 scratch)."""
    return e if frm == to else ir.Call(f"as_type<{to}>", (e,))


def _at(slice_: ir.Expr, q: int, n: int) -> ir.Expr:
    """Where value q of slice `slice_` of this row sits in scratch (n values a slice)."""
    return (ir.Cast("uint", ir.Var("mf_row")) * ir.Var("mf_slices") + slice_) * lit(n) + lit(q)


def merged(k: RowKernel, reds: list[reduce.Reduction], rs: list[reduce.Reduction]
           ) -> None:
    """Statements merging the partials of reductions `rs` over the row's slices, in slice
    order, into their accumulators (added to the kernel's main statements); their results
    become row values."""
    v, place = k.parts, layout(reds)
    n = sum(c for _, c in place.values())
    s = ir.Var("mf_s")
    body: list[ir.Stmt] = []
    for r in rs:
        first, _ = place[r.i]
        vals = held(r)
        for j, (name, typ) in enumerate(vals):
            body.append(ir.Decl(f"mf_p{first + j}", typ, _bits(
                ir.Load(SCRATCH, _at(s, first + j, n)), "float", typ)))
        p = [ir.Var(f"mf_p{first + j}") for j in range(len(vals))]
        if r.squares_of is not None:
            body += centered.merge(r.i, ir.Var(r.acc), p)
        elif vals:
            body += reduce.merge(r, p[0], p[1] if len(p) > 1 else None)
    v.main.append(ir.Comment("merge the row's partials of " +
                             ", ".join(r.kind for r in rs if r.online_max is None) +
                             ", slice after slice"))
    for r in rs:
        v.main.extend(reduce.declare(r))
    v.main.append(ir.For("mf_s", "uint", lit(0), ir.Var("mf_slices"), body))
    v.main.extend(reduce.results(v.row_values, rs))


def pass_kernel(p: int) -> Callable[[RowContext], Built]:
    """The kernel of phase p's launch: merge the earlier phases' partials, fold the slice's
    chunks into phase p's reductions, combine them across the group, store their partials."""
    def build(ctx: RowContext) -> Built:
        k = row_kernel(ctx, parts(ctx, SPLIT_PASSES[p]), keep=False)
        reds = one_pass(ctx)
        ctx.helpers.update(reduce.helpers_of(reds, simd=True))
        if p:
            merged(k, reds, [r for r in reds if r.phase < p])
        rs = [r for r in reds if r.phase == p]
        section(k, [r.arg for r in rs if r.rides is None], rs, [],
                f"phase {p + 1}, this slice's chunks: " +
                ", ".join(r.kind for r in rs if r.rides is None))
        place = layout(reds)
        n = sum(c for _, c in place.values())
        stores: list[ir.Stmt] = []
        for r in rs:
            first, _ = place[r.i]
            stores += [ir.Store(SCRATCH, _at(ir.Var("mf_slice"), first + j, n),
                                _bits(ir.Var(name), typ, "float"))
                       for j, (name, typ) in enumerate(held(r))]
        k.parts.main += [ir.Comment("the slice's partials to scratch (its first thread)"),
                         ir.If(ir.Var("mf_t").eq(lit(0)), stores)]
        return _kernel(k, f"phase {p + 1} of a split row: one threadgroup per slice of its "
                          f"chunks, partial results to scratch")
    return build


def finish(ctx: RowContext) -> Built:
    """Merge the row's partials in slice order, then the epilogue over this slice."""
    k = row_kernel(ctx, parts(ctx, "finish"), keep=False)
    reds = one_pass(ctx)
    ctx.helpers.update(reduce.helpers_of(reds, simd=True))
    merged(k, reds, reds)
    epilogue(k, (), ir.Var("mf_t").eq(lit(0)).and_(ir.Var("mf_slice").eq(lit(0))))
    return _kernel(k, "finish: the row's partials merged by each of its slices' threadgroups, "
                      "then the outputs of the slice")


def _kernel(k: RowKernel, what: str) -> Built:
    ctx, v = k.ctx, k.parts
    if k.vw == 8:
        ctx.helpers.add("mf_pack8_of")
    threads, head = header(k)
    body = list(v.tg_arrays) + head + v.pre + v.main
    text = (f"{ctx.graph.name} ({what}); few long rows, streamed in chunks of {k.reads} "
            f"elements per thread, {k.vw}-wide vector loads/stores where aligned; fp32 "
            f"accumulation")
    return make_kernel(ctx.graph, ctx.index64, threads, body, text, v.name), v
