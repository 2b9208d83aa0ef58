"""The atomic scatter: zero the target, add each source element at its index atomically, and
(f16/bf16 outputs) cast the f32 accumulator to the output.

- `zero`: one thread per output element writes 0 to the target (the output for f32, i32 and
  u32; the f32 accumulator for f16/bf16). A launch of its own rather than a torch.zeros: the
  same one fill, and every backend runs it the same way.
- `add`: one thread per source element (the values' and index's axes, innermost last, so a
  row of an embedding gradient is read and added to by consecutive threads): its index checked
  (out of range: reported, nothing added), its value computed, and `mf_atomic_add` (a relaxed
  atomic_fetch_add_explicit on Metal's atomic_float / atomic_int / atomic_uint) at the
  output's position. Float sums land in the order the atomics do: not reproducible bit for bit
  (deterministic mode is).
- `finish`: one thread per output element converts the f32 accumulator to the output's type.
  f16/bf16 go through f32 rather than a compare-and-swap loop on the 32-bit word holding two
  halves: each add would round to 16 bits (N adds, N roundings, where torch rounds once) and
  contend with its neighbour's half; the accumulator rounds once, like torch's index_add_ on
  CUDA, at the cost of 4 bytes per output element written, read and zeroed.
"""
from __future__ import annotations

from ... import ir
from ..base import IDX
from ..lower import convert
from .context import ScatterContext


def thread_element() -> list[ir.Stmt]:
    return [ir.Decl("mf_i", IDX, ir.Cast(IDX, ir.Var("mf_tid")))]


FILL = 4          # elements a thread of the zero and finish kernels writes (16 bytes of f32)


def _chunked(what: str, whole: list[ir.Stmt], one: list[ir.Stmt]) -> list[ir.Stmt]:
    """A thread's FILL consecutive elements from mf_start: `whole` when they all exist (a
    vector access), else `one` for each that does (element mf_i)."""
    start, numel = ir.Var("mf_start"), ir.Var("mf_numel")
    return [ir.Comment(what),
            ir.Decl("mf_start", IDX, ir.Cast(IDX, ir.Var("mf_tid")) * ir.Lit(FILL, IDX)),
            ir.If(start + ir.Lit(FILL, IDX) <= numel, whole, [
                ir.Comment("the tail: element by element"),
                ir.For("mf_k", "uint", ir.Lit(0, "uint"), ir.Lit(FILL, "uint"), [
                    ir.Decl("mf_i", IDX, start + ir.Var("mf_k")),
                    ir.If(ir.Var("mf_i") < numel, one)], unroll=True)])]


def zero_body(c: ScatterContext) -> list[ir.Stmt]:
    what = "f32 accumulator" if c.form.accumulator else "output"
    typ = "float" if c.form.accumulator else c.out_stype()
    zero = ir.Cast(typ, ir.Lit(0, "int"))
    return _chunked(f"zero: each thread zeroes {FILL} consecutive elements of the {what}",
                    [ir.Store(c.target, ir.Var("mf_start"), ir.Cast(ir.vector_type(typ, FILL),
                                                                     zero), FILL, typ)],
                    [ir.Store(c.target, ir.Var("mf_i"), zero)])


def finish_body(c: ScatterContext) -> list[ir.Stmt]:
    t = c.out_stype()
    sums = ir.Load("mf_scratch", ir.Var("mf_start"), FILL, "float")
    return _chunked(f"finish: each thread rounds {FILL} f32 sums to the output's type",
                    [ir.Store(c.out, ir.Var("mf_start"),
                              ir.Cast(ir.vector_type(t, FILL), sums), FILL, t)],
                    [ir.Store(c.out, ir.Var("mf_i"),
                              ir.Cast(t, ir.Load("mf_scratch", ir.Var("mf_i"))))])


def add_body(c: ScatterContext) -> list[ir.Stmt]:
    """One source element: position, index (checked), value, atomic add."""
    f = c.form
    decls, pos = c.unflatten(f.grid, ir.Var("mf_i"), "mf_pos")
    position = c.positioned(pos)
    low = c.lowering(position)
    index_stmts = low.lower([f.index])
    at = ir.Var("mf_at")
    in_range = (at >= ir.Lit(0, "long")).and_(at < ir.Cast("long", c.size(f.axis)))
    value_stmts = low.lower([f.values])
    c.helpers.update(low.helpers | {"mf_atomic_add"})
    value = convert(low.value(f.values), f.values.dtype, f.dtype)
    out_pos = c.positioned({**pos, f.axis: ir.Var("mf_dst")})
    add = ir.Call("mf_atomic_add", (ir.Var(c.target) + c.offset(f.out_axes, out_pos),
                                    value))   # in the output's compute type: float, int, uint
    body: list[ir.Stmt] = [
        ir.Comment("position of this source element along each axis"), *decls,
        ir.Comment(f"its index along '{f.axis}', checked"), *index_stmts,
        ir.Decl("mf_at", "long", ir.Cast("long", low.value(f.index))),
        ir.If(ir.Unary("!", in_range),
              c.report(at),
              [ir.Decl("mf_dst", IDX, ir.Cast(IDX, at)),
               ir.Comment("its value (f16/bf16 in f32)"), *value_stmts,
               ir.Comment(f"add it at its index: a relaxed atomic on the {c.target} element"),
               ir.Eval(add)])]
    return [ir.Comment("add: each thread adds one source element at its index"),
            *thread_element(), ir.If(ir.Var("mf_i") < ir.Var("mf_count"), body)]

