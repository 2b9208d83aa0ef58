"""The adjoints of gathers, scatters and scans (`autodiff` builds them into the backward graph),
and which of their nodes a backward kernel must take from an earlier kernel.

- A gather ``mf.take(x, axis, i)`` whose index has axes x does not keep (an embedding lookup
  ``mf.take(table, "V", ids)``, a RoPE-style permutation inside a row, a paged read) sends
  x the scatter-add of its output gradient: ``mf.scatter_add(g, axis, i)`` (several ids
  reading one row sum their gradients there). The scatter is atomic, or deterministic (the
  index sorted, each row summed in order) where `deterministic` asks: `autodiff.backward_of`
  follows ``torch.use_deterministic_algorithms``, as torch's embedding backward does.
- ``mf.scatter_add(v, axis, i)`` sends its values the gather of its output gradient:
  ``mf.take(dy, axis, i)``.
- A scan's gradient is a scan the other way: cumsum's is the reverse cumsum of g
  (dx_i = sum_{j>=i} g_j); logcumsumexp's is torch's stable formula,
  exp(x_i + rlcse(log g+ - y)_i) - exp(x_i + rlcse(log g- - y)_i) with rlcse the reverse
  logcumsumexp and g+ / g- the positive / negative parts of g (no exp(-y) overflow).
  cumprod's is torch's, zeros included (`_cumprod_grad`); cummax's and cummin's goes to
  the running maximum's (minimum's) position, torch's cummax indices (`running_grad`).

The schedules take one scatter as a kernel's only output, no reduction or scan inside a scan
kernel, no scan of a scan, and no scan or scatter in a reduction kernel: `apart` names the
nodes of a backward target that an earlier kernel must write to a buffer instead.
"""
from __future__ import annotations

from typing import Any, Optional

from .dtypes import F32
from .errors import MetalforgeError
from .graph import BinaryOp, Graph, Node, Op, ReduceOp, ScanOp, UnaryOp, scan_reversed

LOWEST = -3.4028234663852886e38         # f32's lowest finite value: log(0) of torch's formula


def scatter_of(graph: Graph, n: Node, g: Node, deterministic: bool) -> Node:
    """The gradient gather `n` = mf.take(x, axis, i) sends to x: g scattered back along
    `axis` at the positions i (the index's axes summed over), x's other axes matched by name."""
    name, axis = n.attr
    idx = n.args[0]
    keep = set(graph.tensor(name).axes)
    order = {a: k for k, a in enumerate(graph.tensor(name).axes)}
    axes = tuple(sorted((set(g.axes) - set(idx.axes)) | {axis}, key=order.__getitem__))
    assert set(axes) <= keep, (axes, keep)
    return Node(Op.SCATTER, (g, idx), F32, axes, attr=(axis, deterministic), loc=n.loc)


def scatter_refusal(graph: Graph, n: Node, deterministic: bool) -> Optional[str]:
    """Why gather `n`'s gradient cannot be a scatter-add (None when it can): the index shares
    an axis with the tensor (a batched gather: the scatter would sum over it), or the
    deterministic scatter needs the index as a tensor argument."""
    name, axis = n.attr
    idx = n.args[0]
    shared = [a for a in idx.axes if a in graph.tensor(name).axes]
    if shared == [axis]:
        return (f"its index runs along the gathered axis '{axis}' itself, so its gradient, a "
                f"scatter-add along '{axis}', would scatter from and to one axis; give the "
                f"index an axis of its own (\"i32[E]\", the result over E)")
    if shared:
        return (f"its index has axes {list(idx.axes)}, of which {shared} are axes of "
                f"'{name}' too (a batched gather): its gradient would be a scatter-add per "
                f"'{shared[0]}', which mf.scatter_add does not express (it sums over every "
                f"index axis)")
    if deterministic and idx.op != Op.LOAD:
        return ("deterministic gradients (torch.use_deterministic_algorithms) scatter it by "
                "sorting the index, which must then be a tensor argument; this index is "
                "computed in the kernel: pass it in as a tensor, or turn deterministic "
                "algorithms off")
    return None


def take_of(n: Node, g: Node) -> Node:
    """The gradient mf.scatter_add(v, axis, i) (`n`, the kernel's only output, so its gradient
    g is the load of the output gradient dy) sends to its values: mf.take(dy, axis, i)."""
    axis = n.attr[0]
    ld = g.args[0] if g.op == Op.CAST else g
    assert ld.op == Op.LOAD, ld
    idx = n.args[1]
    axes = tuple(a for a in n.axes if a != axis) + tuple(a for a in idx.axes
                                                          if a not in n.axes)
    t = Node(Op.TAKE, (idx,), ld.dtype, axes, attr=(ld.attr, axis), loc=n.loc)
    return t if t.dtype is F32 else Node(Op.CAST, (t,), F32, axes)


def scan(kind: ScanOp, a: Node, axis: str, reverse: bool) -> Node:
    """A SCAN node of `kind` over `axis` of the f32 value a, from the end where `reverse`."""
    return Node(Op.SCAN, (a,), F32, a.axes, attr=(kind, axis, True) if reverse else (kind, axis))


def scan_grad(b: Any, n: Node, g: Node) -> Node:
    """The gradient scan `n` (any float scan: `running_grad` for cummax and cummin) with
    output gradient g sends to its argument (b: autodiff's node builder)."""
    kind, axis = n.attr[:2]
    back = not scan_reversed(n)                   # the gradient runs the other way
    if kind == ScanOp.CUMSUM:
        return scan(ScanOp.CUMSUM, b.f32(g), axis, back)
    if kind == ScanOp.CUMPROD:
        return _cumprod_grad(b, n, b.f32(g), axis, back)
    if kind in (ScanOp.CUMMAX, ScanOp.CUMMIN):
        return running_grad(b, n, b.f32(g), axis, back)
    assert kind == ScanOp.LOGCUMSUMEXP, kind
    x, y = b.f32(n.args[0]), b.f32(n)
    log_g = b.unary(UnaryOp.LOG, b.unary(UnaryOp.ABS, g))
    parts = []
    for sign in (BinaryOp.GT, BinaryOp.LT):
        lg = b.where(b.cmp(sign, b.f32(g), b.const(0.0)), log_g, b.const(LOWEST))
        r = scan(ScanOp.LOGCUMSUMEXP, b.bin(BinaryOp.SUB, lg, y), axis, back)
        parts.append(b.unary(UnaryOp.EXP, b.add(r, x)))
    return b.bin(BinaryOp.SUB, parts[0], parts[1])


def _cumprod_grad(b: Any, n: Node, g: Node, axis: str, back: bool) -> Node:
    """cumprod's gradient with torch's handling of zeros (cumprod_backward): with z the first
    zero of the row (in the scan's direction), elements before it get
    rcumsum(g * y)_i / x_i, the zero itself rcumsum(g * y')_z where y' is the cumprod of x
    with that zero read as 1 (the products that skip it), elements after it 0. Four kernels:
    the zeros so far, y, y' (each a scan of its own), then the two reverse cumsums."""
    fwd = not back
    x = b.f32(n.args[0])
    is_zero = b.cmp(BinaryOp.EQ, x, b.const(0.0))
    zeros = scan(ScanOp.CUMSUM, b.where(is_zero, b.const(1.0), b.const(0.0)), axis, fwd)
    before = b.cmp(BinaryOp.EQ, zeros, b.const(0.0))
    first = b.cmp(BinaryOp.AND, is_zero, b.cmp(BinaryOp.EQ, zeros, b.const(1.0)))
    skipped = scan(ScanOp.CUMPROD, b.where(first, b.const(1.0), x), axis, fwd)
    at_or_before = scan(ScanOp.CUMSUM, b.mul(g, b.f32(n)), axis, back)
    at_zero = scan(ScanOp.CUMSUM, b.mul(g, skipped), axis, back)
    return b.where(before, b.div(at_or_before, x), b.zero_unless(first, at_zero))


def running_grad(b: Any, n: Node, g: Node, axis: str, back: bool) -> Node:
    """cummax's (cummin's) gradient, torch's exactly: dx_j sums g_i over the i whose running
    index (torch.cummax's indices) is j. torch moves the index to element j where x_j is NaN
    or x_j >= (<=) the running value before it (ties: the latest), i.e. where x_j equals the
    scan's output y_j or is NaN: the "takers". The index runs up the scan, so the i sending
    to taker j are j and those after it up to the next taker: a segment. One segmented
    cumsum the other way (`graph.ScanOp.SEGSUM`, restarting after each taker: every element
    of a segment sums g from itself to the segment's end) gives each taker its segment's sum
    exactly (no difference of two cumsums, which cancels); the others get 0.
    Chosen over the alternative, an index scan then a scatter-add along the same axis: the
    scatter family scatters across an axis the index does not have, not within a row, and
    its atomics would make the sums' order vary; the segmented scan is one more combine in
    the scan kernels (a (flags, sum) pair per element), its sums in scan order."""
    x = b.f32(n.args[0])
    taker = b.cmp(BinaryOp.OR, b.cmp(BinaryOp.EQ, x, b.f32(n)), b.cmp(BinaryOp.NE, x, x))
    seg = Node(Op.SCAN, (g, taker), F32, b.axes(g, taker),
               attr=(ScanOp.SEGSUM, axis, True) if back else (ScanOp.SEGSUM, axis))
    return b.zero_unless(taker, seg)


def scan_refusal(n: Node) -> Optional[str]:
    """Why scan `n` has no derivative here: None for every float scan (an integer one has no
    gradient to send; autodiff does not ask)."""
    return None


def logsumexp_arg(n: Node) -> Optional[Node]:
    """x where node n is mf.logsumexp(x, axis) as traced, ``log(sum(exp(x - m))) + m`` with
    the shift m = max(x) (or ``where(|max(x)| == inf, 0, max(x))``) over the same axis; else
    None. Its gradient is then one rule (`logsumexp_grad`): the shift cancels exactly
    (d/dm = 1 - sum(softmax) = 0), so none goes through the max, whose tie count and the
    sum that cancels it would each be a reduction (a pass over a long row) of the backward."""
    if n.op != Op.BINARY or n.attr != BinaryOp.ADD:
        return None
    for lg, m in (n.args, n.args[::-1]):
        if not (lg.op == Op.UNARY and lg.attr == UnaryOp.LOG):
            continue
        s = lg.args[0]
        if not (s.op == Op.REDUCE and s.attr[0] == ReduceOp.SUM):
            continue
        e = s.args[0]
        if not (e.op == Op.UNARY and e.attr == UnaryOp.EXP):
            continue
        d = e.args[0]
        if not (d.op == Op.BINARY and d.attr == BinaryOp.SUB and d.args[1] is m):
            continue
        x, mx = d.args[0], m
        if mx.op == Op.WHERE:                     # the shift of an infinite max replaced by 0
            mx = mx.args[2]
        if mx.op == Op.REDUCE and mx.attr == (ReduceOp.MAX, s.attr[1]) and mx.args[0] is x:
            return x
    return None


def logsumexp_grad(b: Any, n: Node, x: Node, g: Node) -> Node:
    """The gradient lse = mf.logsumexp(x) (node n) with output gradient g sends to x:
    g * exp(x - lse), the softmax times g, as torch's logsumexp_backward (no separate softmax:
    the row kernel computes it from the row value lse where it writes dx)."""
    return b.mul(g, b.unary(UnaryOp.EXP, b.bin(BinaryOp.SUB, x, n)))


def packed_refusal(graph: Graph, name: str) -> Optional[str]:
    """Why float tensor `name` gets no gradient as part of a quantized weight (None where it
    is not one): it is read per group (K/GS) along the axis that mf.unpack unpacks words
    along (K/8 of the same K), i.e. the weight's scales or biases. The gradient of a
    quantized matvec flows to x only (a column reduction over the weight rows,
    `schedule.quant.transposed`); the packed words are integers and have none."""
    packed = {graph.axis_spec(n.args[0].axes[-1]).base for n in graph.nodes()
              if n.op == Op.UNPACK}
    spec = next((d for d in graph.tensor(name).dims if d.derived and d.base in packed), None)
    if spec is None:
        return None
    return (f"argument '{name}' is read per group along '{spec.name}' of the axis "
            f"'{spec.base}' that mf.unpack unpacks words along: a quantized weight's scales "
            f"or biases, for which metalforge derives no gradient (quantized weights are "
            f"fixed: the packed words are integers, their scales and biases set by the "
            f"quantization); detach it and differentiate x only (or train the float weight "
            f"and quantize it afterwards)")


# --------------------------------------------------------------------------- splitting

BARRIERS = (Op.REDUCE, Op.SCAN, Op.SCATTER)


def kind_of(root: Node) -> str:
    """The kernel a backward target makes: 'scatter' (the scatter its only output), 'scan'
    (a scan reached without passing a reduction or scatter), else 'reduce' (reductions or
    elementwise work: `autodiff` splits those by axis)."""
    if root.op == Op.SCATTER:
        return "scatter"
    return "reduce" if _scan_below(root) is None else "scan"


def _scan_below(root: Node) -> Optional[Node]:
    """The first scan met from `root`, depth first, not passing a reduction or scatter."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op == Op.SCAN:
            return n
        if n.op not in BARRIERS:
            stack.extend(n.args)
    return None


def apart(graph: Graph, root: Node) -> list[Node]:
    """The nodes of target `root` that an earlier kernel must write to a buffer (each the
    topmost such on its path): below a scatter root, every reduction, scan or scatter; in a
    scan kernel, every reduction and scatter, and any scan or reduction inside a scan's
    argument (a scan of a scan); in a reduction kernel, every scan and scatter, and a gather
    whose index runs along a reduced axis that is not innermost (the column schedule gathers
    one value per column only: the embedding's d(scale) sums table[ids[n]] over n).
    Reductions over other axes are autodiff's `_reduce_axis`."""
    kind = kind_of(root)
    main = _first_scan(root) if kind == "scan" else None
    out: list[Node] = []
    seen: set[tuple[int, Optional[str]]] = set()
    stack: list[tuple[Node, Optional[str]]] = [(a, None) for a in root.args] \
        if kind == "scatter" else [(root, None)]
    while stack:
        n, inside = stack.pop()            # inside: "scan", a reduced axis, or None
        if (id(n), inside) in seen:
            continue
        seen.add((id(n), inside))
        if _buffered(graph, kind, n, inside) or (main is not None and n.op == Op.SCAN and
                                                 _way(n) != _way(main)):
            if n not in out:
                out.append(n)
            continue
        below = "scan" if n.op == Op.SCAN or inside == "scan" else \
            (n.attr[1] if n.op == Op.REDUCE else inside)
        stack.extend((a, below) for a in n.args)
    return out


def _buffered(graph: Graph, kind: str, n: Node, inside: Optional[str]) -> bool:
    if n.op == Op.TAKE:
        return kind == "reduce" and inside is not None and inside in n.args[0].axes and \
            n.args[0].op != Op.CONST and not _innermost(graph, inside)
    if n.op not in BARRIERS:
        return False
    if kind == "scatter" or n.op == Op.SCATTER:
        return True
    if kind == "scan":
        return inside == "scan" or n.op == Op.REDUCE
    return n.op == Op.SCAN


def _innermost(graph: Graph, axis: str) -> bool:
    """Whether `axis` is the last axis of every tensor and output of the forward graph that
    has it (the backward's reduction over it is then a row reduction)."""
    return all(axes[-1] == axis for axes in [t.axes for t in graph.tensors] +
               [o.axes for o in graph.outputs] if axis in axes)


def buffer_name(n: Node) -> str:
    """The base name of the buffer holding node n (a reduction's: its kind and axis)."""
    if n.op == Op.SCATTER:
        return f"scatter_{n.attr[0]}"
    if n.op == Op.TAKE:
        return f"take_{n.attr[0]}"
    return f"{n.attr[0]}_{n.attr[1]}" + ("_rev" if n.op == Op.SCAN and scan_reversed(n) else "")


def group_key(root: Node, name: str) -> Optional[tuple]:
    """The kernel group of a target whose kernel is a scatter (alone) or a scan (with the
    other scans along its axis, one direction), None for the others (`autodiff._group`)."""
    kind = kind_of(root)
    if kind == "scatter":
        return ("scatter", name)
    if (root.args[0] if root.op == Op.CAST else root).op == Op.TAKE:
        # a gather `apart` set aside (cast to f32): a kernel of its own
        return ("gather", name)
    if kind == "scan":
        s = _first_scan(root)
        return ("scan", s.attr[1], scan_reversed(s), frozenset(root.axes))
    return None


def _way(n: Node) -> tuple[str, bool]:
    return n.attr[1], scan_reversed(n)


def _first_scan(root: Node) -> Node:
    """The scan that sets a scan kernel's axis and direction: the first met from the root
    (not through a reduction or scatter, which `apart` sets aside); `apart` sets aside the
    scans along another axis or the other way."""
    s = _scan_below(root)
    if s is None:
        raise MetalforgeError("no scan")       # kind_of said there is one
    return s
