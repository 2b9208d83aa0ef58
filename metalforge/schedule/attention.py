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

import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, Sequence

from .. import ir
from ..errors import LaunchError, UnsupportedConstruct, at
from ..graph import Graph, Node, Op, topo_order
from . import reduce
from .base import IDX, Schedule, Step, make_kernel
from .elementwise import kernel_params, msl_names, used_params
from .lower import ElementLowering, compute_type, ident
from .policy import SIMD_WIDTH, LaunchPolicy, validate

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
    return [m for m in topo_order([n]) if m.op == Op.REDUCE]


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


# Key blocks per query row, when launch={'key_splits': n} does not pin them: enough
# threadgroups (rows x blocks) to fill a GPU of many cores, each simdgroup of a block still
# taking at least MIN_KEYS keys (fewer and the merge costs more than the split saves).
TARGET_GROUPS = 512
MIN_KEYS = 16


@dataclass
class AttentionSchedule(Schedule):
    l_axis: str = "L"
    e_axis: str = "E"
    rows: tuple[str, ...] = ()
    max_e: int = 256
    merge: Optional[ir.LoweredKernel] = None

    @property
    def axis(self) -> str:
        """The key axis: the size testing draws boundaries of (1, 31, 32, 33, ...)."""
        return self.l_axis

    @property
    def thresholds(self) -> tuple[int, ...]:
        """Key counts where a single query row starts splitting its keys into blocks."""
        return (2 * self._per_block(),)

    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        return (self.kernel,) if self.merge is None else (self.kernel, self.merge)

    def _rows(self, sizes: Mapping[str, int]) -> int:
        n = 1
        for a in self.rows:
            n *= sizes[a]
        return n

    def _per_block(self) -> int:
        return self.policy.threads_per_group // SIMD_WIDTH * max(MIN_KEYS,
                                                                  2 * self.policy.keys_per_step)

    def splits(self, sizes: Mapping[str, int]) -> int:
        """Key blocks per query row for a call with these sizes."""
        length = sizes[self.l_axis]
        if self.policy.key_splits:
            return max(1, min(self.policy.key_splits, length))
        want = -(-TARGET_GROUPS // max(1, self._rows(sizes)))
        return max(1, min(want, length // self._per_block()))

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        tpg = self.policy.threads_per_group
        return self._rows(sizes) * self.splits(sizes) * tpg, tpg

    def steps(self, sizes: Mapping[str, int]) -> tuple[Step, ...]:
        first = (Step(self.host_name(sizes), *self.launch(sizes)),)
        if self.splits(sizes) == 1 or self.merge is None:
            return first
        threads = self._rows(sizes) * SIMD_WIDTH
        return first + (Step(self.merge.host_name, threads, min(self.policy.threads_per_group,
                                                                 threads)),)

    def scratch_floats(self, sizes: Mapping[str, int]) -> int:
        splits = self.splits(sizes)
        return 0 if splits == 1 else self._rows(sizes) * splits * (self.max_e + 2)

    def launch_value(self, name: str, sizes: Mapping[str, int]) -> int:
        if name == "key_splits":
            return self.splits(sizes)
        raise KeyError(name)

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
        n = max([self._rows(sizes) * sizes[self.e_axis], self.scratch_floats(sizes)] + [
            math.prod(sizes[a] for a in t.axes) for t in self.graph.tensors])
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
        self.kps = policy.keys_per_step                # keys a simdgroup takes at once
        self.pre: list[ir.Stmt] = []
        self.pre_names: set[str] = set()
        self.params: tuple[ir.Argument, ...] = ()
        self.staged: dict[Node, ir.Expr] = {}
        self.tg_bytes = 0

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

    def slots(self, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` for each of the lane's E slots mf_j < reads_per_thread (unrolled)."""
        return ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(self.epl, "uint"), body,
                      unroll=True)

    def each_key(self, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` for each key mf_u < keys_per_step of a step (unrolled)."""
        return ir.For("mf_u", "uint", ir.Lit(0, "uint"), ir.Lit(self.kps, "uint"), body,
                      unroll=True)

    def lanes(self, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` for each of the lane's E elements mf_e = lane + 32 j inside E."""
        e = ir.Var("mf_lane") + ir.Var("mf_j") * SIMD
        return self.slots([
            ir.Decl("mf_e", "uint", e),
            ir.If(ir.Cast(IDX, ir.Var("mf_e")) < self.size(self.form.e), body)])

    # -- the kernel ---------------------------------------------------------------------
    def stage(self) -> list[ir.Stmt]:
        """Register staging of what the score contractions read that does not change with the
        key (the query row's q): each lane loads its E elements once, before the key loop,
        into `mf_staged<i>[j]`; `key_step` reads them from there."""
        f = self.form
        self.staged = {}
        nodes: list[Node] = []
        for r in f.contractions:
            cone = topo_order([r.args[0]])
            fixed = {n for n in cone if f.key not in n.axes and f.e in n.axes}
            nodes += [n for n in cone if n in fixed and n not in nodes and not any(
                n in u.args for u in cone if u in fixed)]
        out: list[ir.Stmt] = []
        for i, n in enumerate(nodes):
            low = self.lowering(f"mf_st{i}_")
            body = low.lower([n])
            self.helpers |= low.helpers
            name = f"mf_staged{i}"
            out += [ir.ArrayDecl(name, compute_type(n.dtype), self.epl),
                    self.lanes(body + [ir.Assign(ir.Lane(ir.Var(name), ir.Var("mf_j")),
                                                 low.value(n))])]
            self.staged[n] = ir.Lane(ir.Var(name), ir.Var("mf_j"))
        if out:
            out.insert(0, ir.Comment("the query row's values each key multiplies, in registers"))
        return out

    def keys(self, body: list[ir.Stmt], past: Sequence[ir.Stmt] = ()) -> ir.Stmt:
        """`body` for each key mf_l = mf_base + u of the block (u < keys_per_step) inside the
        simdgroup's keys; `past` for the block's keys past the end."""
        return self.each_key([
            ir.Decl("mf_l", IDX, ir.Var("mf_base") + ir.Cast(IDX, ir.Var("mf_u"))),
            ir.If(ir.Var("mf_l") < ir.Var("mf_l1"), body, list(past))])

    def key_step(self) -> list[ir.Stmt]:
        """A block of keys_per_step keys mf_base, mf_base + 1, ...: their scores
        (contractions over E: each lane's part for every key first, so that all their loads
        are in flight at once; then simd_sum; then the score's elementwise work), then one
        online-softmax update of (m, d, acc) for the whole block."""
        f = self.form
        u = ir.Var("mf_u")
        out: list[ir.Stmt] = [ir.Comment("the block's scores: each lane's part of every "
                                         "contraction (loads), then across the simdgroup")]
        score = self.lowering("mf_s")
        for i, r in enumerate(f.contractions):
            part = self.lowering(f"mf_c{i}_")
            part.values.update(self.staged)
            body = part.lower([r.args[0]])
            v = part.value(r.args[0])
            dot = ir.Lane(ir.Var(f"mf_dot{i}"), u)
            out += [ir.ArrayDecl(f"mf_dot{i}", "float", self.kps),
                    self.each_key([
                        ir.Assign(dot, ir.Lit(0.0, "float"))]),
                    self.keys([self.lanes(body + [ir.Assign(dot, dot + _float(v, r.args[0]))])]),
                    self.each_key([
                        ir.Assign(dot, ir.Call("simd_sum", (dot,)))])]
            self.helpers |= part.helpers
            score.values[r] = dot if compute_type(r.dtype) == "float" else ir.Cast(
                compute_type(r.dtype), dot)
        sc = ir.Lane(ir.Var("mf_sc"), u)
        body = score.lower([f.scores])
        self.helpers |= score.helpers | {"mf_maximum"}
        out += [ir.ArrayDecl("mf_sc", "float", self.kps),
                self.keys(body + [ir.Assign(sc, _float(score.value(f.scores), f.scores))],
                          [ir.Assign(sc, NEG_INF)])]
        m, d, m_new, corr = (ir.Var(n) for n in ("mf_m", "mf_d", "mf_m_new", "mf_corr"))
        live = m_new.ne(NEG_INF)
        p = ir.Lane(ir.Var("mf_p"), u)
        out += [
            ir.Comment("online softmax: the block's max, what was summed under the old max "
                       "rescaled, the block's weights p added"),
            ir.Decl("mf_m_new", "float", m, const=False),
            self.each_key([ir.Assign(m_new, ir.Call("mf_maximum", (m_new, sc)))]),
            ir.Decl("mf_corr", "float", ir.Select(live, ir.Call(
                "exp", (m - m_new,), precise=True), ir.Lit(1.0, "float"))),
            ir.Assign(d, d * corr),
            ir.ArrayDecl("mf_p", "float", self.kps),
            self.each_key([ir.Assign(p, ir.Select(live, ir.Call("exp", (sc - m_new,), precise=True),
                                         ir.Lit(0.0, "float"))),
                  ir.Assign(d, d + p)]),
            ir.Assign(m, m_new)]
        vals = self.lowering("mf_w")
        body = vals.lower([f.values])
        self.helpers |= vals.helpers
        a = ir.Lane(ir.Var("mf_acc"), ir.Var("mf_j"))
        out += [
            ir.Comment("the values: acc = acc * corr + sum of p v over the block"),
            self.slots([
                ir.Assign(a, a * corr)]),
            self.keys([self.lanes(body + [ir.Assign(a, a + p * _float(
                vals.value(f.values), f.values))])])]
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

    # -- online-softmax states: one per simdgroup, merged --------------------------------
    def state(self) -> list[ir.Stmt]:
        """An empty online-softmax state: m = -inf, d = 0, acc = 0."""
        return [ir.Decl("mf_m", "float", NEG_INF, const=False),
                ir.Decl("mf_d", "float", ir.Lit(0.0, "float"), const=False),
                ir.ArrayDecl("mf_acc", "float", self.epl),
                self.slots([
                    ir.Assign(ir.Lane(ir.Var("mf_acc"), ir.Var("mf_j")), ir.Lit(0.0, "float"))])]

    def reset(self) -> list[ir.Stmt]:
        """The state emptied again (after it was shared)."""
        return [ir.Assign(ir.Var("mf_m"), NEG_INF),
                ir.Assign(ir.Var("mf_d"), ir.Lit(0.0, "float")),
                self.slots([
                    ir.Assign(ir.Lane(ir.Var("mf_acc"), ir.Var("mf_j")), ir.Lit(0.0, "float"))])]

    def merge_states(self, count: ir.Expr, m_of: Callable[[ir.Expr], ir.Expr],
                     d_of: Callable[[ir.Expr], ir.Expr],
                     acc_of: Callable[[ir.Expr, ir.Expr], ir.Expr],
                     declare: bool = True) -> list[ir.Stmt]:
        """(m, d, acc) = the merge of `count` states s (m_of(s), d_of(s), acc_of(s, e)): the
        largest max M, then d = sum d_s c_s and acc = sum acc_s c_s with c_s = exp(m_s - M)
        (0 for an empty state, m_s = -inf; NaN in any state makes the result NaN)."""
        s = ir.Var("mf_s")
        c = ir.Var("mf_c")
        acc = ir.Lane(ir.Var("mf_acc"), ir.Var("mf_j"))
        lane_e = ir.Var("mf_lane") + ir.Var("mf_j") * SIMD
        return (self.state() if declare else self.reset()) + [
            ir.For("mf_s", "uint", ir.Lit(0, "uint"), count, [
                ir.Assign(ir.Var("mf_m"), ir.Call("mf_maximum", (ir.Var("mf_m"), m_of(s))))]),
            ir.For("mf_s", "uint", ir.Lit(0, "uint"), count, [
                ir.Decl("mf_ms", "float", m_of(s)),
                ir.Decl("mf_c", "float", ir.Select(ir.Var("mf_ms").ne(NEG_INF), ir.Call(
                    "exp", (ir.Var("mf_ms") - ir.Var("mf_m"),), precise=True),
                    ir.Lit(0.0, "float"))),
                ir.Assign(ir.Var("mf_d"), ir.Var("mf_d") + d_of(s) * c),
                self.slots([ir.Assign(acc, acc + acc_of(s, lane_e) * c)])])]

    # -- the kernels ----------------------------------------------------------------------
    def decode_kernel(self) -> ir.LoweredKernel:
        """A threadgroup per (query row, block of keys): its simdgroups take turns over the
        block's keys, each keeping an online-softmax state; the states merge through
        threadgroup memory; one block per row writes the outputs, several write partial
        states for the merge kernel."""
        f = self.form
        nsg = self.policy.threads_per_group // SIMD_WIDTH
        emax = SIMD_WIDTH * self.epl
        threads = (ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
                   ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"),
                   ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
        self.pre, self.pre_names = [], set()
        staged = self.stage()
        step = self.key_step()
        fin = self.epilogue()
        splits, length = ir.Var("mf_splits"), self.size(f.key)
        chunk = (length + ir.Cast(IDX, splits) - ir.Lit(1, IDX)) / ir.Cast(IDX, splits)
        tg: list[ir.Stmt] = [ir.ArrayDecl("mf_tg_m", "float", nsg, "threadgroup"),
                             ir.ArrayDecl("mf_tg_d", "float", nsg, "threadgroup"),
                             ir.ArrayDecl("mf_tg_acc", "float", nsg * emax, "threadgroup")]
        self.tg_bytes = 4 * nsg * (2 + emax)
        lane_e = ir.Var("mf_lane") + ir.Var("mf_j") * SIMD
        partial = ir.Var("mf_partial")
        head: list[ir.Stmt] = [
            ir.Comment(f"threadgroup: query row mf_row, keys [mf_l0, mf_l1) of block mf_block; "
                       f"its {nsg} simdgroups take turns over steps of {self.kps} keys; lane l "
                       f"holds E elements l, l + 32, ..."),
            ir.Decl("mf_row", "uint", ir.Var("mf_group") / splits),
            ir.Decl("mf_block", "uint", ir.Var("mf_group") % splits),
            ir.If(ir.Cast(IDX, ir.Var("mf_row")) >= self.span(self.rows), [ir.Return()]),
            ir.Decl("mf_l0", IDX, ir.Cast(IDX, ir.Var("mf_block")) * chunk),
            ir.Decl("mf_l1", IDX, ir.Call("min", (ir.Var("mf_l0") + chunk, length)))]
        loop = ir.For("mf_base", IDX, ir.Var("mf_l0") + ir.Cast(IDX, ir.Var("mf_sg") *
                                                                ir.Lit(self.kps, "uint")),
                      ir.Var("mf_l1"), step, step=ir.Lit(nsg * self.kps, IDX))
        share: list[ir.Stmt] = [
            ir.Comment("merge the simdgroups' states through threadgroup memory"),
            ir.If(ir.Var("mf_lane").eq(ir.Lit(0, "uint")), [
                ir.Assign(ir.Lane(ir.Var("mf_tg_m"), ir.Var("mf_sg")), ir.Var("mf_m")),
                ir.Assign(ir.Lane(ir.Var("mf_tg_d"), ir.Var("mf_sg")), ir.Var("mf_d"))]),
            self.slots([
                ir.Assign(ir.Lane(ir.Var("mf_tg_acc"), ir.Var("mf_sg") * ir.Lit(emax, "uint")
                                  + lane_e), ir.Lane(ir.Var("mf_acc"), ir.Var("mf_j")))]),
            ir.Barrier(),
            ir.If(ir.Var("mf_sg").ne(ir.Lit(0, "uint")), [ir.Return()]),
            ir.Comment("simdgroup 0: the group's state, then outputs or a partial state")]
        share += self.merge_states(
            ir.Lit(nsg, "uint"),
            lambda s: ir.Lane(ir.Var("mf_tg_m"), s), lambda s: ir.Lane(ir.Var("mf_tg_d"), s),
            lambda s, e: ir.Lane(ir.Var("mf_tg_acc"), s * ir.Lit(emax, "uint") + e),
            declare=False)
        share.append(ir.If(splits.eq(ir.Lit(1, "uint")), [
            ir.Comment("one block: outputs = acc / d (all keys masked: 0 / 0 = NaN, as softmax "
                       "gives)"), fin], [
            ir.Comment("several blocks: this block's state (m, d, acc[E]) for the merge kernel"),
            ir.Decl("mf_partial", IDX, ir.Cast(IDX, ir.Var("mf_group")) * ir.Lit(emax + 2, IDX)),
            ir.If(ir.Var("mf_lane").eq(ir.Lit(0, "uint")), [
                ir.Store("mf_scratch", partial, ir.Var("mf_m")),
                ir.Store("mf_scratch", partial + ir.Lit(1, IDX), ir.Var("mf_d"))]),
            self.slots([
                ir.Store("mf_scratch", partial + ir.Lit(2, IDX) + ir.Cast(IDX, lane_e),
                         ir.Lane(ir.Var("mf_acc"), ir.Var("mf_j")))])]))
        scan: list[ir.Stmt] = [ir.Comment(f"one pass over the block's keys along '{f.key}' "
                                          f"(scores never stored)"), loop]
        body = head + self.pre + staged + self.state() + scan + share
        summary = (f"{self.graph.name} (decode): softmax over '{f.key}' of scores contracting "
                   f"'{f.e}', times the values, summed over '{f.key}'; a threadgroup per query "
                   f"row and block of keys, {nsg} simdgroups over the keys, online softmax in "
                   f"one pass, fp32 state")
        return make_kernel(self.graph, self.index64, threads, tg + body, summary, "decode",
                           params=self.params, helpers=tuple(sorted(self.helpers)))

    def merge_kernel(self) -> ir.LoweredKernel:
        """One simdgroup per query row: the merge of its blocks' states, then the outputs."""
        emax = SIMD_WIDTH * self.epl
        threads = (ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),
                   ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup"))
        self.pre, self.pre_names = [], set()
        fin = self.epilogue()
        splits = ir.Var("mf_splits")
        base = ir.Cast(IDX, ir.Var("mf_row")) * ir.Cast(IDX, splits)

        def at(s: ir.Expr, k: ir.Expr) -> ir.Expr:
            return ir.Load("mf_scratch", (base + ir.Cast(IDX, s)) * ir.Lit(emax + 2, IDX) + k)
        head: list[ir.Stmt] = [
            ir.Comment("one simdgroup per query row; lane l holds E elements l, l + 32, ..."),
            ir.Decl("mf_row", "uint", ir.Var("mf_tid") / SIMD),
            ir.If(ir.Cast(IDX, ir.Var("mf_row")) >= self.span(self.rows), [ir.Return()])]
        merged = self.merge_states(
            splits, lambda s: at(s, ir.Lit(0, IDX)), lambda s: at(s, ir.Lit(1, IDX)),
            lambda s, e: at(s, ir.Lit(2, IDX) + ir.Cast(IDX, e)))
        body = head + self.pre + [ir.Comment("merge the row's key blocks (m, d, acc[E])")] + \
            merged + [ir.Comment("outputs: acc / d (all keys masked: 0 / 0 = NaN)"), fin]
        summary = (f"{self.graph.name} (merge): the online-softmax states of a query row's key "
                   f"blocks merged, then the outputs; one simdgroup per query row")
        return make_kernel(self.graph, self.index64, threads, body, summary, "merge",
                           params=self.params, helpers=tuple(sorted(self.helpers)))

    def build(self) -> AttentionSchedule:
        base = kernel_params(self)
        extra = [ir.Argument("mf_scratch", len(base), "buffer", "float", ("scratch",), True),
                 ir.Argument("mf_splits", len(base) + 1, "scalar", "uint",
                             ("launch", "key_splits"), cast="int32")]
        self.params = base + tuple(extra)
        self.helpers.add("mf_maximum")
        decode = self.decode_kernel()
        merge = self.merge_kernel()
        policy = replace(self.policy, uses_simd=True, threadgroup_bytes=self.tg_bytes)
        validate(policy)
        return AttentionSchedule("attention", self.graph, policy, decode,
                                 (*self.rows, self.form.e), (), self.index64,
                                 l_axis=self.form.key, e_axis=self.form.e, rows=self.rows,
                                 max_e=SIMD_WIDTH * self.epl, merge=merge)


def _float(e: ir.Expr, n: Node) -> ir.Expr:
    return e if compute_type(n.dtype) == "float" else ir.Cast("float", e)
