"""The single-launch merge of a chunked column reduction (launch option ``one_launch``).

The split (or wide) kernel's grid splits the reduced axis into chunks; with ``one_launch`` the
last threadgroup of each column block to finish merges the block's chunks itself, in the same
launch, instead of a second (combine) launch:

1. slice 0 of every group stores its chunk's fp32 partials to scratch through a
   ``coherent(device)`` pointer (`mf_coherent_store`: visible to other threadgroups, which a
   plain device store is not guaranteed to be before Metal 3.2's coherent memory);
2. every thread fences its device writes at device scope (`mf_device_fence`: an
   ``atomic_thread_fence(mem_device, seq_cst, thread_scope_device)``), then a threadgroup
   barrier, then one thread takes a ticket between two more fences (release of what the group
   stored, acquire of what earlier groups did): a relaxed ``atomic_fetch_add`` of 1 on the
   block's word of the counter buffer (`mf_ticket`), shared with the group through threadgroup
   memory and a barrier (CUDA's threadFenceReduction pattern, with fences on both sides);
3. the group holding ticket chunks - 1 (the last to arrive: every other group of the block has
   fenced its partials before taking its ticket) fences again (the acquire side), merges the
   chunks exactly as the combine kernel does (slice s takes chunks s, s + S, ... in chunk
   order, the slices merged in slice order: the same bits whichever group is last, and the
   same as the two-launch merge), stores the outputs, and puts the block's word back to 0
   (`mf_ticket_reset`), so the next launch on the stream finds it zeroed.

The counter buffer (``("counter",)`` binding: one uint per column block) is made zeroed by the
runtime once and kept (runtime/counters.py: per device and stream; why that is safe with CUDA
graphs, concurrent calls and aborted launches is said there). Deterministic: a column's sum has
the same bits on every run.
"""
from __future__ import annotations

from .. import ir
from . import reduce
from .base import IDX
from .column_merge import ChunkMerges, copies
from .hardware import SIMD_WIDTH

COUNTER = "mf_counter"
# chunks' partials a thread of the last group loads at once (for all its columns: the wide
# kernel's block holds several 32-column passes), at most MERGE_FLOATS values in registers: the
# merge is the launch's serial tail (at 4096x128 f16, 64 chunks: 8 a slice for each of 4
# columns, one round trip to L2 instead of eight); the merges stay in chunk order, so the
# bits are the combine kernel's
MERGE_READS = 8
MERGE_FLOATS = 32


def counter_argument(index: int) -> ir.Argument:
    """The counter buffer: a uint per column block, zero between launches."""
    return ir.Argument(COUNTER, index, "buffer", "uint", ("counter",), True)


class TicketMerges(ChunkMerges):
    """`chunks_merged` for one launch (a mixin of `column.ColumnKernel`)."""

    def chunks_merged(self) -> list[ir.Stmt]:
        if not self.ctx.ticket:
            return []
        tk = ir.Lane(ir.Var("mf_tk"), ir.Lit(0, "uint"))
        first = ir.Var("mf_lid").eq(ir.Lit(0, "uint"))
        fence = ir.Eval(ir.Call("mf_device_fence", ()))
        word = ir.Var(COUNTER) + ir.Var("mf_block")
        self.ctx.helpers.update({"mf_ticket", "mf_device_fence", "mf_coherent"})
        self.parts.tg_arrays.append(ir.ArrayDecl("mf_tk", "uint", 1, "threadgroup"))
        return [
            ir.Comment("one launch: this group's partials visible device-wide, then its ticket "
                       "(groups of this column block that arrived before it)"),
            fence, ir.Barrier(),
            ir.Comment("the ticket between two fences: the group's stores (seen by this thread "
                       "at the barrier) released with it, the earlier groups' acquired"),
            ir.If(first, [fence, ir.Assign(tk, ir.Call("mf_ticket", (word,))), fence]),
            ir.Barrier(),
            ir.If(tk.eq(ir.Var("mf_chunks") - ir.Lit(1, "uint")), [
                ir.Comment("the block's last group: every chunk's partials are stored; merge "
                           "them as the combine kernel does, then zero the block's word"),
                fence, *self.ticket_merge(),
                ir.If(first, [ir.Eval(ir.Call("mf_ticket_reset", (word,)))])])]

    def ticket_merge(self) -> list[ir.Stmt]:
        """The merge of the block's chunks, as the combine kernel places 32 columns x S
        slices (the wide kernel's block holds `wide` such): every thread loads and merges
        the partials of its column in each of them together (one chain of loads, their
        accumulators numbered apart), then each 32 columns' slices meet in threadgroup memory
        in turn (a barrier first: the arrays are reused) and slice 0 stores their outputs."""
        c = self.ctx.wide if self.parts.name == "wide" else 1
        sib, parts = self.merge_parts()
        slices = self.ctx.policy.rows_per_group
        reds = reduce.phases(self.ctx.graph, online=True, compensated=True)
        self.ctx.helpers.update(reduce.helpers_of(reds, simd=False))
        per = [copies(reds, j) for j in range(c)]
        ncols = self.ctx.span(self.ctx.outer)
        head: list[ir.Stmt] = [ir.Comment(
            f"the block's {c} x 32 columns' partials merged together: slice s takes chunks s, "
            f"s + {slices}, ... in chunk order (a dead column reads column 0's, never stored)")]
        cols: list[ir.Expr] = []
        for j in range(c):
            col = (ir.Var("mf_block") * ir.Lit(c, "uint") + ir.Lit(j, "uint")) * \
                ir.Lit(SIMD_WIDTH, "uint") + ir.Var("mf_lane")
            head += [ir.Decl(f"mf_colj{j}", "uint", col),
                     ir.Decl(f"mf_livej{j}", "bool",
                             ir.Cast(IDX, ir.Var(f"mf_colj{j}")) < ncols)]
            cols.append(ir.Select(ir.Var(f"mf_livej{j}"), ir.Var(f"mf_colj{j}"),
                                  ir.Lit(0, "uint")))
        for rs in per:
            for r in rs:
                head += reduce.declare(r)
        reads = max(2, min(MERGE_READS, MERGE_FLOATS // (c * max(1, len(self.ctx.slots)))))
        head += sib.chunk_merges(reds, slices, reads,
                                 tuple((rs, col) for rs, col in zip(per, cols)))
        head += reduce.finish([r for rs in per for r in rs])
        slots = sib.combine_slices(parts, reds, slices)
        for r in reds:
            parts.row_values.values[r.node] = reduce.result(r)
        sib.epilogue(parts, 1)
        self.ctx.helpers.update(parts.row_values.helpers)
        own = {a.name for a in self.parts.tg_arrays}
        self.parts.tg_arrays.extend(a for a in parts.tg_arrays if a.name not in own)
        out: list[ir.Stmt] = head
        for j in range(c):
            take: list[ir.Stmt] = [
                ir.Assign(ir.Var(a.name), ir.Var(b.name))
                for r, cp in zip(reds, per[j])
                for a, b in zip(reduce.declare(r), reduce.declare(cp))
                if isinstance(a, ir.Decl) and isinstance(b, ir.Decl)] if j else []
            out.append(ir.Block([
                ir.Comment(f"columns {j * SIMD_WIDTH} to {(j + 1) * SIMD_WIDTH - 1} of the "
                           f"block: the slices in slice order, then the outputs"),
                ir.Barrier(),
                ir.Decl("mf_col", "uint", ir.Var(f"mf_colj{j}")),
                ir.Decl("mf_live", "bool", ir.Var(f"mf_livej{j}")),
                *parts.pre, *take, *slots,
                ir.If(ir.Var("mf_live").and_(ir.Var("mf_slice").eq(ir.Lit(0, "uint"))),
                      list(parts.main))]))
        return out
