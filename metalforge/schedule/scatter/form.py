"""What a scatter kernel is: the one `mf.scatter_add` output of a graph, checked.

`match` finds the SCATTER node (None when the graph has none) and refuses what no scatter
kernel computes: other outputs beside it, work on its result, a second scatter, reductions in
its values or index. The form names the axes the kernels walk: the source `grid` (the values'
and the index's axes), its `rows` (the index's axes, summed over) and `cols` (the others, which
the output keeps beside the scattered `axis`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...dtypes import F32, DType
from ...errors import UnsupportedConstruct, at
from ...graph import Graph, Node, Op, topo_order


@dataclass(frozen=True)
class ScatterForm:
    node: Node                    # the SCATTER node (the graph's output)
    axis: str                     # the scattered axis
    grid: tuple[str, ...]         # the source elements' axes, canonical order
    rows: tuple[str, ...]         # the index's axes (a source row: one index)
    cols: tuple[str, ...]         # the output's other axes (the rest of the grid)
    out_axes: tuple[str, ...]     # the output's storage order
    deterministic: bool

    @property
    def values(self) -> Node:
        return self.node.args[0]

    @property
    def index(self) -> Node:
        return self.node.args[1]

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def accumulator(self) -> bool:
        """Atomic mode's f16/bf16 outputs accumulate in an f32 buffer (the scratch), cast at
        the end (deterministic mode sums in a register)."""
        return self.dtype.is_float and self.dtype is not F32 and not self.deterministic


def match(graph: Graph) -> Optional[ScatterForm]:
    """The scatter form of `graph`, None when it has no scatter, or an error naming what no
    scatter kernel computes."""
    scatters = [n for n in graph.nodes() if n.op == Op.SCATTER]
    if not scatters:
        return None
    n = scatters[0]
    where = f"kernel '{graph.name}'{at(n.loc)}"
    if len(graph.outputs) != 1 or graph.outputs[0].node is not n:
        raise UnsupportedConstruct(
            f"{where}: mf.scatter_add must be the kernel's only output, returned as it is "
            f"(the output is zeroed and added to at computed positions); compute other "
            f"outputs, or work on the scattered result, in another kernel")
    for m in topo_order(n.args):
        if m.op == Op.SCATTER:
            raise UnsupportedConstruct(f"{where}: a scatter inside another scatter's values "
                                       f"or index{at(m.loc)}; one scatter per kernel")
        if m.op == Op.REDUCE:
            raise UnsupportedConstruct(
                f"{where}: the values or index of a scatter use a reduction (mf.{m.attr[0]} "
                f"over '{m.attr[1]}'{at(m.loc)}); compute it in another kernel and pass it in")
    vals, idx = n.args
    axis, deterministic = n.attr
    names = set(vals.axes) | set(idx.axes)
    names -= {a for a in names if graph.axis_spec(a).base in names}    # K/8 beside K: k // 8
    grid = tuple(a for a in _canonical(graph) if a in names)
    rows = tuple(a for a in grid if a in idx.axes)
    cols = tuple(a for a in grid if a not in idx.axes)
    return ScatterForm(n, axis, grid, rows, cols, graph.outputs[0].axes, deterministic)


def _canonical(graph: Graph) -> list[str]:
    """Every axis of the graph's tensors (and derived dims' bases), in canonical order."""
    out: list[str] = []
    for t in graph.tensors:
        for d in t.dims:
            for a in ((d.base,) if d.base else ()) + (d.name,):
                if a not in out:
                    out.append(a)
    return out
