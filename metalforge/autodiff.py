"""Reverse-mode differentiation of a kernel's Graph into backward kernels (Graphs again).

`derive(graph, wrt)` walks the forward graph from its outputs back to its tensor loads and
builds the adjoint of every value as new `Node`s of the same graph form, so the backward runs
through the same schedule → IR → MSL pipeline as any kernel (`run_backward`):

- The backward kernels read the forward *inputs* and the output gradients (``dy``) and
  recompute every forward value they need: nothing but the inputs is saved. A recomputed row
  reduction reads the row that the backward kernel holds in registers anyway, so it moves no
  extra bytes (saving it would write and re-read one value per row). The exception is
  mf.logsumexp over rows longer than a threadgroup holds, where recomputing it reads the row
  again: `derive(saved=True)` loads it from a buffer that the forward of
  `runtime.saving.forward_saving` writes (4 bytes a row), and `runtime.saving` picks that plan
  where it moves fewer bytes.
- A gradient that reaches a tensor through broadcasting (``w["D"]`` in a ``[B, D]`` kernel) is
  summed over the broadcast axes.
- A schedule reduces one axis per kernel, so the gradients are split into kernels by the axis
  they reduce: a gradient that needs a reduction over another axis first (rms_norm's ``dw``
  sums over ``B`` values that need ``sum(x * x)`` over ``D``) reads that reduction from a small
  f32 buffer written by an earlier kernel of the backward (the row kernel of ``dx``).
  rms_norm's backward is one row-reduction kernel for ``dx`` (which also writes ``sum_D``, one
  float per row) and one column reduction for ``dw``.

Differentiable: + - * / ** (int or float exponents), neg, exp, exp2, log, log2, sqrt, rsqrt,
sin, cos, tanh, sigmoid, erf, abs, floor/ceil (zero), maximum/minimum (ties split the gradient,
as torch), mod, where, float casts, sum/mean/max/min (ties share the gradient, as torch.amax)
and so softmax/log_softmax/logsumexp, mf.take with an index per row (cross-entropy's target
logit: a one-hot where, `_take_grad`), other mf.take (a scatter-add kernel: embeddings),
mf.scatter_add (a gather of dy), cumsum, logcumsumexp and cumprod (reverse scans): `adjoints`, which
also names the scans, scatters and gathers a backward kernel takes from an earlier one's
buffer (`adjoints.apart`). No gradient flows through comparisons, integer or bool
values, argmax/argmin, mf.index/mf.size, runtime scalars and Consts. `prod`, `cummax` and
`cummin` have no derivative here: `NotDifferentiable`.
Attention (a softmax over one axis of contractions over another) has backward kernels of its
own, FlashAttention-2 style: `adjoints_attention` (`_attention`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional

import torch

from . import adjoints, adjoints_attention
from .dtypes import BOOL, F32, I64, DType
from .errors import MetalforgeError, at, kernel_at
from .graph import (
    BinaryOp,
    Graph,
    Node,
    Op,
    Output,
    ReduceOp,
    ScalarParam,
    TensorParam,
    UnaryOp,
    literal_index,
    topo_order,
)
from .once import OnceMap
from .shapes import bind_shapes, output_shape


class NotDifferentiable(MetalforgeError, TypeError):
    """Gradients were requested through a kernel (or an op in it) that has no derivative."""


def _where(graph: Graph) -> str:
    return kernel_at(graph.name, graph.loc)


def _at(n: Node) -> str:
    return at(n.loc)


# --------------------------------------------------------------------------- node building

class _Nodes:
    """Builds F32 gradient nodes; axes are kept in the forward graph's canonical order."""

    def __init__(self, order: Mapping[str, int]):
        self.order = order

    def axes(self, *nodes: Node) -> tuple[str, ...]:
        s = {a for n in nodes for a in n.axes}
        return tuple(sorted(s, key=self.order.__getitem__))

    def const(self, v: float) -> Node:
        return Node(Op.CONST, (), F32, (), attr=float(v), weak=True)

    def f32(self, n: Node) -> Node:
        return n if n.dtype is F32 else Node(Op.CAST, (n,), F32, n.axes)

    def bin(self, op: BinaryOp, a: Node, b: Node) -> Node:
        a, b = self.f32(a), self.f32(b)
        return Node(Op.BINARY, (a, b), F32, self.axes(a, b), attr=op, weak=a.weak and b.weak)

    def add(self, a: Node, b: Node) -> Node:
        return self.bin(BinaryOp.ADD, a, b)

    def mul(self, a: Node, b: Node) -> Node:
        return self.bin(BinaryOp.MUL, a, b)

    def div(self, a: Node, b: Node) -> Node:
        return self.bin(BinaryOp.DIV, a, b)

    def scale(self, a: Node, c: float) -> Node:
        return self.mul(a, self.const(c))

    def neg(self, a: Node) -> Node:
        a = self.f32(a)
        return Node(Op.UNARY, (a,), F32, a.axes, attr=UnaryOp.NEG)

    def unary(self, op: UnaryOp, a: Node) -> Node:
        a = self.f32(a)
        return Node(Op.UNARY, (a,), F32, a.axes, attr=op)

    def cmp(self, op: BinaryOp, a: Node, b: Node) -> Node:
        return Node(Op.BINARY, (a, b), BOOL, self.axes(a, b), attr=op)

    def where(self, c: Node, a: Node, b: Node) -> Node:
        a, b = self.f32(a), self.f32(b)
        return Node(Op.WHERE, (c, a, b), F32, self.axes(c, a, b))

    def zero_unless(self, c: Node, a: Node) -> Node:
        return self.where(c, a, self.const(0.0))

    def sum(self, a: Node, axis: str) -> Node:
        return Node(Op.REDUCE, (self.f32(a),), F32, tuple(x for x in a.axes if x != axis),
                    attr=(ReduceOp.SUM, axis))

    def expand(self, a: Node, axes: tuple[str, ...]) -> Node:
        """`a` broadcast to `axes` (a value with axes (R,) written as [R, D] needs the D axis:
        where(index(D) >= 0, a, 0) adds it without reading memory)."""
        for ax in axes:
            if ax not in a.axes:
                idx = Node(Op.INDEX, (), I64, (ax,), attr=ax)
                ok = self.cmp(BinaryOp.GE, idx, Node(Op.CONST, (), I64, (), attr=0, weak=True))
                a = self.zero_unless(ok, a)
        return a


# --------------------------------------------------------------------------- the adjoint

def _live(graph: Graph, wrt: set[str]) -> set[Node]:
    """The float nodes whose value depends on a tensor in `wrt` (where gradients flow)."""
    live: set[Node] = set()
    for n in graph.nodes():
        if not n.dtype.is_float:
            continue
        reads = (n.op == Op.LOAD and n.attr in wrt) or (n.op == Op.TAKE and n.attr[0] in wrt)
        if reads or any(a in live for a in n.args):
            live.add(n)
    return live


def _picked(graph: Graph, n: Node) -> bool:
    """Whether `n` reads a constant element of a literal dim (`w[:, j]`): a read of the
    tensor, whose gradient goes to that element (no scatter needed)."""
    return n.op == Op.TAKE and literal_index(graph, n) is not None


def _picked_grad(b: _Nodes, graph: Graph, n: Node, g: Node) -> Node:
    """The gradient `w[:, j]` with output gradient g sends to w: g at position j of the
    literal axis, 0 elsewhere, summed over the axes w does not have."""
    axis, j = n.attr[1], literal_index(graph, n)
    idx = Node(Op.INDEX, (), I64, (axis,), attr=axis)
    c = b.zero_unless(b.cmp(BinaryOp.EQ, idx, Node(Op.CONST, (), I64, (), attr=j, weak=True)), g)
    for ax in [x for x in c.axes if x not in graph.tensor(n.attr[0]).axes]:
        c = b.sum(c, ax)
    return c


def _contributions(b: _Nodes, n: Node, g: Node) -> list[tuple[int, Node]]:
    """(argument position, gradient contribution) of node n whose output gradient is g."""
    if n.op == Op.CAST:
        return [(0, g)] if n.args[0].dtype.is_float else []
    if n.op == Op.WHERE:
        c = n.args[0]
        return [(1, b.zero_unless(c, g)), (2, b.where(c, b.const(0.0), g))]
    if n.op == Op.UNARY:
        r = _unary_grad(b, n, g)
        return [(0, r)] if r is not None else []
    if n.op == Op.BINARY:
        return _binary_grad(b, n, g)
    if n.op == Op.REDUCE:
        return _reduce_grad(b, n, g)
    if n.op == Op.SCAN:                     # a scan the other way (`adjoints.scan_grad`)
        why = adjoints.scan_refusal(n)
        if why is not None:
            raise NotDifferentiable(why)
        return [(0, adjoints.scan_grad(b, n, g))]
    if n.op == Op.SCATTER:                  # the gather of dy (`adjoints.take_of`)
        return [(0, adjoints.take_of(n, g))]
    return []


def _unary_grad(b: _Nodes, n: Node, g: Node) -> Optional[Node]:
    """d(f(a))/da * g for the unary function n = f(a); None where it is zero (floor, ceil)."""
    a = n.args[0]
    rules: dict[UnaryOp, Callable[[], Optional[Node]]] = {
        UnaryOp.NEG: lambda: b.neg(g),
        UnaryOp.EXP: lambda: b.mul(g, n),
        UnaryOp.EXP2: lambda: b.mul(g, b.scale(n, math.log(2.0))),
        UnaryOp.LOG: lambda: b.div(g, a),
        UnaryOp.LOG2: lambda: b.div(g, b.scale(a, math.log(2.0))),
        UnaryOp.SQRT: lambda: b.div(b.scale(g, 0.5), n),
        UnaryOp.RSQRT: lambda: b.mul(b.scale(g, -0.5), b.mul(n, b.mul(n, n))),
        UnaryOp.SIN: lambda: b.mul(g, b.unary(UnaryOp.COS, a)),
        UnaryOp.COS: lambda: b.neg(b.mul(g, b.unary(UnaryOp.SIN, a))),
        UnaryOp.TANH: lambda: b.mul(g, b.bin(BinaryOp.SUB, b.const(1.0), b.mul(n, n))),
        UnaryOp.SIGMOID: lambda: b.mul(g, b.mul(n, b.bin(BinaryOp.SUB, b.const(1.0), n))),
        UnaryOp.ERF: lambda: b.mul(g, b.scale(b.unary(UnaryOp.EXP, b.neg(b.mul(a, a))),
                                        2.0 / math.sqrt(math.pi))),
        UnaryOp.ABS: lambda: b.where(b.cmp(BinaryOp.GT, a, b.const(0.0)), g,
                               b.zero_unless(b.cmp(BinaryOp.LT, a, b.const(0.0)), b.neg(g))),
        UnaryOp.FLOOR: lambda: None, UnaryOp.CEIL: lambda: None,
    }
    return rules[n.attr]() if n.attr in rules else None


def _binary_grad(b: _Nodes, n: Node, g: Node) -> list[tuple[int, Node]]:
    f, (x, y) = n.attr, n.args
    if f == BinaryOp.ADD:
        return [(0, g), (1, g)]
    if f == BinaryOp.SUB:
        return [(0, g), (1, b.neg(g))]
    if f == BinaryOp.MUL:
        return [(0, b.mul(g, y)), (1, b.mul(g, x))]
    if f == BinaryOp.DIV:
        return [(0, b.div(g, y)), (1, b.neg(b.div(b.mul(g, n), y)))]
    if f == BinaryOp.POW:
        if y.op == Op.CONST:
            e = float(y.attr)
            if not e:
                return []
            return [(0, b.mul(g, b.scale(b.bin(BinaryOp.POW, x, b.const(e - 1.0)), e)))]
        ey = b.f32(y)
        p = b.bin(BinaryOp.POW, x, b.bin(BinaryOp.SUB, ey, b.const(1.0)))
        return [(0, b.mul(g, b.mul(ey, p))), (1, b.mul(b.mul(g, n), b.unary(UnaryOp.LOG, x)))]
    if f in (BinaryOp.MAXIMUM, BinaryOp.MINIMUM):
        wins = b.cmp(BinaryOp.GT if f == BinaryOp.MAXIMUM else BinaryOp.LT, x, y)
        tie = b.cmp(BinaryOp.EQ, x, y)
        half = b.scale(g, 0.5)
        return [(0, b.where(wins, g, b.zero_unless(tie, half))),
                (1, b.where(wins, b.const(0.0), b.where(tie, half, g)))]
    if f == BinaryOp.MOD:          # torch.remainder: d/da = 1, d/db = -floor(a / b)
        return [(0, g), (1, b.neg(b.mul(g, b.unary(UnaryOp.FLOOR, b.div(x, y)))))]
    return []                               # floordiv: zero; comparisons, bit ops: none


def _reduce_grad(b: _Nodes, n: Node, g: Node) -> list[tuple[int, Node]]:
    (kind, axis), a = n.attr, n.args[0]
    if kind == ReduceOp.SUM:
        return [(0, g)]
    if kind in (ReduceOp.MAX, ReduceOp.MIN):              # ties share the gradient (torch.amax)
        hit = b.cmp(BinaryOp.EQ, a, n)
        count = b.sum(b.where(hit, b.const(1.0), b.const(0.0)), axis)
        return [(0, b.zero_unless(hit, b.div(g, count)))]
    if kind == ReduceOp.PROD:
        raise NotDifferentiable(f"mf.prod(..., axis={axis!r}){_at(n)} has no derivative "
                                "in metalforge (its gradient at zeros needs the product of "
                                "the other elements)")
    return []                               # argmax, argmin: integer results


def _adjoint(graph: Graph, wrt: set[str], dys: dict[Node, Node], b: _Nodes,
             deterministic: bool = False) -> dict[str, Node]:
    """{input name: gradient node} for the inputs in `wrt` that get any gradient (a gather's
    a one-hot where, or a scatter-add, `deterministic` or atomic)."""
    live = _live(graph, wrt)
    grads: dict[Node, Node] = dict(dys)
    loads: dict[str, Node] = {}
    gathered: dict[str, Node] = {}        # the gradients reaching a tensor through mf.take
    picked: dict[str, Node] = {}                    # gradients through w[:, j] reads
    for n in reversed(list(graph.nodes())):
        if n.op == Op.LOAD and n.attr in wrt:
            loads[n.attr] = n
        g = grads.get(n)
        if g is not None and n in live and _picked(graph, n):
            c = _picked_grad(b, graph, n, g)
            prev = picked.get(n.attr[0])
            picked[n.attr[0]] = c if prev is None else b.add(prev, c)
        if g is None or n not in live or n.op == Op.LOAD or _picked(graph, n):
            continue
        if n.op == Op.TAKE:
            name = n.attr[0]
            c = _take_grad(b, n, g) if _one_hot_take(graph, n) else \
                adjoints.scatter_of(graph, n, g, deterministic)
            gathered[name] = c if name not in gathered else b.add(gathered[name], c)
            continue
        lse_x = adjoints.logsumexp_arg(n)   # one rule for the whole of mf.logsumexp
        pairs = [(lse_x, adjoints.logsumexp_grad(b, n, lse_x, g))] if lse_x is not None \
            else [(n.args[i], c) for i, c in _contributions(b, n, g)]
        for a, c in pairs:
            if a not in live:
                continue
            for ax in [x for x in c.axes if x not in a.axes]:   # broadcast in n: sum it out
                c = b.sum(c, ax)
            prev = grads.get(a)
            grads[a] = c if prev is None else b.add(prev, c)
    out = {name: grads[ld] for name, ld in loads.items() if ld in grads}
    for name, c in gathered.items():
        out[name] = c if name not in out else b.add(out[name], c)
    for name, c in picked.items():
        out[name] = c if name not in out else b.add(out[name], c)
    return out


def _take_grad(b: _Nodes, n: Node, g: Node) -> Node:
    """The gradient a gather `n` = mf.take(x, axis, i) sends to x, where i has only axes x
    keeps (one index per row: cross-entropy's target logit): each element of x at position
    i of its row along `axis` gets its row's g, the others 0, as a one-hot where
    (d/dx[r, v] = (v == i[r]) * g[r]); no scatter, as each row's index selects within the
    row's own elements. (`_check_wrt` refuses other gathers.)"""
    axis = n.attr[1]
    pos = Node(Op.INDEX, (), I64, (axis,), attr=axis)
    return b.zero_unless(b.cmp(BinaryOp.EQ, pos, n.args[0]), g)


def _one_hot_take(graph: Graph, n: Node) -> bool:
    """Whether gather `n`'s gradient is a one-hot where (`_take_grad`): its index has only
    axes its tensor keeps, so the gradient lands in the elements of the rows it reads."""
    t = graph.tensor(n.attr[0])
    return set(n.args[0].axes) <= set(t.axes) - {n.attr[1]}


# --------------------------------------------------------------------------- splitting

def _rebuild(roots: list[Node], swap: Mapping[Node, Node]) -> list[Node]:
    """`roots` with every node in `swap` replaced (the nodes above them are copied)."""
    new: dict[Node, Node] = {}
    for n in topo_order(roots, seen=()):
        if n in swap:
            new[n] = swap[n]
        elif any(a in new and new[a] is not a for a in n.args):
            new[n] = Node(n.op, tuple(new.get(a, a) for a in n.args), n.dtype, n.axes,
                              attr=n.attr, weak=n.weak, loc=n.loc)
        else:
            new[n] = n
    return [new[r] for r in roots]


def _reduce_axis(root: Node) -> tuple[Optional[str], list[Node]]:
    """(the axis this root's kernel reduces, the reductions over other axes it must read from
    an earlier kernel). The axis is that of the reductions nearest the root."""
    top: list[Node] = []
    seen: set[Node] = set()
    stack = [root]
    while stack:                                    # reductions not below another reduction
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == Op.REDUCE:
            top.append(n)
        else:
            stack.extend(n.args)
    if not top:
        return None, []
    axis = top[0].attr[1]
    other: list[Node] = []
    seen = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == Op.REDUCE and n.attr[1] != axis:
            other.append(n)
            continue
        stack.extend(n.args)
    return axis, other


@dataclass
class _Target:
    name: str               # output buffer name
    node: Node
    axes: tuple[str, ...]   # storage order
    dtype: DType
    axis: Optional[str] = None
    needs: tuple[str, ...] = ()     # buffers of earlier kernels it reads
    group: Optional[tuple] = None   # a scatter's or scan's kernel (`adjoints.group_key`)


@dataclass(frozen=True)
class Backward:
    """The backward of one forward graph with respect to `wrt`."""
    graph: Graph                        # the forward graph
    wrt: tuple[str, ...]                # inputs whose gradients are computed
    dy: tuple[Optional[str], ...]       # per forward output: its gradient's parameter name
    kernels: tuple[Graph, ...]          # in launch order
    grads: dict                         # input name -> (kernel index, output index); absent:
                                        # the gradient is zero (no path to any output)
    buffers: dict                       # intermediate buffer -> (kernel index, output index)
    saved: tuple = ()                   # (buffer name, forward node): row values the forward
                                        # writes (`runtime.saving.forward_saving`) and the
                                        # backward loads
    # kernels[0] computes the forward's outputs (first) and buffers of the backward (after:
    # attention's logsumexp): a call that needs gradients may run it as its forward and hand
    # its results to `run_backward` (`saved`), which then does not run it again
    forward: bool = False

    @property
    def reads(self) -> tuple[str, ...]:
        """The forward inputs the backward kernels read (besides the output gradients and
        their own buffers): nothing computed by the forward is saved."""
        used = {n for k in self.kernels for n in loaded(k)}
        return tuple(t.name for t in self.graph.tensors if t.name in used)


def loaded(graph: Graph) -> list[str]:
    """The tensors a kernel reads (a backward kernel may take one only for an axis size)."""
    names = {n.attr for n in graph.nodes() if n.op == Op.LOAD}
    return [t.name for t in graph.tensors if t.name in names]


def _fresh(name: str, taken: set[str]) -> str:
    """`name`, or name_2, name_3, ... : the first not in `taken` (which it joins)."""
    out, i = name, 1
    while out in taken:
        i += 1
        out = f"{name}_{i}"
    taken.add(out)
    return out


def derive(graph: Graph, wrt: Optional[tuple[str, ...]] = None,
           deterministic: bool = False, saved: bool = False) -> Backward:
    """The backward kernels of `graph` with respect to the float tensor inputs `wrt` (all of
    them when None); gathers' gradients scatter `deterministic`ally (sorted, no atomics) or
    with atomic adds. Raises NotDifferentiable when no output is a float value, when a
    requested input is not a float tensor, or through an op with no derivative."""
    if adjoints_attention.match(graph) is not None:    # FlashAttention-2 style kernels
        return _attention(graph, wrt)
    wrt = _check_wrt(graph, wrt, deterministic)
    b = _Nodes(_axis_order(graph))
    taken = {p.name for p in graph.params}
    dy_names, dy_params, dys = _output_gradients(graph, b, taken)
    grads = _adjoint(graph, set(wrt), dys, b, deterministic)
    kept: tuple[tuple[str, Node], ...] = ()
    if saved:                  # the forward's logsumexps loaded, not recomputed
        grads, kept = _use_saved(graph, grads, taken, dy_params)
    targets = [_target(graph, name, grads[name], b) for name in wrt if name in grads]
    done = _split_by_axis(graph, targets, b, taken)
    kernels = _group(graph, done, b)
    bw = _assemble(graph, wrt, tuple(dy_names), dy_params, kernels, done)
    return replace(bw, saved=kept) if kept else bw


def _use_saved(graph: Graph, grads: dict[str, Node], taken: set[str],
               params: list[TensorParam]) -> tuple[dict[str, Node], tuple[tuple[str, Node], ...]]:
    """The gradients with every mf.logsumexp row value of the forward they use
    (`adjoints.logsumexp_arg`) replaced by the load of an f32 buffer the forward writes
    (`runtime.saving.forward_saving`), its parameter added to `params`: (gradients, (buffer,
    node) pairs)."""
    used = topo_order(list(grads.values()), seen=())
    lses = [(n, x) for n in used for x in [adjoints.logsumexp_arg(n)] if x is not None]
    kept = tuple((_fresh("lse_" + "_".join(a for a in x.axes if a not in n.axes), taken), n)
                 for n, x in lses)
    if not kept:
        return grads, ()
    swap = {n: Node(Op.LOAD, (), F32, n.axes, attr=name) for name, n in kept}
    for name, n in kept:
        dims = tuple(graph.axis_spec(a) for a in n.axes)
        params.append(TensorParam(name, F32, None, dims, f"f32[{', '.join(n.axes)}]"))
    names = list(grads)
    new = _rebuild([grads[k] for k in names], swap)
    return dict(zip(names, new)), kept


def _attention(graph: Graph, wrt: Optional[tuple[str, ...]]) -> Backward:
    """The backward of an attention kernel (`adjoints_attention`: the forward again with the
    rows' logsumexp, delta = rowsum(dO * O), a kernel over query rows for dq, one over keys
    for dk and dv)."""
    floats = tuple(t.name for t in graph.tensors if t.dtype.is_float)
    wrt = floats if wrt is None else tuple(wrt)
    bad = [n for n in wrt if n not in floats]
    why = adjoints_attention.refusal(graph, wrt) if not bad else \
        f"argument '{bad[0]}' is not a floating-point tensor argument, so it has no gradient"
    if why is not None:
        raise NotDifferentiable(f"{_where(graph)}: {why}")
    b = _Nodes(_axis_order(graph))
    taken = {p.name for p in graph.params}
    dy_names, dy_params, dys = _output_gradients(graph, b, taken)
    names = (_fresh("out", taken), _fresh("lse", taken), _fresh("delta", taken))
    d = adjoints_attention.derive(graph, wrt, b, _contributions, dys[graph.outputs[0].node],
                                  tuple(dy_params), names)
    return Backward(graph, wrt, tuple(dy_names), d.kernels, d.grads, d.buffers, forward=True)


def _check_wrt(graph: Graph, wrt: Optional[tuple[str, ...]], deterministic: bool = False
               ) -> tuple[str, ...]:
    """The inputs to differentiate for: float tensors only, and some float output."""
    where = _where(graph)
    floats = tuple(t.name for t in graph.tensors if t.dtype.is_float)
    wrt = floats if wrt is None else tuple(wrt)
    for name in wrt:
        if name not in floats:
            raise NotDifferentiable(f"{where}: argument '{name}' is not a floating-point tensor "
                                    "argument, so it has no gradient")
    if len({r.attr[1] for r in graph.reductions()}) > 1:
        raise NotDifferentiable(f"{where}: it reduces several axes (attention: a softmax over "
                                "one axis of contractions over another); metalforge derives no "
                                "backward for that yet; detach the inputs")
    for name in wrt:
        why = adjoints.packed_refusal(graph, name)       # a quantized weight's scales, biases
        if why is not None:
            raise NotDifferentiable(f"{where}: {why}")
    bases = {a for n in graph.nodes() for a in n.axes}
    for name in wrt:
        spec = next((d for d in graph.tensor(name).dims if d.derived and d.base in bases), None)
        if spec is not None:
            raise NotDifferentiable(f"{where}: argument '{name}' is read along '{spec.name}' "
                                    f"against '{spec.base}' (one value per group); its gradient "
                                    "is a per-group sum, which metalforge does not derive yet; "
                                    "detach that input")
    for n in graph.nodes():
        why = None
        if n.op == Op.TAKE and n.attr[0] in wrt and not _one_hot_take(graph, n) \
                and not _picked(graph, n):
            why = adjoints.scatter_refusal(graph, n, deterministic)
        if why is not None:
            raise NotDifferentiable(f"{where}: mf.take from '{n.attr[0]}'{_at(n)} has no "
                                    f"derivative in metalforge: {why}; detach that input")
    if not any(o.dtype.is_float for o in graph.outputs):
        kinds = ", ".join(sorted({str(o.dtype) for o in graph.outputs}))
        raise NotDifferentiable(f"{where}: its outputs are {kinds} values (integer or bool, "
                                "e.g. from mf.argmax or a comparison), which have no "
                                "derivative; detach the inputs (x.detach()) to call it")
    return wrt


def _axis_order(graph: Graph) -> dict[str, int]:
    """Axes in the canonical order: the parameters' first, then the nodes'."""
    order: dict[str, int] = {}
    for t in graph.tensors:
        for a in t.axes:
            order.setdefault(a, len(order))
    for n in graph.nodes():
        for a in n.axes:
            order.setdefault(a, len(order))
    return order


def _output_gradients(graph: Graph, b: _Nodes, taken: set[str]
                      ) -> tuple[list[Optional[str]], list[TensorParam], dict[Node, Node]]:
    """One incoming-gradient parameter `dy` per float output: (its name per output, None for
    the others; the parameters; the gradient flowing into each output node, by node)."""
    dy_names: list[Optional[str]] = []
    dy_params: list[TensorParam] = []
    dys: dict[Node, Node] = {}
    for i, o in enumerate(graph.outputs):
        if not o.dtype.is_float:
            dy_names.append(None)
            continue
        name = _fresh("dy" if len(graph.outputs) == 1 else f"dy{i}", taken)
        dims = tuple(graph.axis_spec(a) for a in o.axes)
        var = next((v for v, d in graph.dtype_vars.items() if d is o.dtype), None)
        dy_params.append(TensorParam(name, o.dtype, var, dims,
                                     f"{var or o.dtype}[{', '.join(o.axes)}]"))
        dy_names.append(name)
        ld = b.f32(Node(Op.LOAD, (), o.dtype, b.axes(o.node), attr=name))
        prev = dys.get(o.node)
        dys[o.node] = ld if prev is None else b.add(prev, ld)
    return dy_names, dy_params, dys


def _target(graph: Graph, name: str, grad: Node, b: _Nodes) -> _Target:
    """The gradient of input `name`, expanded to its axes and cast to its dtype."""
    p = graph.tensor(name)
    if grad.op == Op.SCATTER and set(grad.axes) == set(p.axes):   # the scatter writes dx
        g = Node(Op.SCATTER, grad.args, p.dtype, grad.axes, attr=grad.attr, loc=grad.loc)
        return _Target(name, g, p.axes, p.dtype)
    g = b.expand(grad, b.axes(*[Node(Op.LOAD, (), p.dtype, p.axes)]))
    if p.dtype is not F32:
        g = Node(Op.CAST, (g,), p.dtype, g.axes)
    return _Target(name, g, p.axes, p.dtype)


def _split_by_axis(graph: Graph, targets: list[_Target], b: _Nodes, taken: set[str]
                   ) -> list[_Target]:
    """Each target reduces one axis: a reduction over another axis it needs becomes a target
    of its own, written to a small f32 buffer that the first one loads."""
    buffers: dict[Node, tuple[str, Node]] = {}      # reduction node -> (buffer, its load)
    todo = list(targets)
    done: list[_Target] = []
    while todo:
        t = todo.pop(0)
        kept = adjoints.apart(graph, t.node)     # what its kernel cannot compute: buffers
        if kept:
            loads = {r: _buffer(r, buffers, todo, b, taken) for r in kept}
            t.node = _rebuild([t.node], loads)[0]
        t.group = adjoints.group_key(t.node, t.name)
        axis, other = _reduce_axis(t.node)
        if t.group is not None:
            axis, other = None, []
        swap: dict[Node, Node] = {}
        for r in other:
            if r not in buffers:
                bname = _fresh(adjoints.buffer_name(r), taken)
                dt = F32 if r.dtype.is_float else r.dtype
                buffers[r] = (bname, Node(Op.LOAD, (), dt, r.axes, attr=bname))
                todo.append(_Target(bname, r if dt is r.dtype else b.f32(r),
                                    tuple(r.axes), dt))
            swap[r] = buffers[r][1]
        if swap:
            t.node = _rebuild([t.node], swap)[0]
        t.axis = axis
        t.needs = tuple(buffers[r][0] for r in other) + tuple(buffers[r][0] for r in kept)
        done.append(t)
    return done


def _buffer(r: Node, buffers: dict, todo: list, b: _Nodes, taken: set[str]) -> Node:
    """The load of the f32 buffer an earlier kernel writes node r to (a new target of
    `_split_by_axis` the first time)."""
    if r not in buffers:
        bname = _fresh(adjoints.buffer_name(r), taken)
        buffers[r] = (bname, Node(Op.LOAD, (), F32, r.axes, attr=bname))
        node = r if r.dtype is F32 else b.f32(r)
        todo.append(_Target(bname, node, tuple(r.axes), F32))
    load: Node = buffers[r][1]
    return load


def _group(graph: Graph, targets: list[_Target], b: _Nodes) -> list[list[_Target]]:
    """Targets in kernels: one kernel per (reduced axis, kept axes); an elementwise target joins
    a row-reduction kernel over its axes; kernels ordered so buffers are written first."""
    groups: dict[tuple, list[_Target]] = {}
    depth = _depths(targets)
    for t in targets:
        if t.group is not None:         # a scan kernel never reads a buffer of its own group
            groups.setdefault(t.group + (depth[t.name],), []).append(t)
        elif t.axis is not None:
            key = (t.axis, frozenset(t.node.axes) - {t.axis})
            groups.setdefault(key, []).append(t)
    for t in targets:
        if t.axis is None and t.group is None:
            key = (t.axes[-1], frozenset(t.axes[:-1])) if t.axes else None
            if key not in groups:
                key = (None, frozenset(t.axes))
            groups.setdefault(key, []).append(t)
    kernels = list(groups.values())
    made_by = {t.name: i for i, k in enumerate(kernels) for t in k}
    ordered: list[list[_Target]] = []
    state: dict[int, int] = {}

    def visit(i: int) -> None:
        if state.get(i) == 2:
            return
        if state.get(i) == 1:
            raise NotDifferentiable(f"{_where(graph)}: its backward needs reductions that "
                                    "depend on each other across axes; this is not supported")
        state[i] = 1
        for t in kernels[i]:
            for need in t.needs:
                visit(made_by[need])
        state[i] = 2
        ordered.append(kernels[i])
    for i in range(len(kernels)):
        visit(i)
    return ordered


def _depths(targets: list[_Target]) -> dict[str, int]:
    """Each target's depth: 0 for one that reads no buffer, else one more than the deepest
    target whose buffer it reads (targets of one depth never read each other's)."""
    by_name = {t.name: t for t in targets}
    depth: dict[str, int] = {}

    def of(name: str) -> int:
        if name not in depth:
            depth[name] = 1 + max((of(n) for n in by_name[name].needs), default=-1)
        return depth[name]
    for t in targets:
        of(t.name)
    return depth


def _assemble(graph: Graph, wrt, dy_names, dy_params, kernels, targets) -> Backward:
    out_kernels: list[Graph] = []
    grads: dict[str, tuple[int, int]] = {}
    bufs: dict[str, tuple[int, int]] = {}
    buffer_params: dict[str, TensorParam] = {}
    wrt_set = set(wrt)
    for ki, k in enumerate(kernels):
        for oi, t in enumerate(k):
            if t.name in wrt_set:
                grads[t.name] = (ki, oi)
            else:
                bufs[t.name] = (ki, oi)
                dims = tuple(graph.axis_spec(a) for a in t.axes)
                buffer_params[t.name] = TensorParam(t.name, t.dtype, None, dims,
                                                    f"{t.dtype}[{', '.join(t.axes)}]")
    extra = {p.name: p for p in dy_params} | buffer_params
    n = len(kernels)
    for ki, k in enumerate(kernels):
        nodes = topo_order([t.node for t in k])
        used = {x.attr for x in nodes if x.op in (Op.LOAD, Op.SCALAR)}
        used |= {x.attr[0] for x in nodes if x.op == Op.TAKE}     # gathered (w[:, j]) too
        params = [p for p in graph.params
                  if p.name in used or not isinstance(p, (TensorParam, ScalarParam))]
        params += [p for name, p in extra.items() if name in used]
        for ax in {a for t in k for a in t.axes}:   # sizes come from tensors: keep one per axis
            if not any(ax in p.axes for p in params if isinstance(p, TensorParam)):
                params.append(next(t for t in graph.tensors if ax in t.axes))
        name = f"{graph.name}_backward" + (f"{ki + 1}" if n > 1 else "")
        out_kernels.append(Graph(name, tuple(params),
                                 tuple(Output(t.node, t.axes, t.dtype) for t in k),
                                 consts=dict(graph.consts), dtype_vars=dict(graph.dtype_vars),
                                 loc=graph.loc))
    return Backward(graph, tuple(wrt), dy_names, tuple(out_kernels), grads, bufs)


# --------------------------------------------------------------------------- running

_cache: OnceMap[tuple, Backward] = OnceMap()


def backward_of(graph: Graph, wrt: Optional[tuple[str, ...]] = None,
                deterministic: Optional[bool] = None, saved: bool = False) -> Backward:
    """`derive`, cached per (forward graph, wrt, deterministic), once (threads asking meanwhile
    wait): the backward graphs keep their identity, so their compiled kernels are reused.
    deterministic None: as torch.are_deterministic_algorithms_enabled() says at the call
    (`torch.use_deterministic_algorithms(True)` makes gathers' gradients sorted scatters,
    bit-identical across runs, as it makes torch's embedding backward). saved: the backward
    loads the forward's logsumexps from buffers (`bw.saved`) that
    `runtime.saving.forward_saving` writes, instead of recomputing them (`runtime.saving`
    picks whichever moves fewer bytes)."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    key = (id(graph), None if wrt is None else tuple(wrt), deterministic) + \
        (("saved",) if saved else ())
    return _cache.get_or_build(key, lambda: derive(graph, wrt, deterministic, saved),
                               lambda bw: bw.graph is graph)


def run_backward(bw: Backward, values: Mapping[str, Any], dys: Any,
                 run: Callable[[Graph, Mapping[str, Any]], Any],
                 saved: Optional[tuple] = None) -> dict[str, torch.Tensor]:
    """The gradients {input: tensor} for `wrt` given the forward values (tensors and runtime
    scalars by name) and the output gradients `dys` (one per forward output; None or an
    integer output's entry is ignored). Inputs with no path to a float output get zeros.
    run(graph, values) runs each backward kernel (the runtime, or `reference.evaluate`).
    saved: the results of kernels[0] where `bw.forward` and the forward call ran it."""
    env: dict[str, Any] = dict(values)
    for name, dy, o in zip(bw.dy, dys, bw.graph.outputs):
        if name is None:
            continue
        if dy is None:
            ref = next(v for v in values.values() if isinstance(v, torch.Tensor))
            dy = torch.zeros(_out_shape(bw.graph, o, values), dtype=o.dtype.torch,
                             device=ref.device)
        env[name] = dy.to(o.dtype.torch).contiguous()
    # a '*B' batch of zero leading dims gets one of size 1, so that the per-row buffers
    # between kernels are never 0-dim tensors (those come back unwritten from the runtime)
    for k in bw.kernels:
        for p in k.tensors:
            v = env.get(p.name)
            if p.dims and p.dims[0].batch and isinstance(v, torch.Tensor) \
                    and v.dim() == len(p.dims) - 1:
                env[p.name] = v.unsqueeze(0)
    results: list[tuple] = []
    for ki, k in enumerate(bw.kernels):
        if ki == 0 and saved is not None and bw.forward:     # the forward call's results
            r: Any = tuple(saved)
        else:
            r = run(k, {p.name: env[p.name] for p in k.params if p.name in env})
        r = r if isinstance(r, tuple) else (r,)
        results.append(r)
        for o_name, (ki, oi) in bw.buffers.items():
            if ki == len(results) - 1:
                env[o_name] = r[oi]
    out = {}
    for name in bw.wrt:
        if name in bw.grads:
            ki, oi = bw.grads[name]
            out[name] = results[ki][oi].reshape(values[name].shape)
        else:
            out[name] = torch.zeros_like(values[name])
    return out


def _out_shape(graph: Graph, o: Output, values: Mapping[str, Any]):
    tensors = {t.name: values[t.name] for t in graph.tensors}
    return output_shape(bind_shapes(graph, tensors), o)
