"""The quantized sum transposed: a reduction over the weight rows N of words unpacked along an
axis the outputs keep (K), dx[m, k] = sum_n dy[m, n] * w[n, k] with w dequantized from
"u32[N, K/8]" words: the gradient of the quantized matvec / matmul with respect to x
(`metalforge.autodiff`). It is a column reduction (`schedule.column`): threads run along K
(neighbouring threads, neighbouring words), each loops over N; a word is read by the threads
of its K/8 values, from one memory transaction, so the packed words, scales and biases are
read once per pass (per row of dy: M rows re-read them from cache)."""
from __future__ import annotations

from typing import Optional

from ...graph import Graph, Op, topo_order


def transposed(graph: Graph) -> Optional[str]:
    """The reduced axis of a graph whose one reduced axis is not the axis its unpacked words
    run along (the words' axis kept by the outputs); None for any other graph."""
    reds = graph.reductions()
    if not reds:
        return None
    axis: str = reds[0].attr[1]
    if any(r.attr[1] != axis for r in reds):
        return None
    unpacks = [n for r in reds for n in topo_order([r.args[0]]) if n.op == Op.UNPACK]
    if not unpacks:
        return None
    for u in unpacks:
        packed = graph.axis_spec(u.args[0].axes[-1])
        if packed.base == axis or not all(packed.base in o.axes for o in graph.outputs):
            return None
    return axis
