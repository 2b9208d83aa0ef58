"""The forms the quantized family recognises in a graph.

- `match`: the family itself, a reduction whose argument unpacks packed words;
- `affine`: that argument as (q * s + b) * x, with q the unpacked value, s and b per-group
  scale and bias of the weight row and x a value the rows share (the matvec kernels' fast
  arithmetic);
- `factors`: that argument as a product W * X of a weight factor and a factor over the rows
  of x (the tiled kernel, `qmm`).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from ...graph import BinaryOp, Graph, Node, Op, strip_casts, topo_order
from .context import QuantContext


def match(graph: Graph) -> Optional[Node]:
    """The reduction whose argument unpacks packed words, or None when there is none."""
    return next((r for r in graph.reductions()
                 if any(n.op == Op.UNPACK for n in topo_order([r.args[0]]))), None)


def is_quant(graph: Graph) -> bool:
    return match(graph) is not None


class Affine(NamedTuple):
    q: Node                              # the UNPACK node
    s: Node                              # per-group scale
    b: Node                              # per-group bias
    x: Node                              # the shared factor


def _operands(n: Node, op: str) -> list[tuple[Node, Node]]:
    """A binary `op` node's operands in both orders; [] for any other node."""
    if n.op != Op.BINARY or n.attr != op:
        return []
    a, b = n.args
    return [(a, b), (b, a)]


def affine(ctx: QuantContext, red: Optional[Node] = None) -> Optional[Affine]:
    """The argument of the reduction (`red`, else the first) as (q * s + b) * x, with q the
    unpacked value, s and b per-group values of the row (over rows axis and K/GS, GS a
    multiple of the chunk, so constant over a chunk) and x a value the rows share; None for
    any other form."""
    for qsb, x in _operands((red or ctx.red).args[0], BinaryOp.MUL):
        for qs, b in _operands(qsb, BinaryOp.ADD):
            for q, s in _operands(qs, BinaryOp.MUL):
                q = strip_casts(q)
                if (q.op == Op.UNPACK and _per_group(ctx, s) and _per_group(ctx, b)
                        and _shared(ctx, x) and q.args[0].op == Op.LOAD):
                    return Affine(q, s, b, x)
    return None


def affines(ctx: QuantContext) -> Optional[list[Affine]]:
    """Every sum's affine form, where each has one and all share one x (the gate and up
    projections of one input: x read, and its chunk sum taken, once for both); else None."""
    forms = [affine(ctx, r) for r in ctx.reds]
    if any(f is None for f in forms):
        return None
    found = [f for f in forms if f is not None]
    return found if all(f.x is found[0].x for f in found) else None


def _per_group(ctx: QuantContext, n: Node) -> bool:
    """A load over the rows axis and K/GS (and other output axes), GS a multiple of C."""
    n = n.args[0] if n.op == Op.CAST else n
    if n.op != Op.LOAD or ctx.axis in n.axes or ctx.rows_axis not in n.axes:
        return False
    derived = [ctx.graph.axis_spec(a) for a in n.axes if a not in ctx.outer]
    return len(derived) == 1 and derived[0].base == ctx.axis and \
        derived[0].div % ctx.chunk == 0


def _shared(ctx: QuantContext, n: Node) -> bool:
    """x: computed from shared tensors (registers) only, without the rows axis."""
    loads = [m for m in topo_order([n]) if m.op == Op.LOAD]
    return ctx.rows_axis not in n.axes and bool(loads) and all(
        ctx.graph.tensor(m.attr) in ctx.shared for m in loads) and \
        not any(m.op in (Op.UNPACK, Op.REDUCE) for m in topo_order([n]))


def factors(ctx: QuantContext) -> Optional[tuple[Node, Node]]:
    """(W, X) when the reduction's argument is W * X with W over the weight rows and no other
    output axis, X over the tile's M axis and not the weight rows; None otherwise."""
    if not ctx.prefix or len(ctx.reds) > 1:        # the tiled kernel has one sum
        return None
    arg = strip_casts(ctx.red.args[0])
    if arg.op != Op.BINARY or arg.attr != BinaryOp.MUL:
        return None
    m_axis = ctx.prefix[-1]
    for w, x in (arg.args, arg.args[::-1]):
        if (ctx.rows_axis in w.axes and not any(a in w.axes for a in ctx.prefix)
                and m_axis in x.axes and ctx.rows_axis not in x.axes
                and not any(n.op in (Op.UNPACK, Op.REDUCE, Op.TAKE) for n in topo_order([x]))
                and not any(n.op in (Op.REDUCE, Op.TAKE) for n in topo_order([w]))):
            return w, x
    return None
