"""What the contraction family recognises: one sum over K of a product of two operands that
share K, one over the output's rows (its second-to-last axis, M) and not its columns, the other
over its columns (its last axis, N) and not its rows, both maybe over batch axes (the output's
others, broadcast where an operand lacks one):

    c[..., m, n] = epilogue(sum_k A[..., m, k] * B[..., n, k], ...)

Each operand is an elementwise map of plain tensor reads (a cast, a scale, an activation: the
prologue, computed as the operand tile is staged); whatever follows the sum is an elementwise
map over the output's axes (bias, activation, scale, residual: the epilogue, computed per
output element). An operand is held in its tensors' half or bfloat where its values are exactly
that (a read, an explicit cast: `held_dtype`), else in fp32. Every output is over the output's
axes. Anything else keeps its family.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...dtypes import DType
from ...graph import BinaryOp, Graph, Node, Op, ReduceOp, strip_casts, topo_order

# node kinds a prologue or epilogue may hold (elementwise maps of plain tensor reads)
ELEMENTWISE = frozenset({Op.LOAD, Op.SCALAR, Op.CONST, Op.INDEX, Op.SIZE, Op.UNARY,
                         Op.BINARY, Op.WHERE, Op.CAST})


@dataclass(frozen=True)
class Contraction:
    """The contraction of a graph: `red` = sum over `axis` of a * b; a over `rows`, b over
    `cols`, both maybe over some of `batch`; the output over (*batch, rows, cols)."""
    red: Node
    a: Node
    b: Node
    axis: str
    rows: str
    cols: str
    batch: tuple[str, ...]

    @property
    def out_axes(self) -> tuple[str, ...]:
        return (*self.batch, self.rows, self.cols)


def _plain_reads(graph: Graph, nodes: list[Node]) -> bool:
    """Every node elementwise, every tensor read over plain axes (no derived or joined dims)."""
    for n in nodes:
        if n.op not in ELEMENTWISE:
            return False
        if n.op == Op.LOAD and any(d.derived or d.joined for d in graph.tensor(n.attr).dims):
            return False
    return True


def _operand(graph: Graph, n: Node, k: str, own: str, other: str,
             batch: tuple[str, ...]) -> bool:
    """n is an operand over K and `own`, not `other`, within the batch axes, elementwise."""
    return (k in n.axes and own in n.axes and other not in n.axes
            and set(n.axes) <= {k, own, *batch} and _plain_reads(graph, topo_order([n])))


def _epilogue_ok(graph: Graph, red: Node, out: tuple[str, ...]) -> bool:
    """Every output over `out`; every node besides the sum and its argument's cone an
    elementwise map over the output's axes (no K)."""
    if any(o.axes != out for o in graph.outputs):
        return False
    cone = set(topo_order([red.args[0]]))
    rest = [n for n in graph.nodes() if n is not red and n not in cone]
    k = red.attr[1]
    return all(k not in n.axes for n in rest) and _plain_reads(graph, rest)


def held_dtype(n: Node) -> DType:
    """The dtype an operand's values are exactly: a tensor read's or an explicit cast's own
    (f16/bf16 operands go to the matrix hardware as they are), else its compute type (a
    computed prologue, such as x * scale, is an fp32 value, as the reference computes it: the
    fp32 path; cast it, `(x * s).to(mf.f16)`, to keep half operands)."""
    return n.dtype if n.op in (Op.LOAD, Op.CAST) else n.dtype.compute


def match(graph: Graph) -> Optional[Contraction]:
    """The graph's contraction, or None when it is not of this family's form."""
    reds = graph.reductions()
    if len(reds) != 1 or reds[0].attr[0] != ReduceOp.SUM:
        return None
    red = reds[0]
    k = red.attr[1]
    arg = strip_casts(red.args[0])
    out = max(graph.outputs, key=lambda o: len(o.axes)).axes
    if arg.op != Op.BINARY or arg.attr != BinaryOp.MUL or len(out) < 2 or k in out \
            or not red.dtype.is_float:
        return None
    rows, cols, batch = out[-2], out[-1], tuple(out[:-2])
    if not _epilogue_ok(graph, red, tuple(out)):
        return None
    for a, b in (arg.args, arg.args[::-1]):
        if _operand(graph, a, k, rows, cols, batch) and _operand(graph, b, k, cols, rows, batch):
            return Contraction(red, a, b, k, rows, cols, batch)
    return None
