"""The backward of an attention kernel (FlashAttention-2 style): the backward graphs
`autodiff.derive` returns for a graph the attention schedule recognises
(`schedule.attention.match`).

    s = f(c),  c = sum_E q k           the scores (f: scale, masks, soft cap, biases)
    lse = max_L s + log sum_L exp(s - max_L s)
    P = exp(s - lse),  dP = sum_E dO v,  delta = rowsum(dO * O) = sum_L P dP
    dc = f'(c) * P (dP - delta)        f' by autodiff's own rules (a masked score: 0)
    dq = sum_L dc k      dk = sum_{R,S} dc q      dv = sum_{R,S} P dO

Kernels, in launch order (`derive`):
1. the forward again with the rows' logsumexp as a second output (the attention family's own
   kernels write it from their final state: `schedule.attention.lse`);
2. delta = rowsum(dO * O): a row reduction;
3. over query rows, dq; 4. over keys, dk and dv, summed over every query row reading the key
   (GQA's query heads R of a kv head, the positions S) in a fixed order: deterministic.
3 and 4 are registered with their `Roles` so that the `attention_grad` family schedules them.
No S x L matrix is stored: each kernel recomputes its scores pair by pair. The graphs are the
math itself, so `reference.evaluate` runs them too (the float64 reference path).

Refused (`why_not`, `refusal`): several score contractions, a contraction other than q * k,
values or keys read through a gather (paged reads: their gradient is a scatter into the page
pool), work after the sum with the values, gradients of tensors other than q, k and v.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .dtypes import F32
from .graph import (
    BinaryOp,
    Graph,
    Node,
    Op,
    Output,
    TensorParam,
    UnaryOp,
    strip_casts,
    topo_order,
)
from .schedule.attention import Form, match
from .schedule.attention_grad import Roles, register

# autodiff's rules: (builder, node, output gradient) -> [(argument position, contribution)]
Contributions = Callable[[object, Node, Node], list[tuple[int, Node]]]


@dataclass(frozen=True)
class Pieces:
    """The attention graph's parts the backward reads."""
    form: Form
    c: Node                     # the one contraction over E
    q: Node                     # its load without the key axis
    k: Node                     # its load with the key axis
    v: Node                     # the values' load
    rows: tuple[str, ...]       # the output's axes but E
    tile: tuple[str, ...]       # the rows' axes k does not have (R, S)


def _load(n: Node) -> Optional[Node]:
    n = strip_casts(n)
    return n if n.op == Op.LOAD else None


def why_not(graph: Graph) -> Optional[str]:
    """Why metalforge derives no backward for this attention graph, None when it does."""
    form = match(graph)
    if form is None:
        return "it is not an attention kernel (a softmax over one axis of contractions over " \
               "another)"
    if len(graph.outputs) != 1 or strip_casts(graph.outputs[0].node) is not form.out:
        return "its output is not the attention sum itself (work after the sum with the " \
               "values, or several outputs)"
    if any(n.op == Op.TAKE for n in topo_order([graph.outputs[0].node])):
        return "it reads through mf.take (paged K/V reads: their gradient is a scatter into " \
               "the page pool, which the attention backward does not write yet)"
    if len(form.contractions) != 1:
        return "its scores have several contractions over E"
    prod = strip_casts(form.contractions[0].args[0])
    loads = [_load(a) for a in prod.args] if prod.op == Op.BINARY else []
    if prod.attr is not BinaryOp.MUL or len(loads) != 2 or None in loads:
        return "its score contraction is not sum(q * k) of two tensors"
    v = _load(form.values)
    if v is None:
        return "its values are not a tensor read (elementwise work on V)"
    k = [x for x in loads if x is not None and form.key in x.axes]
    if len(k) != 1:
        return "its score contraction does not multiply one key tensor by one query tensor"
    if set(v.axes) != set(k[0].axes):
        return "its keys and values are not over the same axes"
    return None


def pieces(graph: Graph) -> Pieces:
    form = match(graph)
    assert form is not None
    c = form.contractions[0]
    a, b = (strip_casts(x) for x in strip_casts(c.args[0]).args)
    q, k = (b, a) if form.key in a.axes else (a, b)
    v = _load(form.values)
    assert v is not None
    rows = tuple(x for x in graph.outputs[0].axes if x != form.e)
    tile = tuple(x for x in rows if x not in k.axes)
    return Pieces(form, c, q, k, v, rows, tile)


def score_grad(b, contributions: Contributions, scores: Node, c: Node, g: Node) -> Node:
    """dL/dc for a gradient g of the scores: g through the scores' elementwise work (scale,
    masks: zero where masked, soft cap: 1 - tanh^2) by autodiff's rules."""
    grads: dict[Node, Node] = {scores: g}
    live = {n for n in topo_order([scores]) if n is c or any(
        a is c for a in topo_order(list(n.args)))}
    for n in reversed(list(topo_order([scores]))):
        gn = grads.get(n)
        if gn is None or n is c or n not in live:
            continue
        for i, part in contributions(b, n, gn):
            a = n.args[i]
            if a not in live:
                continue
            grads[a] = part if a not in grads else b.add(grads[a], part)
    return grads.get(c, b.const(0.0))


@dataclass(frozen=True)
class Nodes:
    """The backward's values, as graph nodes over the forward's axes."""
    p: Node          # P over rows + L
    dp: Node         # dP over rows + L
    dc: Node         # dL/dc over rows + L
    lse: Node        # over rows: computed (kernel 1) or loaded (kernel 2)
    delta: Node


def nodes(b, contributions: Contributions, pc: Pieces, dy: Node, lse: Node,
          delta: Node) -> Nodes:
    """P, dP and dc given the rows' lse and delta (loads of the earlier kernels' buffers)."""
    f = pc.form
    p = b.unary(UnaryOp.EXP, b.bin(BinaryOp.SUB, b.f32(f.scores), lse))
    dp = b.sum(b.mul(dy, pc.v), f.e)
    ds = b.mul(p, b.bin(BinaryOp.SUB, dp, delta))
    return Nodes(p, dp, score_grad(b, contributions, f.scores, pc.c, ds), lse, delta)


def logsumexp(b, form: Form) -> Node:
    """max_L s + log(sum_L exp(s - max_L s)) of the forward's own max and denominator: the
    output the attention kernels write from their final state (`attention.lse`)."""
    return b.add(b.f32(form.max), b.unary(UnaryOp.LOG, b.f32(form.denom)))


def buffer_param(name: str, axes: tuple[str, ...], graph: Graph) -> TensorParam:
    dims = tuple(graph.axis_spec(a) for a in axes)
    return TensorParam(name, F32, None, dims, f"f32[{', '.join(axes)}]")


def output(node: Node, t: TensorParam) -> Output:
    """The gradient node as the output written to tensor t's storage (axes, dtype)."""
    g = node if t.dtype is F32 else Node(Op.CAST, (node,), t.dtype, node.axes)
    return Output(g, t.axes, t.dtype)


def refusal(graph: Graph, wrt: tuple[str, ...]) -> Optional[str]:
    """Why these gradients of an attention graph are not derived, None when they are."""
    why = why_not(graph)
    if why is not None:
        return why
    pc = pieces(graph)
    mine = {pc.q.attr, pc.k.attr, pc.v.attr}
    other = [n for n in wrt if n not in mine]
    if other:
        return (f"the gradient of '{other[0]}' (read by the scores' work: a bias or mask "
                "tensor) is not derived by the attention backward, only those of q, k and v; "
                "detach that input")
    return None


def _kernel(graph: Graph, name: str, extra: tuple[TensorParam, ...],
            outs: list[tuple[str, Output]]) -> Graph:
    return Graph(name, (*graph.params, *extra), tuple(o for _, o in outs),
                 consts=dict(graph.consts), dtype_vars=dict(graph.dtype_vars), loc=graph.loc)


def _roles(kind: str, pc: Pieces, dy: Node, nd: Nodes, outs: list[tuple[str, Output]]
           ) -> Roles:
    f = pc.form
    return Roles(kind, f.key, f.e, pc.rows, pc.tile,
                 tuple(a for a in pc.rows if a not in pc.tile), pc.c, pc.q, pc.k, pc.v,
                 strip_casts(dy), nd.p, nd.dp, nd.dc, nd.lse, nd.delta,
                 tuple(k for k, _ in outs), f)


def _buffer(name: str, axes: tuple[str, ...], dtype) -> Node:
    return Node(Op.LOAD, (), dtype, axes, attr=name)


@dataclass(frozen=True)
class Derived:
    """The backward graphs in launch order, {input: (kernel, output)}, {buffer: (kernel,
    output)}."""
    kernels: tuple[Graph, ...]
    grads: dict[str, tuple[int, int]]
    buffers: dict[str, tuple[int, int]]


def derive(graph: Graph, wrt: tuple[str, ...], b, contributions: Contributions, dy: Node,
           dy_params: tuple[TensorParam, ...], names: tuple[str, str, str]) -> Derived:
    """The backward of an attention graph (`refusal` None), four kernels:
    1. the forward again with the rows' logsumexp beside its output (the attention
       family's own kernels: `attention.lse`), into buffers `names[0]` (O) and `names[1]`;
    2. delta = rowsum(dO * O) (a row reduction), into buffer `names[2]`;
    3. over query rows: dq (the `attention_grad` family, "dq"), where asked;
    4. over keys: dk and dv ("dkdv"), where asked."""
    pc = pieces(graph)
    f, o = pc.form, graph.outputs[0]
    o_name, lse_name, delta_name = names
    fwd = Graph(f"{graph.name}_backward1", graph.params,
                (o, Output(logsumexp(b, f), pc.rows, F32)), consts=dict(graph.consts),
                dtype_vars=dict(graph.dtype_vars), loc=graph.loc)
    var = next((v for v, d in graph.dtype_vars.items() if d is o.dtype), None)
    o_param = TensorParam(o_name, o.dtype, var, tuple(graph.axis_spec(a) for a in o.axes),
                          f"{var or o.dtype}[{', '.join(o.axes)}]")
    saved = _buffer(o_name, o.axes, o.dtype)
    delta_k = _kernel(graph, f"{graph.name}_backward2", (*dy_params, o_param), [
        ("delta", Output(b.sum(b.mul(dy, saved), f.e), pc.rows, F32))])
    lse_t, delta_t = (buffer_param(n, pc.rows, graph) for n in (lse_name, delta_name))
    nd = nodes(b, contributions, pc, dy, _buffer(lse_name, pc.rows, F32),
               _buffer(delta_name, pc.rows, F32))
    extra = (*dy_params, lse_t, delta_t)
    kernels = [fwd, delta_k]
    grads: dict[str, tuple[int, int]] = {}
    if pc.q.attr in wrt:
        outs = [("dq", output(b.sum(b.mul(nd.dc, pc.k), f.key), graph.tensor(pc.q.attr)))]
        grads[pc.q.attr] = (len(kernels), 0)
        kernels.append(_kernel(graph, f"{graph.name}_backward3", extra, outs))
        register(kernels[-1], _roles("dq", pc, dy, nd, outs))
    second: list[tuple[str, Output]] = []
    for kind, t, g in (("dk", pc.k, b.mul(nd.dc, pc.q)), ("dv", pc.v, b.mul(nd.p, dy))):
        if t.attr in wrt:
            for ax in pc.tile:
                g = b.sum(g, ax)
            grads[t.attr] = (len(kernels), len(second))
            second.append((kind, output(g, graph.tensor(t.attr))))
    if second:
        kernels.append(_kernel(graph, f"{graph.name}_backward{len(kernels) + 1}", extra,
                               second))
        register(kernels[-1], _roles("dkdv", pc, dy, nd, second))
    return Derived(tuple(kernels), grads, {o_name: (0, 0), lse_name: (0, 1),
                                           delta_name: (1, 0)})
