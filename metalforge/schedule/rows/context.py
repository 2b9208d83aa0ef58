"""What a row kernel is built from: the frozen per-call `RowContext` (the reduction context,
the row tensors' element sizes, what the register variants keep in registers and store early,
the staged kernel's split), a fresh `RowKernel` per variant (its layout and what it collects),
and a `Section` per pass over the row (which inputs it has just loaded, which gathers it serves
from its own registers)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import AbstractSet, Iterable, Mapping

from ... import ir
from ...errors import UnsupportedConstruct, at
from ...graph import BinaryOp, Graph, Node, Op, UnaryOp, topo_order
from .. import reduce
from ..base import IDX
from ..hardware import MAX_THREADGROUP_BYTES
from ..lower import compute_type
from ..policy import LaunchPolicy
from .plan import VARIANTS, WHOLE, group_limit, group_threads, reads_for, vector_width_for


@dataclass(frozen=True, eq=False)
class RowContext(reduce.ReductionContext):
    """The reduction context of one row schedule, with what holds for all its variants."""
    itemsizes: frozenset[int] = frozenset({4})   # bytes of the row tensors' elements
    kept: Mapping[Node, str] = field(default_factory=dict)    # the register variants'
    early: tuple[int, ...] = ()                  # `kept_values` and `early_outputs`
    stage_plan: Mapping[str, int] = field(default_factory=dict)  # the staged kernel's split
    # accumulated while the variants are built: variant → the gathers some section loads
    loaded_gathers: dict[str, set[int]] = field(default_factory=dict)

    @property
    def itemsize(self) -> int:
        """Bytes of the widest row tensor."""
        return max(self.itemsizes)


@dataclass(frozen=True, eq=False)
class RowKernel:
    """One variant being built: its layout (R = `reads` elements a thread, `vw`-wide vector
    accesses, the inputs `staged` to threadgroup memory from which slot on, the `slot_pos`
    layout: `interleaved` chunks, `strided` slots in unaligned rows; the values it `keep`s in
    registers) and what it collects (`parts`; `stored`: the kept values the sections built so
    far hold)."""
    ctx: RowContext
    parts: reduce.VariantParts
    reads: int
    vw: int
    staged: Mapping[str, int]
    interleaved: bool
    strided: bool
    keep: Mapping[Node, str]
    stored: set[Node] = field(default_factory=set)
    mirrored: bool = False      # slot positions from the row's end (a reverse scan's kernel)

    @property
    def name(self) -> str:
        return self.parts.name


@dataclass(frozen=True)
class Section:
    """One pass over the row: the inputs it reads from the registers it has just loaded
    (`fresh`: staged slots still in registers) and its gathers from the thread's own slots
    ({gather: c}, slot k ^ c)."""
    fresh: frozenset[str] = frozenset()
    own_slots: Mapping[Node, int] = field(default_factory=dict)


def row_context(graph: Graph, policy: LaunchPolicy, index64: bool) -> RowContext:
    """The context of the row schedule of `graph` (one reduced axis, checked), with its
    `kept_values`, `early_outputs` and `staging` (where the staged kernel is built)."""
    reds = graph.reductions()
    axes = list(dict.fromkeys(n.attr[1] for n in reds))
    if len(axes) != 1:
        n = next(n for n in reds if n.attr[1] == axes[1])
        raise UnsupportedConstruct(
            f"kernel '{graph.name}': reductions over several axes ({', '.join(axes)}) in one "
            f"kernel{at(n.loc)}; a row-reduction kernel reduces one axis")
    red = reduce.reduction_context(graph, policy, index64, axes[0], "row", "row")
    for n in red.nodes:
        if n.op == Op.REDUCE and any(a not in red.allowed for a in n.axes):
            raise UnsupportedConstruct(f"mf.{n.attr[0]}{at(n.loc)}: unexpected axes")
    axis = red.axis
    itemsizes = frozenset({t.dtype.itemsize for t in red.inputs if axis in t.axes} |
                          {o.dtype.itemsize for o in graph.outputs if axis in o.axes} or {4})
    ctx = RowContext(**reduce.context_fields(red),
                     itemsizes=itemsizes, loaded_gathers={v: set() for v in VARIANTS})
    phases = reduce.phases(graph, online=False)
    ctx = replace(ctx, kept=kept_values(ctx, phases), early=early_outputs(ctx, phases))
    if policy.stage_rows is not False:
        ctx = replace(ctx, stage_plan=staging(ctx, phases))
    return ctx


def row_kernel(ctx: RowContext, parts: reduce.VariantParts, *, interleave: bool = False,
               staged: Mapping[str, int] | None = None, keep: bool = True) -> RowKernel:
    """The layout of variant `parts.name`: its reads and vector width (`reads_for`,
    `vector_width_for`); `interleave`: chunks spread over the row's lanes where a lane holds
    several and the row has no gathers (`slot_pos`); `staged` inputs; whether it `keep`s the
    context's kept values in registers. Rows that are not a multiple of the vector width: a
    thread's slots strided by the row's threads (`placement`), so that each access of a
    simdgroup is one contiguous span (not in the variants taking whole blocks only, nor with
    row gathers)."""
    name = parts.name
    reads = reads_for(ctx.policy, name, ctx.itemsize)
    vw = vector_width_for(ctx.policy, name, set(ctx.itemsizes))
    gathers = row_gathers(ctx)
    return RowKernel(ctx, parts, reads, vw, staged=staged or {},
                     interleaved=interleave and reads > vw and not gathers,
                     strided=vw > 1 and name not in WHOLE and not gathers,
                     keep=ctx.kept if keep else {})


def row_gathers(ctx: reduce.ReductionContext) -> bool:
    """Whether the graph gathers elements along the row (their register and shuffle paths
    assume each lane's block is contiguous; a gather of one value per row is a plain load)."""
    return any(n.op == Op.TAKE and n.attr[1] == ctx.axis and ctx.elem(n) for n in ctx.nodes)


# -- per-row offsets and positions ------------------------------------------------------------

def row_base(ctx: reduce.ReductionContext, into: reduce.Preamble, name: str,
             axes: tuple[str, ...]) -> ir.Expr:
    """Offset of this row's first element in a tensor/output with these axes (declared in
    `into`'s preamble on first use)."""
    var = f"mf_row_{name}"
    if var not in into.pre_names:
        ra = tuple(a for a in axes if a != ctx.axis)
        if ra == ctx.outer:
            e: ir.Expr = ir.Cast(IDX, ir.Var("mf_row"))
        elif not ra:
            e = ir.Lit(0, IDX)
        else:
            e = ctx.position(ra[0], into)
            for a in ra[1:]:
                e = e * ctx.size(a) + ctx.position(a, into)
        if ctx.axis in axes and ra:
            e = e * ctx.size(ctx.axis)
        into.pre.append(ir.Decl(var, IDX, e))
        into.pre_names.add(var)
    return ir.Var(var)


def outer_load(ctx: reduce.ReductionContext, parts: reduce.VariantParts, n: Node) -> ir.Expr:
    """Input `n` at this row (a value without the row's axis)."""
    t = ctx.graph.tensor(n.attr)
    return ir.Cast(compute_type(t.dtype), ir.Load(ctx.names[t.name],
                                                  row_base(ctx, parts, ctx.names[t.name],
                                                           t.axes)))


def el_position(k: RowKernel, axis: str) -> ir.Expr:
    """An element's position along `axis`: mf_pos along the row, the row's elsewhere."""
    return ir.Var("mf_pos") if axis == k.ctx.axis else k.ctx.position(axis, k.parts)


# -- what the register variants keep ------------------------------------------------------------

def element_nodes(ctx: reduce.ReductionContext, roots: Iterable[Node],
                  stop: AbstractSet[Node] = frozenset()) -> set[Node]:
    """The element nodes the values of `roots` are computed from (themselves included; not
    below `stop`, values already in registers)."""
    seen: set[Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen or not ctx.elem(n):
            continue
        seen.add(n)
        if n not in stop:
            stack.extend(n.args)
    return seen


def kept_values(ctx: reduce.ReductionContext, reds: list[reduce.Reduction]) -> dict[Node, str]:
    """Element values a register variant keeps in registers from the phase that computes
    them to the later phases or outputs that use them ({node: register array}):
    - the computed argument of a reduction that later element values use again (softmax's
      exp(x - max), computed once instead of twice);
    - the values `carried` in place of the inputs they are computed from."""
    later = [r.arg for r in reds] + [o.node for o in ctx.graph.outputs]
    keep: dict[Node, str] = {}
    for r in reds:
        a = r.arg
        if not ctx.elem(a) or a.op == Op.LOAD or a in keep:
            continue
        if not ctx.policy.keep_narrow and narrow_arithmetic(ctx, a, set(keep)):
            continue
        if any(n is not a and a in element_nodes(ctx, [n]) for n in later):
            keep[a] = f"mf_keep{r.i}"
    return keep | carried(ctx, reds, keep)


# the element operations a later phase recomputes rather than hold their fp32 result
_PLAIN_UNARY = frozenset({UnaryOp.NEG, UnaryOp.ABS})
_PLAIN_BINARY = frozenset({BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV,
                           BinaryOp.MAXIMUM, BinaryOp.MINIMUM})


def narrow_arithmetic(ctx: reduce.ReductionContext, a: Node, stop: AbstractSet[Node]) -> bool:
    """Whether `a` is plain arithmetic (+ - * /, min, max, neg, abs, casts) on inputs and on
    values without the row's axis whose element blocks hold fewer bytes together than its own
    fp32 block (softmax(x / t)'s x / t on 2-byte x; not h = x + r on two): the register
    variants hold the inputs anyway, and a later phase recomputes `a` from them instead of
    holding it (launch option keep_narrow=False, the default). On the cuda backend the kept
    block of f16 x / t spilled at 32 registers a thread (48 without the cap), so the row of
    16384 ran one group of 1024 threads a core where softmax(x) runs two (40% of copy_ at
    2048x16384, issue #54)."""
    loaded: set[str] = set()
    for n in element_nodes(ctx, [a], stop):
        if n in stop:
            return False                 # built on a value held already: keep as before
        if n.op == Op.LOAD:
            loaded.add(n.attr)
        elif n.op == Op.UNARY and n.attr not in _PLAIN_UNARY or \
                n.op == Op.BINARY and n.attr not in _PLAIN_BINARY or \
                n.op not in (Op.UNARY, Op.BINARY, Op.CAST, Op.SCALAR, Op.CONST):
            return False
    held = sum(ctx.graph.tensor(t).dtype.itemsize for t in loaded)
    return 0 < held < 4


def carried(ctx: reduce.ReductionContext, reds: list[reduce.Reduction], keep: dict[Node, str]
            ) -> dict[Node, str]:
    """Element values a phase computes from the inputs it holds that the later sections
    read in their place, where that leaves fewer register blocks live past the phase
    (greedily, each value at least one block fewer than it costs): add_rms_norm's
    h = x + r is one block of floats where x and r are two, and the epilogue no longer
    adds them again. Values are unchanged: the epilogue read the same fp32 h."""
    order = {n: i for i, n in enumerate(ctx.nodes)}
    outs = [o.node for o in ctx.graph.outputs if ctx.elem(o.node)]
    carry: dict[Node, str] = {}
    loaded: set[str] = set()
    made: set[Node] = set()
    for p in range(1 + max(r.phase for r in reds)):
        stop = set(keep) | set(carry)
        now = [r.arg for r in reds if r.phase == p and r.online_max is None]
        later = [r.arg for r in reds if r.phase > p and r.online_max is None] + outs
        loaded |= set(ctx.cone(now, stop)[0])
        fresh = element_nodes(ctx, now, stop) - made
        made |= fresh
        used = element_nodes(ctx, later, stop)
        options = sorted((n for n in fresh & used if n.op != Op.LOAD), key=order.__getitem__)

        def held(stop: set[Node]) -> int:
            return len(loaded & set(ctx.cone(later, stop)[0]))
        while options:
            now_held = held(stop)
            gain, best = max(((now_held - held(stop | {n}) - 1, n) for n in options),
                             key=lambda t: t[0])
            if gain <= 0:
                break
            carry[best] = f"mf_carry{len(carry) + 1}"
            stop.add(best)
            options.remove(best)
    return carry


def early_outputs(ctx: reduce.ReductionContext, reds: list[reduce.Reduction]
                  ) -> tuple[int, ...]:
    """Outputs along the row computed from no reduction's result and only from inputs the
    first phase loads (add_rms_norm's h): the register variants store them in the first phase,
    not the epilogue (the looped one reads the row again anyway; storing there too ran f32
    add_rms_norm 2048x16384 2% slower on the H100)."""
    first = [r.arg for r in reds if r.phase == 0 and r.online_max is None]
    loaded = set(ctx.cone(first)[0])
    out: list[int] = []
    for k, o in enumerate(ctx.graph.outputs):
        tensors, frontier = ctx.cone([o.node])
        if ctx.elem(o.node) and set(tensors) <= loaded and \
                not any(n.op == Op.REDUCE for n in topo_order(frontier)):
            out.append(k)
    return tuple(out)


def most_threads(ctx: RowContext) -> int:
    """Threads of the staged kernel's longest row (what its threadgroup arrays hold)."""
    return group_threads(ctx.policy, ctx.itemsize, group_limit(ctx.policy, ctx.itemsize))


def staging(ctx: RowContext, reds: list[reduce.Reduction]) -> dict[str, int]:
    """The staged variant's split: {input: S} for the inputs phase 1 loads, in order, whose
    slots S..R-1 (the second half of the thread's block, whole vector chunks) fit in half
    of the threadgroup memory at the most threads a group row takes (float types only:
    their blocks keep the storage type), of those a later section reads (not only through
    kept values). Empty when the block is a single chunk."""
    p = ctx.policy
    reads = reads_for(p, "staged", ctx.itemsize)
    vw = vector_width_for(p, "staged", set(ctx.itemsizes))
    split = reads // vw // 2 * vw
    if vw < 2 or not split:
        return {}
    threads = most_threads(ctx)
    first = [r.arg for r in reds if r.phase == 0 and r.online_max is None]
    later = [r.arg for r in reds if r.phase > 0] + [o.node for o in ctx.graph.outputs]
    made = element_nodes(ctx, first)
    kept = [n for n in ctx.kept if n in made]
    read = set(ctx.cone(later, kept)[0])          # read again after phase 1
    out: dict[str, int] = {}
    room = MAX_THREADGROUP_BYTES // 2
    for name in ctx.cone(first)[0]:
        if name not in read:
            continue
        t = ctx.graph.tensor(name)
        need = (reads - split) * threads * t.dtype.itemsize
        if compute_type(t.dtype) == "float" and need <= room:
            out[name] = split
            room -= need
    return out
