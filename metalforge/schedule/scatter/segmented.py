"""The deterministic scatter: each output element sums its segment of the sorted index.

Before the launch the call sorts the index tensor on the device (`torch.sort`, stable: the
("sorted", name, "keys"/"order") arguments, `runtime.binding`), so the source rows that go to
one position along the scattered axis are one run of the sorted keys, in their original
order. One thread per output element finds its run by two binary searches (`mf_lower_bound`
of its position and of the next) and adds the run's values in that order, in a register:
no atomics, no zeroing pass, the same bits on every run.

Cost: the sort (one device sort of the index, torch's; its int64 keys and order: 16 bytes an
index, written and read once), 2 log2(indices) key reads per output element
(cached: the threads of one output row search the same keys), and the values read through
the order (a gather of rows, contiguous along the output's other axes). Element 0 checks the
smallest and largest keys against the axis and reports an index out of range.
"""
from __future__ import annotations

from ... import ir
from ..base import IDX
from ..lower import convert, wrap_int
from .atomic import thread_element
from .context import ScatterContext, sorted_tensor


def segmented_body(c: ScatterContext) -> list[ir.Stmt]:
    f = c.form
    t = c.graph.tensor(sorted_tensor(f))
    decls, pos = c.unflatten(f.out_axes, ir.Var("mf_i"), "mf_pos")
    nkeys = ir.Var("mf_nkeys")
    count: ir.Expr = ir.Lit(1, IDX)
    for k, a in enumerate(t.axes):
        count = c.size(a) if k == 0 else count * c.size(a)
    here = ir.Cast("long", pos[f.axis])
    segment: list[ir.Stmt] = [
        ir.Comment(f"this element's run of the sorted index: the keys equal to its position "
                   f"along '{f.axis}'"),
        ir.Decl("mf_lo", IDX, ir.Call("mf_lower_bound", (ir.Var("mf_keys"), nkeys, here))),
        ir.Decl("mf_hi", IDX, ir.Call("mf_lower_bound", (ir.Var("mf_keys"), nkeys,
                                                         here + ir.Lit(1, "long"))))]
    c.helpers.add("mf_lower_bound")
    acc = ir.Var("mf_acc")
    row_decls, rows = c.unflatten(t.axes, ir.Var("mf_src"), "mf_row")
    low = c.lowering(c.positioned({**{a: pos[a] for a in f.cols}, **rows}))
    value_stmts = low.lower([f.values])
    c.helpers.update(low.helpers)
    v = convert(low.value(f.values), f.values.dtype, f.dtype)
    added = wrap_int("+", (acc, v), f.dtype) if f.dtype.is_int else acc + v
    loop = ir.For("mf_j", IDX, ir.Var("mf_lo"), ir.Var("mf_hi"), [
        ir.Decl("mf_src", IDX, ir.Cast(IDX, ir.Load("mf_order", ir.Var("mf_j")))),
        ir.Comment("the source row's position along each axis of the index"), *row_decls,
        ir.Comment("its value (f16/bf16 in f32)"), *value_stmts,
        ir.Assign(acc, added)])
    body: list[ir.Stmt] = [
        ir.Comment("position of this output element along each axis"), *decls,
        ir.Decl("mf_nkeys", IDX, count),
        _range_check(c, nkeys), *segment,
        ir.Comment("its sum, in the sorted (stable: original) order"),
        ir.Decl("mf_acc", c.acc_type, ir.Cast(c.acc_type, ir.Lit(0, "int")), const=False),
        loop,
        ir.Store(c.out, ir.Var("mf_i"), ir.Cast(c.out_stype(), acc))]
    return [ir.Comment("segmented: each thread sums one output element's run of the sorted "
                       "index"),
            *thread_element(), ir.If(ir.Var("mf_i") < ir.Var("mf_numel"), body)]


def _range_check(c: ScatterContext, nkeys: ir.Expr) -> ir.If:
    """Element 0 reports the smallest key below 0, or the largest at or past the size."""
    zero = ir.Lit(0, IDX)
    first = ir.Load("mf_keys", zero)
    last = ir.Load("mf_keys", nkeys - ir.Lit(1, IDX))
    size = ir.Cast("long", c.size(c.form.axis))
    return ir.If(ir.Var("mf_i").eq(zero).and_(nkeys > zero), [
        ir.Comment("the sorted keys' ends: every index in range, or the first one out of it"),
        ir.If(first < ir.Lit(0, "long"), c.report(first),
              [ir.If(last >= size, c.report(last))])])
