"""The reference: evaluate a Graph with torch eager ops on the caller's tensors.

Each node is computed in float64 for float dtypes (float32 on devices without float64, i.e.
MPS) and its value rounded to fp32, the type a float value has in the kernel and in torch's fp32
arithmetic (f16/bf16 compute in f32): every op gives its float64 result rounded to fp32, a value
that under- or overflows fp32 does so here too (x * x of a tiny x is 0, as torch says), while a
reduction adds its fp32 terms in float64. Float runtime scalars are bound as 32-bit floats and
rounded the same way. Integers are int64 (wrapped back to the node's width after every op, so
integer overflow behaves as in the kernel's dtype) and bool for bools. Explicit casts round to their
target dtype; only the outputs are cast to their storage dtype. Values carry their axes in the
graph's canonical order and broadcast by name (missing axes become size-1 dims).
Reductions follow torch: max/min propagate NaN (torch.amax/amin), argmax/argmin give the
first index of the extreme value or of the first NaN, integer sums are int64.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional

import torch

from . import philox, unsigned
from .dtypes import BOOL, U64, DType
from .errors import GatherIndexError, empty_extreme
from .graph import (
    BinaryOp,
    Graph,
    Node,
    Op,
    Output,
    RandomOp,
    ReduceOp,
    ScanOp,
    UnaryOp,
    scan_reversed,
    topo_order,
)
from .shapes import bind_shapes, flat_shape, numel, output_shape

_UNARY: dict[UnaryOp, Callable[[torch.Tensor], torch.Tensor]] = {
    UnaryOp.NEG: torch.neg, UnaryOp.EXP: torch.exp, UnaryOp.EXP2: torch.exp2,
    UnaryOp.LOG: torch.log, UnaryOp.LOG2: torch.log2, UnaryOp.SQRT: torch.sqrt,
    UnaryOp.RSQRT: torch.rsqrt, UnaryOp.SIN: torch.sin, UnaryOp.COS: torch.cos,
    UnaryOp.TANH: torch.tanh, UnaryOp.SIGMOID: torch.sigmoid, UnaryOp.ERF: torch.erf,
    UnaryOp.ABS: torch.abs, UnaryOp.FLOOR: torch.floor, UnaryOp.CEIL: torch.ceil,
    UnaryOp.INVERT: torch.bitwise_not, UnaryOp.NOT: torch.logical_not,
}
_BINARY: dict[BinaryOp, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    BinaryOp.ADD: torch.add, BinaryOp.SUB: torch.sub, BinaryOp.MUL: torch.mul,
    BinaryOp.DIV: torch.div, BinaryOp.POW: torch.pow, BinaryOp.MAXIMUM: torch.maximum,
    BinaryOp.MINIMUM: torch.minimum, BinaryOp.MOD: torch.remainder,
    BinaryOp.FLOORDIV: lambda a, b: torch.div(a, b, rounding_mode="floor"),
    BinaryOp.EQ: torch.eq, BinaryOp.NE: torch.ne, BinaryOp.LT: torch.lt, BinaryOp.LE: torch.le,
    BinaryOp.GT: torch.gt, BinaryOp.GE: torch.ge, BinaryOp.AND: torch.bitwise_and,
    BinaryOp.OR: torch.bitwise_or, BinaryOp.XOR: torch.bitwise_xor,
    BinaryOp.SHL: torch.bitwise_left_shift, BinaryOp.SHR: torch.bitwise_right_shift,
}
_REDUCE: dict[ReduceOp, Callable[..., torch.Tensor]] = {
    ReduceOp.SUM: torch.sum, ReduceOp.PROD: torch.prod, ReduceOp.MAX: torch.amax,
    ReduceOp.MIN: torch.amin, ReduceOp.ARGMAX: torch.argmax, ReduceOp.ARGMIN: torch.argmin,
}
_SCAN: dict[ScanOp, Callable[..., Any]] = {
    ScanOp.CUMSUM: torch.cumsum, ScanOp.CUMPROD: torch.cumprod, ScanOp.CUMMAX: torch.cummax,
    ScanOp.CUMMIN: torch.cummin, ScanOp.LOGCUMSUMEXP: torch.logcumsumexp,
}
_EXTREMES = (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.ARGMAX, ReduceOp.ARGMIN)   # none of 0 values
_REDUCE_VALUE = (ReduceOp.MAX, ReduceOp.MIN)
# u64 operations whose result depends on the sign of the int64 pattern (metalforge.unsigned)
_U64_BINARY: dict[BinaryOp, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    **{op: (lambda f: lambda a, b: unsigned.compare(f, a, b))(_BINARY[op])
       for op in (BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE)},
    BinaryOp.MAXIMUM: lambda a, b: unsigned.extreme(torch.maximum, a, b),
    BinaryOp.MINIMUM: lambda a, b: unsigned.extreme(torch.minimum, a, b),
    BinaryOp.SHR: unsigned.shift_right,
    BinaryOp.FLOORDIV: lambda a, b: unsigned.divmod_(a, b)[0],
    BinaryOp.MOD: lambda a, b: unsigned.divmod_(a, b)[1],
}


def _unpack(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The `bits`-bit values packed in u32 words (held as int64), lowest bits first: the last
    dim grows from W words to W * 32 / bits values (int64)."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, device=words.device, dtype=torch.int64) * bits
    codes = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(*words.shape[:-1], words.shape[-1] * per_word)


def _take(src: torch.Tensor, src_axes: tuple[str, ...], axis: str, index: torch.Tensor,
          axes: tuple[str, ...], sizes: Mapping[str, int], what: str,
          unsigned: bool = False) -> torch.Tensor:
    """torch.gather along `axis` of `src` at `index` (broadcast to the node's `axes`;
    `unsigned`: a u64 index, held as its int64 pattern)."""
    rest = [a for a in axes if a in src_axes and a != axis]
    x = src.permute([src_axes.index(a) for a in rest] + [src_axes.index(axis)])
    x = x.reshape([sizes[a] if a in rest else 1 for a in axes] + [sizes[axis]])
    shape = [sizes[a] for a in axes]
    idx = index.to(torch.int64).expand(shape)
    bad = (idx < 0) | (idx >= sizes[axis])
    if bool(bad.any()):
        v = int(idx[bad][0])
        v += (1 << 64) if unsigned and v < 0 else 0
        raise GatherIndexError(f"{what}: index {v} is out of range for size {sizes[axis]}")
    return torch.gather(x.expand(shape + [sizes[axis]]), -1, idx.unsqueeze(-1)).squeeze(-1)


def evaluate(graph: Graph, values: Mapping[str, Any],
             adjust: Optional[Callable[[Node, torch.Tensor, torch.Tensor], torch.Tensor]] = None,
             rounded: Optional[Mapping[Node, torch.dtype]] = None):
    """Run `graph` eagerly. values: every tensor and runtime scalar by name. Returns the
    output tensor (or a tuple for several outputs) with batch dims re-expanded.
    adjust(node, input, result) may replace each reduction's result (testing uses it to see how
    far the outputs move when a sum is off by its allowed rounding error), and each float
    scatter's (input: the sum of the magnitudes of the terms added into each output element
    and their count, stacked along a new first dim).
    rounded: nodes whose values are rounded to a narrower float type before their uses, as a
    schedule's kernels do (`Schedule.rounded_operands`)."""
    ev = _Evaluator(graph, values, adjust)
    rounded = rounded or {}
    ev.fused = {x for x in _summed_products(graph)
                if numel(x.axes, ev.sizes) > FUSED_ELEMENTS}
    for n in graph.nodes():
        if n not in ev.fused:
            ev.val[n] = ev.fp32(ev.node(n), n.dtype)
            if n in rounded:
                ev.val[n] = ev.val[n].to(rounded[n]).to(ev.val[n].dtype)
    outs = [ev.output(o) for o in graph.outputs]
    return outs[0] if len(outs) == 1 else tuple(outs)


# A float product whose only use is a float sum is evaluated with that sum, a slice of the
# other axes at a time, once it has more elements than this (attention's q * k over [B, G, R,
# S, L, E] is 32 GiB at 32 heads, S = L = 1024, E = 128): the same products rounded to fp32 and
# the same float64 sums, in bounded memory.
FUSED_ELEMENTS = 1 << 25


def _summed_products(graph: Graph) -> list[Node]:
    """The float products whose only use is as the argument of a float sum (not an output)."""
    uses: dict[Node, int] = {}
    for n in graph.nodes():
        for a in n.args:
            uses[a] = uses.get(a, 0) + 1
    outputs = {o.node for o in graph.outputs}
    return [r.args[0] for r in graph.nodes() if r.op == Op.REDUCE and r.attr[0] == ReduceOp.SUM
            and r.dtype.is_float and r.args[0].op == Op.BINARY and r.args[0].attr == BinaryOp.MUL
            and r.args[0].dtype.is_float and uses[r.args[0]] == 1 and r.args[0] not in outputs]


def evaluate_expressions(graph: Graph, nodes: list[Node], sizes: Mapping[str, int],
                         scalars: Mapping[str, Any], axes: tuple[str, ...]) -> list[torch.Tensor]:
    """The values of `nodes`, expressions of indices, sizes, runtime scalars and constants (no
    tensor reads), at the axis sizes `sizes`: each as a tensor broadcastable over `axes`
    (schedules use it to count what index masks leave to read)."""
    ev = _Evaluator.at_sizes(graph, sizes, scalars)
    for n in topo_order(nodes):
        if n.op in (Op.LOAD, Op.TAKE, Op.TAKE_VALUE, Op.UNPACK, Op.REDUCE):
            raise ValueError(f"kernel '{graph.name}': {n.op} is not an expression of indices "
                             "and scalars")
        ev.val[n] = ev.fp32(ev.node(n), n.dtype)
    return [ev.align(n, axes) for n in nodes]


class _Evaluator:
    """One evaluation: float values in float64 (float32 on MPS, which has no float64), each
    float node rounded to fp32 as the kernel holds it, integers in int64 wrapped to their
    node's width."""

    def __init__(self, graph: Graph, values: Mapping[str, Any],
                 adjust: Optional[Callable[[Node, torch.Tensor, torch.Tensor], torch.Tensor]]):
        self.graph, self.values, self.adjust = graph, values, adjust
        self.tensors = {t.name: values[t.name] for t in graph.tensors}
        self.binding = bind_shapes(graph, self.tensors)
        self.sizes = self.binding.sizes
        self.device = next((t.device for t in self.tensors.values()), torch.device("cpu"))
        self.fdt = torch.float32 if self.device.type == "mps" else torch.float64
        self.val: dict[Node, torch.Tensor] = {}
        self.fused: set[Node] = set()           # products evaluated inside their sums

    @classmethod
    def at_sizes(cls, graph: Graph, sizes: Mapping[str, int],
                 scalars: Mapping[str, Any]) -> "_Evaluator":
        """An evaluator of expressions without tensors: axis sizes and scalars given."""
        ev = cls.__new__(cls)
        ev.graph, ev.values, ev.adjust, ev.tensors = graph, dict(scalars), None, {}
        ev.sizes, ev.device, ev.fdt, ev.val = dict(sizes), torch.device("cpu"), torch.float64, {}
        ev.fused = set()
        return ev

    # -- types --------------------------------------------------------------------------
    def eval_dtype(self, dt: DType) -> torch.dtype:
        return self.fdt if dt.is_float else (torch.bool if dt is BOOL else torch.int64)

    def fp32(self, t: torch.Tensor, dt: DType) -> torch.Tensor:
        """A float node's value as the kernel holds it: an fp32 number."""
        return t.to(torch.float32).to(self.fdt) if dt.is_float and self.fdt != torch.float32 \
            else t

    @staticmethod
    def wrap(t: torch.Tensor, dt: DType) -> torch.Tensor:
        """Integer results wrap to their own width, as they do in the kernel."""
        return t.to(dt.torch).to(torch.int64) if dt.is_int and dt.torch != torch.int64 else t

    def common(self, ts: list[torch.Tensor]) -> list[torch.Tensor]:
        if any(t.dtype.is_floating_point for t in ts):
            return [t.to(self.fdt) for t in ts]
        if all(t.dtype == torch.bool for t in ts):
            return ts
        return [t.to(torch.int64) for t in ts]

    def align(self, n: Node, axes: tuple[str, ...]) -> torch.Tensor:
        """val[n] broadcastable to `axes`: missing axes as size-1 dims; a derived axis K/64
        repeated 64 times along its base K (element k reads k // 64)."""
        t, names = self.val[n], list(n.axes)
        for i, a in enumerate(names):
            spec = self.graph.axis_spec(a)
            if a not in axes and spec.base in axes:
                t = t.repeat_interleave(spec.div, dim=i)
                names[i] = spec.base
        present = [a for a in axes if a in names]
        t = t.permute([names.index(a) for a in present])
        return t.reshape([t.shape[present.index(a)] if a in present else 1 for a in axes])

    def tensor(self, name: str) -> torch.Tensor:
        """Tensor argument `name` with its batch dims flattened (its annotation's axes)."""
        return self.tensors[name].reshape(flat_shape(self.binding, self.graph.tensor(name)))

    # -- nodes --------------------------------------------------------------------------
    def node(self, n: Node) -> torch.Tensor:
        ct, dev, sizes = self.eval_dtype(n.dtype), self.device, self.sizes
        if n.op == Op.REDUCE:                   # (its argument may be a product left unmade)
            return self.reduce(n, ct)
        args = [self.val[a] for a in n.args]
        if n.op == Op.LOAD:
            axes = self.graph.tensor(n.attr).axes
            return self.tensor(n.attr).permute([axes.index(a) for a in n.axes]).to(ct)
        if n.op == Op.SCALAR:
            return torch.tensor(self.values[n.attr], dtype=ct, device=dev)
        if n.op == Op.CONST:
            return torch.tensor(n.attr, dtype=ct, device=dev)
        if n.op == Op.INDEX:
            return torch.arange(sizes[n.attr], dtype=torch.int64, device=dev)
        if n.op == Op.SIZE:
            return torch.tensor(sizes[n.attr], dtype=torch.int64, device=dev)
        if n.op == Op.CAST:
            if n.args[0].dtype is U64 and n.dtype.is_float:     # the value, not the pattern
                return unsigned.to_float(args[0], ct).to(n.dtype.torch).to(ct)
            return args[0].to(n.dtype.torch).to(ct)
        if n.op == Op.UNARY:
            return self.wrap(_UNARY[n.attr](args[0].to(ct)), n.dtype)
        if n.op == Op.BINARY and n.attr in _U64_BINARY and n.args[0].dtype is U64:
            a, b = self.common([self.align(x, n.axes) for x in n.args])
            return _U64_BINARY[n.attr](a, b)
        if n.op == Op.BINARY:
            a, b = self.common([self.align(x, n.axes) for x in n.args])
            return self.wrap(_BINARY[n.attr](a, b).to(ct), n.dtype)
        if n.op == Op.WHERE:
            a, b = self.common([self.align(x, n.axes) for x in n.args[1:]])
            return torch.where(self.align(n.args[0], n.axes), a, b).to(ct)
        if n.op == Op.UNPACK:
            words = n.args[0].axes                      # (..., K/(32/bits))
            layout = [*words[:-1], *(a for a in n.axes if a not in words)]   # (..., K)
            return _unpack(args[0], n.attr).permute([layout.index(a) for a in n.axes])
        if n.op == Op.TAKE:
            name, axis = n.attr
            return _take(self.tensor(name).to(ct), self.graph.tensor(name).axes, axis,
                         self.align(n.args[0], n.axes), n.axes, sizes,
                         f"kernel '{self.graph.name}': mf.take from '{name}' along '{axis}'",
                         n.args[0].dtype is U64)
        if n.op == Op.TAKE_VALUE:
            src, axis = n.args[0], n.attr
            full = self.val[src].expand([sizes[a] for a in src.axes]).to(ct)
            return _take(full, src.axes, axis, self.align(n.args[1], n.axes), n.axes, sizes,
                         f"kernel '{self.graph.name}': mf.take of a value along '{axis}'")
        if n.op == Op.SCATTER:
            return self.scatter(n, ct)
        if n.op == Op.SCAN and n.attr[0] == ScanOp.SEGSUM:
            return self.segsum(n, ct)
        if n.op == Op.SCAN:
            return self.scan(n, args[0], ct)
        if n.op == Op.RANDOM:
            return self.random(n, int(args[0]), int(args[1]), ct)
        raise ValueError(f"reference: unknown graph op {n.op!r} in kernel '{self.graph.name}'")

    def scatter(self, n: Node, ct: torch.dtype) -> torch.Tensor:
        """mf.scatter_add: torch's index_add_ into zeros (float64 sums; int64 for integers,
        wrapped to the output's width), the values' and index's axes flattened to rows of
        (index axes) by columns of (the output's other axes)."""
        axis = n.attr[0]
        vals, idx = n.args
        rows = idx.axes
        cols = tuple(a for a in n.axes if a != axis)
        shape = [self.sizes[a] for a in rows + cols]
        v = self.align(vals, rows + cols).to(ct).expand(shape).reshape(numel(rows, self.sizes),
                                                                     numel(cols, self.sizes))
        i = self.align(idx, rows).to(torch.int64).expand(shape[:len(rows)]).reshape(-1)
        size = self.sizes[axis]
        bad = (i < 0) | (i >= size)
        if bool(bad.any()):
            raise GatherIndexError(f"kernel '{self.graph.name}': mf.scatter_add along "
                                   f"'{axis}': index {int(i[bad][0])} is out of range for size "
                                   f"{size}")
        out = torch.zeros(size, v.shape[1], dtype=ct, device=v.device).index_add_(0, i, v)
        order = [([axis] + list(cols)).index(a) for a in n.axes]
        shape = [size] + [self.sizes[a] for a in cols]
        r = self.wrap(out.reshape(shape).permute(order), n.dtype)
        if self.adjust is None or not n.dtype.is_float:
            return r
        # what the allowed accumulation error of each output element's sum depends on: the
        # sum of its terms' magnitudes and their count, stacked (testing.slack's bound)
        terms = torch.nan_to_num(v.abs(), nan=0.0, posinf=0.0)
        mags = torch.zeros_like(out).index_add_(0, i, terms)
        count = torch.zeros_like(out).index_add_(0, i, torch.ones_like(v))
        x = torch.stack([m.reshape(shape).permute(order) for m in (mags, count)])
        return self.adjust(n, x, r)

    def scan(self, n: Node, x: torch.Tensor, ct: torch.dtype) -> torch.Tensor:
        """A scan along its axis with torch's own function (float64 for floats, rounded to
        fp32 once; cumprod in fp32; cummax/cummin keep their values, not their indices)."""
        kind, axis = n.attr[:2]
        dim = n.args[0].axes.index(axis)
        if scan_reversed(n):                  # from the axis's end: flipped, scanned, flipped
            return self.scan(Node(n.op, n.args, n.dtype, n.axes, attr=(kind, axis)),
                             x.flip(dim), ct).flip(dim)
        if kind == ScanOp.CUMPROD and n.dtype.is_float:
            # in fp32, as the kernel (and torch on f32) multiply: a running product overflows
            # to inf (then inf * 0 is NaN) or underflows to 0 where float64's would not
            x = x.to(torch.float32)
        r = _SCAN[kind](x.to(x.dtype if x.dtype == torch.float32 else ct), dim=dim)
        return self.wrap((r.values if kind in (ScanOp.CUMMAX, ScanOp.CUMMIN) else r).to(ct),
                         n.dtype)

    def segsum(self, n: Node, ct: torch.dtype) -> torch.Tensor:
        """The segmented cumsum (cummax/cummin's gradient, `graph.ScanOp.SEGSUM`), element i
        summed in float64 from i itself away from the scan's start (torch's cummax backward,
        a scatter_add, sums a segment from the running maximum's position on, in the
        forward scan's order, from 0: the same sums); a forward scan runs flipped."""
        axis = n.attr[1]
        dim = n.axes.index(axis)
        shape = [self.sizes[a] for a in n.axes]
        x = self.align(n.args[0], n.axes).to(torch.float64).expand(shape).movedim(dim, -1)
        end = self.align(n.args[1], n.axes).to(torch.bool).expand(shape).movedim(dim, -1)
        if not scan_reversed(n):
            x, end = x.flip(-1), end.flip(-1)
        d = shape[dim]
        pos = torch.arange(d, device=x.device)
        # stop[i]: the first end after i (d if none); element i sums x[i .. stop[i] - 1]
        ends = torch.where(end, pos, torch.full_like(pos, d))
        first = ends.flip(-1).cummin(-1).values.flip(-1)
        stop = torch.cat([first[..., 1:], torch.full_like(first[..., :1], d)], -1)
        out, t = x.clone(), 1
        padded = torch.cat([x, torch.zeros_like(x)], -1)
        while bool((pos + t < stop).any()):
            more = pos + t < stop
            out = torch.where(more, out + padded[..., t:t + d], out)
            t += 1
        if not scan_reversed(n):
            out = out.flip(-1)
        return self.wrap(out.movedim(-1, dim).to(ct), n.dtype)

    def random(self, n: Node, seed: int, offset: int, ct: torch.dtype) -> torch.Tensor:
        """mf.rand / mf.randn: Philox-4x32-10 in torch int64 arithmetic (`metalforge.philox`)
        at each element's row-major linear position over the node's axes, rounded to its
        dtype."""
        shape = [self.sizes[a] for a in n.axes]
        index = torch.arange(numel(n.axes, self.sizes), dtype=torch.int64,
                             device=self.device).reshape(shape)
        if n.attr == RandomOp.RAND:
            v = philox.uniform(seed, offset, index, n.dtype)
        else:
            v = philox.normal(seed, offset, index)
        return v.to(n.dtype.torch).to(ct)

    def reduce(self, n: Node, ct: torch.dtype) -> torch.Tensor:
        x = n.args[0]
        return self.fused_sum(n, ct) if x in self.fused else self.reduced(n, self.val[x], ct)

    def reduced(self, n: Node, x: torch.Tensor, ct: torch.dtype) -> torch.Tensor:
        """Reduction `n` of its argument's value `x` (or a slice of it along another axis),
        adjusted where an `adjust` is given."""
        kind, axis = n.attr
        dim = n.args[0].axes.index(axis)
        if kind in _EXTREMES and x.shape[dim] == 0:
            # no value, as in the kernel: refused where an output element could read it
            if any(math.prod(output_shape(self.binding, o)) for o in self.graph.outputs):
                raise empty_extreme(self.graph.name, kind, axis, n.loc)
            return torch.zeros(x.shape[:dim] + x.shape[dim + 1:], dtype=ct, device=x.device)
        if kind in _EXTREMES and n.args[0].dtype is U64:       # ordered as unsigned values
            r = unsigned.reduce_extreme(_REDUCE[kind], x, dim, kind not in _REDUCE_VALUE)
        else:
            r = self.wrap(_REDUCE[kind](x, dim=dim).to(ct), n.dtype)
        return self.adjust(n, x, r) if self.adjust is not None else r

    def fused_sum(self, n: Node, ct: torch.dtype) -> torch.Tensor:
        """sum(a * b) without the whole product: slices along the longest other axis, each
        product rounded to fp32 and summed (and adjusted) as `reduce` does the whole."""
        x = n.args[0]
        dim = x.axes.index(n.attr[1])
        other = [i for i in range(len(x.axes)) if i != dim]
        along = max(other, key=lambda i: self.sizes[x.axes[i]])
        size = self.sizes[x.axes[along]]
        step = max(1, FUSED_ELEMENTS * size // numel(x.axes, self.sizes))
        args = self.common([self.align(a, x.axes) for a in x.args])
        parts = []
        for s0 in range(0, size, step):
            cut = [a.narrow(along, s0, min(step, size - s0)) if a.shape[along] > 1 else a
                   for a in args]
            p = self.wrap(_BINARY[x.attr](*cut).to(self.eval_dtype(x.dtype)), x.dtype)
            parts.append(self.reduced(n, self.fp32(p, x.dtype), ct))
        return torch.cat(parts, dim=along - (along > dim))

    def output(self, o: Output) -> torch.Tensor:
        n = o.node
        t = self.align(n, n.axes).permute([n.axes.index(a) for a in o.axes])
        t = t.expand([self.sizes[a] for a in o.axes]).to(o.dtype.torch)
        return t.reshape(output_shape(self.binding, o)).contiguous()
