"""Indexing a traced value by a constant along a literal dim: `w[:, j]`, `w[..., j]`, `w[j]`.

A literal dim ("T[C, 4]") has a size known while tracing, so Python may pick one of its elements
with an integer (inside `for j in range(4)`, the loop unrolls as it traces). The result is the
value with that axis removed. Positions in the key are the annotation's dims for a kernel
argument, and `x.axes` for a computed value; every position but the indexed ones must be a full
slice `:` (an `...` stands for any number of them).

No new graph op is needed: the selection is pushed down to the leaves. A tensor argument becomes
a gather of the constant position (`mf.take(w, axis, j)`, whose index is known in range, so the
kernel reads it without a check: `graph.literal_index`); `mf.index(axis)` becomes the constant;
elementwise operations and reductions over other axes are rebuilt over the selected operands.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Optional, Protocol

from ..dtypes import I64, DType
from ..errors import TraceError
from ..graph import AxisSpec, Node, Op


class Tracing(Protocol):
    """What indexing needs of the trace (frontend.tracer.Trace; not imported: it imports us)."""
    param_axes: dict[str, tuple[str, ...]]
    axis_specs: dict[str, AxisSpec]

    def error(self, msg: str, loc: Optional[tuple[str, int]] = None) -> TraceError: ...

    def node(self, op: Op, args: tuple[Node, ...], dtype: DType, axes: tuple[str, ...],
             attr: Any = None, weak: bool = False) -> Node: ...

_ELEMENTWISE = frozenset({Op.UNARY, Op.BINARY, Op.WHERE, Op.CAST, Op.REDUCE})


def getitem(trace: Tracing, node: Node, key: Any) -> Node:
    """The node of `value[key]` (`node`: the value's): each integer in `key` picks one
    element of a literal axis."""
    axes = _positional_axes(trace, node)
    picks = _picks(trace, axes, key if isinstance(key, tuple) else (key,))
    for axis, j in picks:
        node = select(trace, node, axis, j)
    return node


def _positional_axes(trace: Tracing, node: Node) -> tuple[str, ...]:
    """The axes positions refer to: an argument's annotation order, a computed value's axes."""
    if node.op == Op.LOAD:
        return trace.param_axes[node.attr]
    return node.axes


def _picks(trace: Tracing, axes: tuple[str, ...], key: tuple[Any, ...]) -> list[tuple[str, int]]:
    """(axis, position) for each integer of the key, checked against the literal sizes."""
    shown = f"[{', '.join(axes)}]"
    if sum(k is Ellipsis for k in key) > 1:
        raise trace.error("an index can hold one '...'")
    items = [k for k in key if k is not Ellipsis]
    if len(items) > len(axes):
        raise trace.error(f"too many indices ({len(items)}) for a value with axes {shown}")
    if Ellipsis in key:
        e = key.index(Ellipsis)
        key = key[:e] + (slice(None),) * (len(axes) - len(items)) + key[e + 1:]
    picks = []
    for axis, k in zip(axes, key):
        if isinstance(k, slice) and k == slice(None):
            continue
        if isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise trace.error(
                f"indexing by {k!r} at axis '{axis}' of a value with axes {shown}: a traced "
                "value is indexed only by Python integers along literal dims (w[:, j] for "
                "\"T[C, 4]\"), with ':' elsewhere; a position computed in the kernel is "
                "mf.take(x, axis, index)")
        size = trace.axis_specs[axis].size
        if size is None:
            raise trace.error(
                f"indexing by {int(k)} at axis '{axis}' of a value with axes {shown}: '{axis}' "
                "is sized at the call, so only literal dims (\"T[C, 4]\") take a constant index; "
                f"use mf.take(x, \"{axis}\", {int(k)}) for a checked gather")
        j = int(k) + size if int(k) < 0 else int(k)
        if not 0 <= j < size:
            raise trace.error(f"index {int(k)} is out of range for axis '{axis}' of size "
                              f"{size} (valid: {-size} to {size - 1})")
        picks.append((axis, j))
    return picks


def select(trace: Tracing, root: Node, axis: str, j: int) -> Node:
    """`root` at position j of `axis`, with that axis removed (rebuilt from the leaves)."""
    memo: dict[Node, Node] = {}

    def go(n: Node) -> Node:
        if axis not in n.axes:
            return n
        if n not in memo:
            memo[n] = _select_one(trace, n, axis, j, go)
        return memo[n]
    return go(root)


def _select_one(trace: Tracing, n: Node, axis: str, j: int,
                go: Callable[[Node], Node]) -> Node:
    axes = tuple(a for a in n.axes if a != axis)
    if n.op == Op.LOAD:
        idx = Node(Op.CONST, (), I64, (), attr=j, loc=n.loc)
        return trace.node(Op.TAKE, (idx,), n.dtype, axes, attr=(n.attr, axis))
    if n.op == Op.INDEX:
        return Node(Op.CONST, (), I64, (), attr=j, loc=n.loc)
    if n.op in _ELEMENTWISE and any(axis in a.axes for a in n.args):
        return Node(n.op, tuple(go(a) for a in n.args), n.dtype, axes, attr=n.attr,
                    weak=n.weak, loc=n.loc)
    if n.op == Op.TAKE and axis not in trace.param_axes[n.attr[0]]:
        return Node(n.op, (go(n.args[0]),), n.dtype, axes, attr=n.attr, loc=n.loc)
    if n.op == Op.TAKE:
        raise trace.error(f"cannot index axis '{axis}' of a read of '{n.attr[0]}' along "
                          f"'{n.attr[1]}' (w[:, j] or mf.take): a constant index picks one "
                          "literal dim of an argument per read; a second one of the same "
                          "argument is not supported")
    raise trace.error(f"cannot index axis '{axis}' of a {n.op} value, which brings the axis "
                      "itself; index its operands instead", n.loc)
