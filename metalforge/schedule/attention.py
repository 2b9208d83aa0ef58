"""The attention schedule: softmax over an axis L of scores that contract an axis E, followed by
a contraction with values over L, computed in one pass over the keys with an online softmax.

Recognised when an output is (elementwise work on) `sum(P * V, axis=L)` where P is a softmax
over L (`exp(s - max(s, L)) / sum(exp(s - max(s, L)), L)`, the form `mf.softmax` builds) of
scores `s` that are elementwise work (scale, masks from `mf.index`/`mf.size`, tensor masks and
biases, soft caps) on contractions `sum(..., axis=E)`:

    s = mf.sum(q * k, axis="E") * scale
    s = mf.where(mf.index("L") <= mf.index("S"), s, -mf.inf)
    out = mf.sum(mf.softmax(s, axis="L") * v, axis="L")

One kernel, `decode`: one simdgroup per query row (every output axis but E). Lane l holds
elements l, l + 32, ... of the row's E outputs (E <= 32 * `reads_per_thread`). For each key:
each lane computes its part of the score contraction, `simd_sum` completes it, every lane
computes the score's elementwise work, and the online-softmax state (running max m, running sum
d, the rescaled fp32 accumulator of the E outputs) absorbs it:

    m' = max(m, s);  c = exp(m - m');  p = exp(s - m');  d = d c + p;  acc = acc c + p v

(with c = 1, p = 0 while m' is still -inf, so masked keys before the first visible one add
nothing). The outputs are acc / d: all keys masked gives 0 / 0 = NaN, as softmax of all -inf
does in torch; a NaN score makes the row NaN, as in softmax. The scores never touch memory.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Optional

from .. import ir
from ..errors import LaunchError, UnsupportedConstruct, at
from ..graph import Graph, Node, Op
from . import reduce
from .base import IDX, Schedule, make_kernel
from .elementwise import kernel_params, msl_names, used_params
from .lower import ElementLowering, compute_type, ident
from .policy import SIMD_WIDTH, LaunchPolicy

SIMD = ir.Lit(SIMD_WIDTH, "uint")
NEG_INF = ir.Lit(float("-inf"), "float")


@dataclass(frozen=True)
class Form:
    """The pieces of an attention graph."""
    out: Node                  # sum(P * V, axis=L)
    values: Node               # V: the factor of P (over L and E)
    scores: Node               # s: what the softmax is over
    max: Node                  # max(s, L)
    denom: Node                # sum(exp(s - max), L)
    contractions: tuple[Node, ...]   # the sums over E inside the scores
    key: str                   # L: the softmax / key axis
    e: str                     # E: the contracted / output axis


def _strip(n: Node) -> Node:
    while n.op == Op.CAST:
        n = n.args[0]
    return n


def _reductions_in(n: Node) -> list[Node]:
    seen: list[Node] = []
    stack = [n]
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.append(m)
        stack.extend(m.args)
    return [m for m in seen if m.op == Op.REDUCE]


def match(graph: Graph) -> Optional[Form]:
    """The attention form of `graph`, or None when it is not one."""
    outs = [r for o in graph.outputs for r in _reductions_in(o.node)
            if r.attr[0] == "sum" and _strip(r.args[0]).op == Op.BINARY
            and _strip(r.args[0]).attr == "mul"]
    for out in outs:
        l_axis = out.attr[1]
        prod = _strip(out.args[0])
        for p, v in (prod.args, prod.args[::-1]):
            form = _softmax(_strip(p), l_axis)
            if form is None or _reductions_in(v):
                continue
            scores, mx, denom = form
            contractions = tuple(r for r in _reductions_in(scores))
            axes = {r.attr[1] for r in contractions}
            if not contractions or len(axes) != 1 or l_axis in axes or any(
                    r.attr[0] != "sum" or _reductions_in(r.args[0]) for r in contractions):
                continue
            e_axis = axes.pop()
            if e_axis not in out.axes:
                continue
            return Form(out, v, scores, mx, denom, contractions, l_axis, e_axis)
    return None


def _softmax(p: Node, axis: str) -> Optional[tuple[Node, Node, Node]]:
    """(s, max(s), sum(exp(s - max))) when p is exp(s - max(s, axis)) / sum(..., axis)."""
    if p.op != Op.BINARY or p.attr != "div":
        return None
    e, denom = (_strip(a) for a in p.args)
    if denom.op != Op.REDUCE or denom.attr != ("sum", axis) or _strip(denom.args[0]) is not e:
        return None
    if e.op != Op.UNARY or e.attr != "exp":
        return None
    diff = _strip(e.args[0])
    if diff.op != Op.BINARY or diff.attr != "sub":
        return None
    s, mx = (_strip(a) for a in diff.args)
    if mx.op != Op.REDUCE or mx.attr != ("max", axis) or _strip(mx.args[0]) is not s:
        return None
    return s, mx, denom


def is_attention(graph: Graph) -> bool:
    return match(graph) is not None


def build(graph: Graph, policy: LaunchPolicy, index64: bool) -> "AttentionSchedule":
    return _Builder(graph, policy, index64).build()


@dataclass
class AttentionSchedule(Schedule):
    l_axis: str = "L"
    e_axis: str = "E"
    rows: tuple[str, ...] = ()
    max_e: int = 256

    @property
    def axis(self) -> str:
        """The key axis: the size testing draws boundaries of (1, 31, 32, 33, ...)."""
        return self.l_axis

    def _rows(self, sizes: Mapping[str, int]) -> int:
        n = 1
        for a in self.rows:
            n *= sizes[a]
        return n

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        threads = self._rows(sizes) * SIMD_WIDTH
        return threads, max(SIMD_WIDTH, min(self.policy.threads_per_group, threads))

    def host_name(self, sizes: Mapping[str, int]) -> str:
        where = f"kernel '{self.graph.name}'"
        if sizes[self.e_axis] > self.max_e:
            raise LaunchError(f"{where}: '{self.e_axis}' = {sizes[self.e_axis]}, over the "
                              f"{self.max_e} the attention schedule holds per row (32 lanes x "
                              f"reads_per_thread={self.max_e // SIMD_WIDTH}); raise "
                              f"launch={{'reads_per_thread': ...}} up to 16")
        if sizes[self.l_axis] == 0:
            raise ValueError(f"{where}: softmax over an empty axis ({self.l_axis} = 0) has no "
                             "value (torch raises too)")
        n = self._rows(sizes) * sizes[self.l_axis] * sizes[self.e_axis]
        if not self.index64 and n >= 2 ** 31:
            raise LaunchError(f"{where}: {n} elements need 64-bit indexing; call it with "
                              "launch={'index64': True}")
        return self.kernel.host_name

    def max_group_size(self, host_name: str) -> int:
        return self.policy.threads_per_group


class _Builder(reduce.Builder):
    def __init__(self, graph: Graph, policy: LaunchPolicy, index64: bool):
        form = match(graph)
        if form is None:
            raise UnsupportedConstruct(f"kernel '{graph.name}': not an attention graph")
        self.form = form
        self.graph, self.policy, self.index64 = graph, policy, index64
        self.axis = form.key
        nodes = list(graph.nodes())
        self.nodes = nodes
        widest = max(graph.outputs, key=lambda o: len(o.axes)).axes
        if form.e not in widest:
            raise UnsupportedConstruct(f"kernel '{graph.name}': the attention output must keep "
                                       f"'{form.e}'")
        self.rows = tuple(a for a in widest if a != form.e)
        for o in graph.outputs:
            if tuple(a for a in o.axes if a != form.e) != self.rows or form.e not in o.axes:
                raise UnsupportedConstruct(
                    f"kernel '{graph.name}': every output of an attention kernel is over the "
                    f"query rows {list(self.rows)} and '{form.e}'")
        for r in graph.reductions():
            if r not in (form.out, form.max, form.denom, *form.contractions):
                raise UnsupportedConstruct(
                    f"kernel '{graph.name}': mf.{r.attr[0]}(..., axis={r.attr[1]!r}){at(r.loc)}"
                    " is a reduction the attention schedule does not fuse (it takes the score "
                    "contractions, one softmax and the contraction with the values)")
        self.inputs, self.scalars = used_params(graph, nodes)
        self.tvars = dict(graph.dtype_vars)
        self.names, self.out_names = msl_names(graph)
        self.sizes_used: list[str] = [form.key, form.e, *self.rows]
        self.helpers: set[str] = set()
        self.epl = policy.reads_per_thread             # E elements per lane
        self.pre: list[ir.Stmt] = []
        self.pre_names: set[str] = set()

    # -- positions and loads ------------------------------------------------------------
    def row_position(self, axis: str) -> ir.Expr:
        name = f"mf_pos_{ident(axis)}"
        if name not in self.pre_names:
            k = self.rows.index(axis)
            inner = self.rows[k + 1:]
            e: ir.Expr = ir.Cast(IDX, ir.Var("mf_row"))
            if inner:
                e = e / self.span(inner)
            if k > 0:
                e = e % self.size(axis)
            self.pre.append(ir.Decl(name, IDX, e))
            self.pre_names.add(name)
        return ir.Var(name)

    def at(self, axis: str) -> ir.Expr:
        if axis == self.form.key:
            return ir.Var("mf_l")
        if axis == self.form.e:
            return ir.Cast(IDX, ir.Var("mf_e"))
        if axis in self.rows:
            return self.row_position(axis)
        raise UnsupportedConstruct(f"kernel '{self.graph.name}': axis '{axis}' is neither a "
                                   f"query-row axis, '{self.form.key}' nor '{self.form.e}'")

    def load(self, n: Node) -> ir.Expr:
        t = self.graph.tensor(n.attr)
        e: ir.Expr = ir.Lit(0, IDX)
        for i, a in enumerate(t.axes):
            e = self.at(a) if i == 0 else e * self.size(a) + self.at(a)
        return ir.Cast(compute_type(t.dtype), ir.Load(self.names[t.name], e))

    def lowering(self, prefix: str) -> ElementLowering:
        return ElementLowering(self.graph, self.load, self.at, self.size,
                               lambda s: self.names[s], prefix=prefix)

    def lanes(self, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` for each of the lane's E elements mf_e = lane + 32 j inside E."""
        e = ir.Var("mf_lane") + ir.Var("mf_j") * SIMD
        return ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(self.epl, "uint"), [
            ir.Decl("mf_e", "uint", e),
            ir.If(ir.Cast(IDX, ir.Var("mf_e")) < self.size(self.form.e), body)], unroll=True)

    # -- the kernel ---------------------------------------------------------------------
    def key_step(self) -> list[ir.Stmt]:
        """One key mf_l: its score (contractions over E: lanes, then simd_sum; then the
        score's elementwise work), then the online-softmax update of (m, d, acc)."""
        f = self.form
        out: list[ir.Stmt] = []
        score = self.lowering("mf_s")
        for i, r in enumerate(f.contractions):
            part = self.lowering(f"mf_c{i}_")
            body = part.lower([r.args[0]])
            v = part.value(r.args[0])
            acc = ir.Var(f"mf_dot{i}")
            out += [ir.Decl(acc.name, "float", ir.Lit(0.0, "float"), const=False),
                    self.lanes(body + [ir.Assign(acc, acc + _float(v, r.args[0]))]),
                    ir.Assign(acc, ir.Call("simd_sum", (acc,)))]
            self.helpers |= part.helpers
            score.values[r] = acc if compute_type(r.dtype) == "float" else ir.Cast(
                compute_type(r.dtype), acc)
        out += score.lower([f.scores])
        self.helpers |= score.helpers | {"mf_maximum"}
        s = _float(score.value(f.scores), f.scores)
        m, d = ir.Var("mf_m"), ir.Var("mf_d")
        live = ir.Var("mf_m_new").ne(NEG_INF)
        out += [
            ir.Comment("online softmax: rescale what was summed under the old max"),
            ir.Decl("mf_score", "float", s),
            ir.Decl("mf_m_new", "float", ir.Call("mf_maximum", (m, ir.Var("mf_score")))),
            ir.Decl("mf_corr", "float", ir.Select(live, ir.Call(
                "exp", (m - ir.Var("mf_m_new"),), precise=True), ir.Lit(1.0, "float"))),
            ir.Decl("mf_p", "float", ir.Select(live, ir.Call(
                "exp", (ir.Var("mf_score") - ir.Var("mf_m_new"),), precise=True),
                ir.Lit(0.0, "float"))),
            ir.Assign(d, d * ir.Var("mf_corr") + ir.Var("mf_p")),
            ir.Assign(m, ir.Var("mf_m_new"))]
        vals = self.lowering("mf_w")
        body = vals.lower([f.values])
        self.helpers |= vals.helpers
        a = ir.Lane(ir.Var("mf_acc"), ir.Var("mf_j"))
        out.append(self.lanes(body + [ir.Assign(a, a * ir.Var("mf_corr") + ir.Var("mf_p") *
                                                _float(vals.value(f.values), f.values))]))
        return out

    def epilogue(self) -> ir.Stmt:
        """The outputs at the lane's E elements: acc / d through the work after the sum."""
        f = self.form
        low = self.lowering("mf_o")
        low.values[f.out] = ir.Cast(compute_type(f.out.dtype),
                                    ir.Lane(ir.Var("mf_acc"), ir.Var("mf_j")) / ir.Var("mf_d"))
        body = low.lower([o.node for o in self.graph.outputs])
        self.helpers |= low.helpers
        for k, o in enumerate(self.graph.outputs):
            off: ir.Expr = ir.Lit(0, IDX)
            for i, a in enumerate(o.axes):
                off = self.at(a) if i == 0 else off * self.size(a) + self.at(a)
            body.append(ir.Store(self.out_names[k], off, self.out_value(k, low)))
        return self.lanes(body)

    def decode_kernel(self) -> ir.LoweredKernel:
        f = self.form
        threads = (ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),
                   ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
        step = self.key_step()
        fin = self.epilogue()
        head: list[ir.Stmt] = [
            ir.Comment("one simdgroup per query row; lane l holds E elements l, l + 32, ..."),
            ir.Decl("mf_row", "uint", ir.Var("mf_tid") / SIMD),
            ir.If(ir.Cast(IDX, ir.Var("mf_row")) >= self.span(self.rows), [ir.Return()]),
            ir.Decl("mf_m", "float", NEG_INF, const=False),
            ir.Decl("mf_d", "float", ir.Lit(0.0, "float"), const=False),
            ir.ArrayDecl("mf_acc", "float", self.epl),
            ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(self.epl, "uint"), [
                ir.Assign(ir.Lane(ir.Var("mf_acc"), ir.Var("mf_j")), ir.Lit(0.0, "float"))],
                unroll=True)]
        loop = ir.For("mf_l", IDX, ir.Lit(0, IDX), self.size(f.key),
                      [ir.Comment("key mf_l: its score, then the online-softmax update")] + step)
        body = head + self.pre + [
            ir.Comment(f"one pass over the keys along '{f.key}' (scores never stored)"), loop,
            ir.Comment("outputs: acc / d (all keys masked: 0 / 0 = NaN, as softmax gives)"),
            fin]
        summary = (f"{self.graph.name} (decode): softmax over '{f.key}' of scores contracting "
                   f"'{f.e}', times the values, summed over '{f.key}'; one simdgroup per query "
                   f"row, online softmax in one pass over the keys, fp32 state")
        return make_kernel(self.graph, self.index64, threads, body, summary, "decode",
                           params=kernel_params(self), helpers=tuple(sorted(self.helpers)))

    def build(self) -> AttentionSchedule:
        k = self.decode_kernel()
        policy = replace(self.policy, uses_simd=True)
        return AttentionSchedule("attention", self.graph, policy, k,
                                 (*self.rows, self.form.e), (), self.index64,
                                 l_axis=self.form.key, e_axis=self.form.e, rows=self.rows,
                                 max_e=SIMD_WIDTH * self.epl)


def _float(e: ir.Expr, n: Node) -> ir.Expr:
    return e if compute_type(n.dtype) == "float" else ir.Cast("float", e)
