"""Few long rows split over several threadgroups (`RowSchedule.slices`): 64 rows of 65536 run
the looped kernel in 64 threadgroups, half of an H200's 132 cores idle. Where the rows are
fewer than the policy's fill_groups, each row's chunks (threads_per_group x R elements) are
split into mf_slices slices of whole chunks, one threadgroup each, in two launches:

- ``split``: the slice's pass over its chunks (the looped kernel's first phase: online
  (max, sum) pairs, compensated sums), combined across the group; its first thread writes the
  partial results to scratch, value after value per slice (`slots`).
- ``finish``: every threadgroup of the row reads the row's mf_slices partials and merges
  them in slice order (deterministic; argmax keeps the first index; the online pairs'
  merge as the group combine's, `mf_online_merge`), so each holds the row's results; then the
  epilogue over its own slice stores the outputs along the row, and the first thread of slice
  0 the row's values.

The input is read twice (once per launch), as the looped kernel reads it once per phase and
once more for the epilogue, so the traffic is the same; the slices fill the GPU. Taken by
graphs whose reductions are one pass (`splittable`: rms_norm, softmax, log_softmax, logsumexp,
add_rms_norm, argmax; not layer_norm's mean, then variance) without gathers along the row."""
from __future__ import annotations

from ... import ir
from .. import reduce
from ..base import make_kernel
from .context import RowContext, RowKernel, row_gathers, row_kernel
from .loads import lit
from .phases import epilogue, section
from .place import header, parts

Built = tuple[ir.LoweredKernel, reduce.VariantParts]
SCRATCH = "mf_scratch"


def one_pass(ctx: RowContext) -> list[reduce.Reduction]:
    """The graph's reductions as the streamed kernels fold them (online pairs, compensated
    sums)."""
    return reduce.phases(ctx.graph, online=True, compensated=True)


def splittable(ctx: RowContext) -> bool:
    """Whether the split kernels are built: rows along some axis (a single row would always
    split: the looped kernel then never runs), one pass over the row folds every reduction,
    and no gather reads along the row."""
    return bool(ctx.outer) and max(r.phase for r in one_pass(ctx)) == 0 and \
        not row_gathers(ctx)


def slots(reds: list[reduce.Reduction]) -> list[tuple[str, str]]:
    """(variable, MSL type) of each value a slice leaves in scratch: every accumulator,
    argmax/argmin's index, an online max's running sum."""
    out: list[tuple[str, str]] = []
    for r in reds:
        if r.online_max is not None:
            continue
        out.append((r.acc, r.acc_type))
        if r.has_index:
            out.append((r.idx, "uint"))
        if r.online_sum is not None:
            out.append((r.online_sum.acc, "float"))
    return out


def _bits(e: ir.Expr, frm: str, to: str) -> ir.Expr:
    """A 4-byte value of type `frm` as type `to`, bit for bit (partials in fp32 scratch)."""
    return e if frm == to else ir.Call(f"as_type<{to}>", (e,))


def _at(slice_: ir.Expr, q: int, n: int) -> ir.Expr:
    """Where value q of slice `slice_` of this row sits in scratch."""
    return (ir.Cast("uint", ir.Var("mf_row")) * ir.Var("mf_slices") + slice_) * lit(n) + lit(q)


def split(ctx: RowContext) -> Built:
    """The slices' pass: fold the slice's chunks, combine across the group, store the
    partials."""
    k = row_kernel(ctx, parts(ctx, "split"), keep=False)
    reds = one_pass(ctx)
    ctx.helpers.update(reduce.helpers_of(reds, simd=True) - {"mf_online_merge"})
    roots = [r.arg for r in reds if r.online_max is None]
    section(k, roots, reds, [], "phase 1, this slice's chunks: " +
            ", ".join(r.kind for r in reds if r.online_max is None))
    held = slots(reds)
    stores: list[ir.Stmt] = [ir.Store(SCRATCH, _at(ir.Var("mf_slice"), q, len(held)),
                                      _bits(ir.Var(name), typ, "float"))
                             for q, (name, typ) in enumerate(held)]
    k.parts.main += [ir.Comment("the slice's partials to scratch (its first thread)"),
                     ir.If(ir.Var("mf_t").eq(lit(0)), stores)]
    return _kernel(k, "split: one threadgroup per slice of a row's chunks, partial results to "
                      "scratch")


def finish(ctx: RowContext) -> Built:
    """Merge the row's partials in slice order, then the epilogue over this slice."""
    k = row_kernel(ctx, parts(ctx, "finish"), keep=False)
    reds = [r for r in one_pass(ctx)]
    ctx.helpers.update(reduce.helpers_of(reds, simd=True))
    v = k.parts
    held = slots(reds)
    s = ir.Var("mf_s")
    reads: list[ir.Stmt] = []
    for q, (name, typ) in enumerate(held):
        reads.append(ir.Decl(f"mf_p{q}", typ, _bits(ir.Load(SCRATCH, _at(s, q, len(held))),
                                                     "float", typ)))
    merges: list[ir.Stmt] = []
    q = 0
    for r in reds:
        if r.online_max is not None:
            continue
        other = ir.Var(f"mf_p{q}")
        extra = ir.Var(f"mf_p{q + 1}") if r.has_index or r.online_sum is not None else None
        merges += reduce.merge(r, other, extra)
        q += 2 if extra is not None else 1
    v.main.append(ir.Comment("merge the row's partials, slice after slice"))
    for r in reds:
        v.main.extend(reduce.declare(r))
    v.main.append(ir.For("mf_s", "uint", lit(0), ir.Var("mf_slices"), reads + merges))
    for r in reds:
        v.row_values.values[r.node] = reduce.result(r)
    epilogue(k, (), ir.Var("mf_t").eq(lit(0)).and_(ir.Var("mf_slice").eq(lit(0))))
    return _kernel(k, "finish: the row's partials merged by each of its slices' threadgroups, "
                      "then the outputs of the slice")


def _kernel(k: RowKernel, what: str) -> Built:
    ctx, v = k.ctx, k.parts
    threads, head = header(k)
    body = list(v.tg_arrays) + head + v.pre + v.main
    text = (f"{ctx.graph.name} ({what}); few long rows, streamed in chunks of {k.reads} "
            f"elements per thread, {k.vw}-wide vector loads/stores where aligned; fp32 "
            f"accumulation")
    return make_kernel(ctx.graph, ctx.index64, threads, body, text, v.name), v
