"""The quantized matrix-vector schedule: a sum over K of values computed from packed words.

Recognised when a reduction's argument unpacks words (`mf.unpack`), as in

    y[m, n] = sum_k (unpack(wq)[n, k] * scales[n, k // GS] + biases[n, k // GS]) * x[m, k]

The matvec kernels `qmv` (one row of x) and `qmv_split` (the same with K split, for grids of
few rows: `QuantSchedule.variant`; `qmvx` and `qmvx_split` take a few rows of x). The output's
innermost axis (N, the weight rows) is split into blocks of R = `rows_per_group` rows; S
simdgroups (of one threadgroup; 1 in qmv, `k_splits` in the _split kernels) own one block at
one position of the other output axes (M), simdgroup s of them taking slice s of K. The 32
lanes of slice s walk K in chunks of C = vector_width words × values per word (16 bytes of
words: 32 4-bit values), lane l taking chunks 32 s + l, then every 32 S-th (S = 1: l, l + 32,
...):

- every load of a chunk is issued before any of its values is used: each row's chunk of
  packed words (one vector load per row) and, in the affine form below, the row's per-group
  scale and bias (GS a multiple of C: one each per chunk), into per-row register arrays, then
  the values the block's rows share (tensors without N, such as x) with 16-byte vector loads,
  so a lane has R + 1 streams of loads in flight;
- then each row unpacks every value from a register with a literal shift
  (`lower.unpack_value`) and adds the element value (the user's expression) to its fp32
  accumulator; in the affine form below each value is instead masked where it sits in its half
  word (`(word >> half) & (mask << at)`: one shift per half word, not per value), which is the
  value times 2^at. qmv keeps one sum per place at (4 for 4-bit values) for every row and
  scales each by 2^-at once per chunk (`mf_place_weight`); qmvx, whose every value serves
  several rows of x, multiplies by an x pre-scaled by 2^-at instead, as MLX's qdot does;
- a chunk that runs past K is done element by element, every load guarded; where K's derived
  dims make it a multiple of the chunk (K/GS, GS 64 > 32 values) no chunk does, and the
  kernels that do not split K have no such path (`only_whole`).

Rows past N in the last block (N not a multiple of R) repeat row N - 1 (in bounds, no branch
in the chunk loop) and are never stored. Then each row's accumulator is reduced across the
simdgroup (`simd_sum`); with S > 1 the S partials of a row meet in threadgroup memory
(`reduce.through_threadgroup`, the row schedule's simd → threadgroup → simd combine) and the
block's first simdgroup stores. Lane 0 computes and stores the outputs (the epilogue may use
the sum like any row value). Weight bytes are read once per position of the other output axes:
at M = 1 the kernel streams the packed weights once, which is what decode needs. Larger M
re-reads them (from cache) once per row of x.

Launch levers (policy "quant", all tunable): rows_per_group (x and its sum shared by more rows,
fewer simdgroups), k_splits (qmv_split's simdgroups per block: more loads in flight when rows
are few, one barrier and S partials per row more), split_grid (where the _split kernels run
instead), vector_width (words per load), threads_per_group (a multiple of 32 S; only groups
simdgroups). The kernels for several rows of x (`qmvx`, `qmm`) are described where they are
built (`affine_chunk`, schedule/qmm.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, NamedTuple, Optional

from .. import ir
from ..errors import LaunchError, UnsupportedConstruct, at
from ..graph import Graph, Node, Op, TensorParam, strip_casts, topo_order
from ..shapes import numel, size_multiple
from . import qmm, reduce
from .base import IDX, Schedule, Traffic, make_kernel
from .lower import ElementLowering, as_float, compute_type, ident
from .names import tensor_var
from .hardware import SIMD_WIDTH
from .policy import MAX_QUANT_ROWS, LaunchPolicy, access_width

SIMD = ir.Lit(SIMD_WIDTH, "uint")


def match(graph: Graph) -> Optional[Node]:
    """The reduction whose argument unpacks packed words, or None when there is none."""
    return next((r for r in graph.reductions()
                 if any(n.op == Op.UNPACK for n in topo_order([r.args[0]]))), None)


def is_quant(graph: Graph) -> bool:
    return match(graph) is not None


class _Affine(NamedTuple):
    q: Node                              # the UNPACK node
    s: Node                              # per-group scale
    b: Node                              # per-group bias
    x: Node                              # the shared factor


def build(graph: Graph, policy: LaunchPolicy, index64: bool,
          form: Optional[Node] = None) -> "QuantSchedule":
    return _Builder(graph, policy, index64).build()


@dataclass
class QuantSchedule(Schedule):
    axis: str = "K"
    rows_axis: str = "N"                 # the output's innermost axis: blocks of rows
    outer: tuple[str, ...] = ()          # every output axis but K

    chunk: int = 32                      # values per lane per chunk
    variants: dict[str, ir.LoweredKernel] = field(default_factory=dict)   # qmv (qmv_split, ...)
    m_axis: Optional[str] = None         # the rows of x that qmvx and the tiled qmm block
    x_rows: int = 1                      # rows of x per simdgroup in qmvx
    splits: dict[str, int] = field(default_factory=dict)    # simdgroups per block, per kernel

    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        return tuple(self.variants.values())

    def variant(self, sizes: Mapping[str, int]) -> str:
        """By the rows of x: qmm from qmm_min_rows on (where the kernel has one), qmvx (x_rows
        of them per simdgroup) from x_rows on, else qmv; each of the last two as its _split
        kernel where K is longer than one stretch of 32 chunks and the grid is small: qmv's
        with fewer than split_grid simdgroups per stretch each would walk (few simdgroups for
        their chains of loads), qmvx's with at most split_grid simdgroups (its simdgroups do
        x_rows times the arithmetic a load; H100, 2026-11-27: split, qmvx lost 10-25% at
        every grid of 512 simdgroups or more it was timed at, bench/README.md)."""
        m = 1 if self.m_axis is None else sizes[self.m_axis]
        if "qmm" in self.variants and m >= self.policy.qmm_min_rows:
            return "qmm"
        name = "qmvx" if "qmvx" in self.variants and m >= self.x_rows else "qmv"
        stretches = -(-sizes[self.axis] // (SIMD_WIDTH * self.chunk))
        if name == "qmvx":
            small = self.simdgroups(sizes, self.x_rows) <= self.policy.split_grid
        else:
            small = self.simdgroups(sizes, 1) < self.policy.split_grid * stretches
        return f"{name}_split" if f"{name}_split" in self.variants and stretches > 1 \
            and small else name

    def simdgroups(self, sizes: Mapping[str, int], x_rows: int) -> int:
        """Unsplit simdgroups: one per block of weight rows at each position of the other
        output axes, x_rows rows of x at once."""
        blocks = -(-sizes[self.rows_axis] // self.policy.rows_per_group)
        for a in self.outer[:-1]:
            blocks *= -(-sizes[a] // x_rows) if a == self.m_axis else sizes[a]
        return blocks

    def selecting(self, host_name: str) -> list[dict[str, int]]:
        """Sizes that make a call launch kernel `host_name` (testing's coverage): qmvx with a
        last block of x's rows that is partly past M; the _split kernels with K two stretches
        of chunks long, the others with one (rows of weights as few as testing draws); qmm
        with a tile of rows of x and of weight rows plus one each (rows past M and N) over two
        steps along K (the tiles rewritten, a step loaded ahead) and two groups or more."""
        name = next((n for n, k in self.variants.items() if k.host_name == host_name), None)
        if name is None:
            return []
        if name == "qmm":
            mult, m = size_multiple(self.graph.tensors, self.axis), self.policy.qmm_min_rows
            assert self.m_axis is not None
            return [{self.axis: -(-2 * qmm.TILE_K // mult) * mult,
                     self.rows_axis: qmm.TILE_N + 1,
                     self.m_axis: m + 1 if m % qmm.TILE_M == 0 else m}]
        stretch = SIMD_WIDTH * self.chunk
        base = name.removesuffix("_split")
        pins = ({self.axis: 2 * stretch} if name != base else
                {self.axis: stretch} if f"{name}_split" in self.variants else {})
        if self.m_axis is None:
            return [pins] if pins else []
        top = self.policy.qmm_min_rows - 1 if "qmm" in self.variants else 1 << 30
        pick = {"qmvx": max(self.x_rows, min(top, self.x_rows + 1)),
                "qmv": 1 if "qmvx" in self.variants else max(1, top)}
        return [{**pins, self.m_axis: pick[base]}]

    @property
    def thresholds(self) -> list[int]:
        """Sizes of K where the kernel's path changes: one chunk per lane across the
        simdgroup, and across the block's k_splits simdgroups (testing draws sizes at each,
        and one on either side)."""
        out = [self.chunk, SIMD_WIDTH * self.chunk]
        if max(self.splits.values(), default=1) > 1:
            out.append(self.policy.k_splits * SIMD_WIDTH * self.chunk)
        return out

    def launch(self, sizes: Mapping[str, int]) -> tuple[int, int]:
        """qmm: one group of 256 threads per tile. qmv, qmvx: a simdgroup per block of
        rows_per_group rows; the _split kernels: k_splits of them. With k_splits > 1 the grid
        is padded to whole threadgroups (the kernel has a barrier: no thread may be missing);
        the group size is a multiple of 32 x k_splits, so a block's simdgroups share one."""
        if self.variant(sizes) == "qmm":
            tiles = -(-sizes[self.rows_axis] // qmm.TILE_N)
            for a in self.outer[:-1]:
                tiles *= -(-sizes[a] // qmm.TILE_M) if a == self.m_axis else sizes[a]
            return tiles * qmm.THREADS, qmm.THREADS
        v = self.variant(sizes)
        S = self.splits.get(v, 1)
        blocks = self.simdgroups(sizes, self.x_rows if v.startswith("qmvx") else 1)
        threads = blocks * S * SIMD_WIDTH
        group = max(S * SIMD_WIDTH, min(self.policy.threads_per_group, threads))
        if S > 1:
            threads = -(-threads // group) * group
        return threads, group

    def host_name(self, sizes: Mapping[str, int]) -> str:
        # offsets stay inside each tensor: the largest one (not M x N x K) sets the width
        axes = [t.axes for t in self.graph.tensors] + [o.axes for o in self.graph.outputs]
        n: int = max(numel(ax, sizes) for ax in axes)
        if not self.index64 and max(n, sizes[self.axis]) >= 2 ** 31:
            raise LaunchError(f"kernel '{self.graph.name}': {n} elements need 64-bit "
                              f"indexing; call it with launch={{'index64': True}}")
        return self.variants[self.variant(sizes)].host_name

    def max_group_size(self, host_name: str) -> int:
        if "qmm" in self.variants and host_name == self.variants["qmm"].host_name:
            return qmm.THREADS
        return self.policy.threads_per_group

    def traffic(self, sizes: Mapping[str, int]) -> Traffic:
        """Each input read once (x once per block of rows: from cache after the first), each
        output written once: the bytes the decode kernel must move."""
        return super().traffic(sizes)


class _Builder(reduce.Builder):
    def __init__(self, graph: Graph, policy: LaunchPolicy, index64: bool):
        reds = graph.reductions()
        first = reds[0]
        if len(reds) != 1 or first.attr[0] != "sum":
            bad = next((n for n in reds if n.attr[0] != "sum"), reds[-1])
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': mf.{bad.attr[0]}(..., axis={bad.attr[1]!r})"
                f"{at(bad.loc)}: a kernel that unpacks words (mf.unpack) may reduce them with "
                f"one mf.sum; split other reductions into their own kernel")
        super().__init__(graph, policy, index64, first.attr[1], "row", "row")
        self.red = first
        if not self.outer:
            raise UnsupportedConstruct(f"kernel '{graph.name}': the quantized matvec schedule "
                                       "needs an output axis besides the reduced one")
        self.rows_axis = self.outer[-1]
        self.prefix = self.outer[:-1]
        self.packed = self._packed_inputs()
        bits = set(self.packed.values())
        if len(bits) != 1:
            raise UnsupportedConstruct(f"kernel '{graph.name}': unpacks words of different "
                                       f"widths ({sorted(bits)} bits) in one kernel")
        self.bits = bits.pop()
        self.per_word = 32 // self.bits
        self.words = policy.vector_width               # words per lane per chunk
        self.chunk = self.words * self.per_word        # values per lane per chunk
        cone = [n for n in topo_order([self.red.args[0]]) if n.op == Op.LOAD]
        self.shared = [t for t in self.inputs if any(n.attr == t.name for n in cone)
                       and t.name not in self.packed and self.rows_axis not in t.axes
                       and t.axes and t.axes[-1] == self.axis]
        self.vw = access_width(8, {t.dtype.itemsize for t in self.shared} or {4})
        while self.chunk % self.vw:
            self.vw //= 2
        # what K is a multiple of whatever the call (its derived dims: K/GS with GS 64); of the
        # chunk: every chunk is whole and aligned
        self.k_multiple = size_multiple(graph.tensors, self.axis)
        self.whole_k = self.k_multiple % self.chunk == 0
        self.mb = 1                                    # rows of x per simdgroup (per kernel)
        self.splits = 1                                # simdgroups per block (per kernel)

    def _packed_inputs(self) -> dict[str, int]:
        """{tensor: bits} of the words unpacked in the reduction; each must be a tensor
        argument with one word row per output row."""
        out: dict[str, int] = {}
        for n in topo_order([self.red.args[0]]):
            if n.op != Op.UNPACK:
                continue
            w = n.args[0]
            if w.op != Op.LOAD:
                raise UnsupportedConstruct(
                    f"mf.unpack{at(n.loc)}: the quantized matvec schedule unpacks words read "
                    "straight from a tensor argument; unpack the argument itself")
            if self.rows_axis not in w.axes:
                raise UnsupportedConstruct(
                    f"mf.unpack{at(n.loc)}: the packed tensor '{w.attr}' must have the output's "
                    f"innermost axis '{self.rows_axis}' (one row of words per output row)")
            out[w.attr] = n.attr
        return out

    # -- positions and loads (one element k of the row n) -------------------------------
    def prefix_position(self, axis: str) -> ir.Expr:
        """The simdgroup's position along an output axis other than the rows axis (with rows
        of x blocked, `x_rows`: row mf_m of x along the innermost one, the block's elsewhere)."""
        name = f"mf_pos_{ident(axis)}"
        prefix, flat = self.prefix, "mf_outer"
        if self.mb > 1:
            if axis == self.prefix[-1]:
                return ir.Var("mf_m")
            prefix, flat = self.prefix[:-1], "mf_xblock"
        return self.position_in(flat, prefix, axis, name, self.v)

    def at(self, axis: str, k: ir.Expr, run: Optional[tuple[ir.Expr, int]] = None) -> ir.Expr:
        """The position along `axis` of element k (K), of row mf_n (N), or the simdgroup's.
        `run` = (first, n): k is element mf_j of n consecutive values from `first`, a multiple
        of n (a chunk, or a word's values), so that a group or word holding them all is
        found from `first` alone."""
        if axis == self.axis:
            return k
        if axis == self.rows_axis:
            return ir.Var("mf_n")
        if self.v.name == "qmm" and axis == self.prefix[-1]:
            return ir.Var("mf_m")                      # the tiled kernel's row of x
        if axis in self.prefix:
            return self.prefix_position(axis)
        spec = self.graph.axis_spec(axis)              # K/GS: element k reads k / GS
        d = ir.Lit(spec.div, IDX)
        if run is not None and spec.div % run[1] == 0:
            return run[0] / d                          # the whole run is in one group
        if run is not None and run[1] % spec.div == 0:
            return run[0] / d + ir.Cast(IDX, ir.Var("mf_j") / ir.Lit(spec.div, "uint"))
        return k / d

    def offset(self, t: TensorParam, k: ir.Expr,
               run: Optional[tuple[ir.Expr, int]] = None) -> ir.Expr:
        e: ir.Expr = ir.Lit(0, IDX)
        for i, a in enumerate(t.axes):
            p = self.at(a, k, run)
            e = p if i == 0 else e * self.size(a) + p
        return e

    def lowering(self, fast: bool, k: Optional[ir.Expr] = None,
                 run: Optional[tuple[ir.Expr, int]] = None) -> ElementLowering:
        """Element values of the chunk's element mf_j: from registers on the fast path (shared
        values, words), from global loads on the tail path (or of element `k`; with `run`,
        element mf_j of a run of values, see `at`)."""
        if fast:
            run = (ir.Var("mf_k0"), self.chunk)
        if k is None:
            k = (ir.Var("mf_k0") if run is None else run[0]) + ir.Cast(IDX, ir.Var("mf_j"))

        def load(n: Node) -> ir.Expr:
            t = self.graph.tensor(n.attr)
            ct = compute_type(t.dtype)
            if fast and t in self.shared:
                return ir.Lane(ir.Var(tensor_var(t.name, "reg")), self.x_slot(ir.Var("mf_j")))
            if fast and t.name in self.packed:
                return self.word(t.name)
            return ir.Cast(ct, ir.Load(self.names[t.name], self.offset(t, k, run)))

        def shift(n: Node) -> ir.Expr:
            per = self.per_word
            if run is not None and run[1] % per == 0:        # runs of whole words
                slot: ir.Expr = ir.Var("mf_j") % ir.Lit(per, "uint")
            elif run is not None and per % run[1] == 0:      # runs inside one word
                slot = ir.Cast("uint", run[0] % ir.Lit(per, IDX)) + ir.Var("mf_j")
            else:
                slot = ir.Cast("uint", k % ir.Lit(per, IDX))
            return slot * ir.Lit(self.bits, "uint")

        return ElementLowering(self.graph, load, lambda a: self.at(a, k, run), self.size,
                               lambda s: self.names[s], prefix="mf_e", shift=shift)

    def x_slot(self, j: ir.Expr) -> ir.Expr:
        """Element j's register among the chunk's shared values (of row mf_i of x)."""
        return j if self.mb == 1 else ir.Var("mf_i") * ir.Lit(self.chunk, "uint") + j

    def acc(self) -> ir.Expr:
        """The sum of weight row mf_r (and row mf_i of x)."""
        r = ir.Var("mf_r")
        return ir.Lane(ir.Var("mf_acc"), r if self.mb == 1 else
                       r * ir.Lit(self.mb, "uint") + ir.Var("mf_i"))

    def each_x_row(self, body: list[ir.Stmt]) -> ir.Stmt:
        """`body` for each row mf_i of x of the simdgroup's block (unrolled)."""
        return ir.For("mf_i", "uint", ir.Lit(0, "uint"), ir.Lit(self.mb, "uint"), body,
                      unroll=True)

    def x_rows_loop(self, body: list[ir.Stmt], clamp: bool = True) -> list[ir.Stmt]:
        """`body` for each row mf_i of x of the simdgroup's block, as row mf_m (with `clamp`,
        rows past M repeat row M - 1: read in bounds, never stored); just `body` without x
        blocking."""
        if self.mb == 1:
            return body
        m: ir.Expr = ir.Var("mf_m0") + ir.Cast(IDX, ir.Var("mf_i"))
        if clamp:
            m = ir.Call("min", (m, self.size(self.prefix[-1]) - ir.Lit(1, IDX)))
        return [self.each_x_row([ir.Decl("mf_m", IDX, m)] + body)]

    def word(self, name: str) -> ir.Expr:
        """The packed word holding element mf_j of the chunk, in row mf_r's registers."""
        word = ir.Lane(ir.Var(tensor_var(name, "w")), ir.Var("mf_r"))
        return word if self.words == 1 else \
            ir.Lane(word, ir.Var("mf_j") / ir.Lit(self.per_word, "uint"))

    def element(self, fast: bool) -> list[ir.Stmt]:
        """Add element mf_j of the chunk to the row's accumulator."""
        el = self.lowering(fast)
        body = el.lower([self.red.args[0]])
        self.helpers |= el.helpers
        v = el.value(self.red.args[0])
        if compute_type(self.red.args[0].dtype) != "float":
            v = ir.Cast("float", v)
        acc = self.acc()
        return body + [ir.Assign(acc, acc + v)]

    # -- the affine form: sum_k (q_k * s + b) * x_k = s * sum q_k x_k + b * sum x_k ------
    def affine(self) -> Optional["_Affine"]:
        """The reduction's argument as (q * s + b) * x, with q the unpacked value, s and b
        per-group values of the row (over rows axis and K/GS, GS a multiple of the chunk, so
        constant over a chunk) and x a value the rows share; None for any other form."""
        def split(n: Node, op: str) -> list[tuple[Node, Node]]:
            if n.op != Op.BINARY or n.attr != op:
                return []
            a, b = n.args
            return [(a, b), (b, a)]

        for qsb, x in split(self.red.args[0], "mul"):
            for qs, b in split(qsb, "add"):
                for q, s in split(qs, "mul"):
                    q = strip_casts(q)
                    if (q.op == Op.UNPACK and self._per_group(s) and self._per_group(b)
                            and self._shared(x) and q.args[0].op == Op.LOAD):
                        return _Affine(q, s, b, x)
        return None

    def _per_group(self, n: Node) -> bool:
        """A load over the rows axis and K/GS (and other output axes), GS a multiple of C."""
        n = n.args[0] if n.op == Op.CAST else n
        if n.op != Op.LOAD or self.axis in n.axes or self.rows_axis not in n.axes:
            return False
        derived = [self.graph.axis_spec(a) for a in n.axes if a not in self.outer]
        return len(derived) == 1 and derived[0].base == self.axis and \
            derived[0].div % self.chunk == 0

    def _shared(self, n: Node) -> bool:
        """x: computed from shared tensors (registers) only, without the rows axis."""
        loads = [m for m in topo_order([n]) if m.op == Op.LOAD]
        return self.rows_axis not in n.axes and bool(loads) and all(
            self.graph.tensor(m.attr) in self.shared for m in loads) and \
            not any(m.op in (Op.UNPACK, Op.REDUCE) for m in topo_order([n]))

    def affine_chunk(self, f: "_Affine"
                     ) -> tuple[list[ir.Stmt], list[ir.Stmt], list[ir.Stmt], list[ir.Stmt]]:
        """(statements before the rows loops: x of each element and their sum over the chunk;
        register arrays for each row's scale and bias; the row's loads of its scale and bias
        into them; the rows' sums: sum q_j x_j over their words, then s * that + b * sum x)."""
        C, rows, mb = self.chunk, self.policy.rows_per_group, self.mb
        el = self.lowering(True)
        i = ir.Var("mf_i")
        xsum: ir.Expr = ir.Var("mf_xsum") if mb == 1 else ir.Lane(ir.Var("mf_xsum"), i)
        xs: list[ir.Stmt] = [ir.ArrayDecl("mf_xe", "float", mb * C)]
        xs += [ir.Decl("mf_xsum", "float", ir.Lit(0.0, "float"), const=False)] if mb == 1 else [
            ir.ArrayDecl("mf_xsum", "float", mb), self.each_x_row([ir.Assign(xsum, ir.Lit(
                0.0, "float"))])]
        xbody = el.lower([f.x])
        xv = as_float(el.value(f.x), f.x)
        xe = ir.Lane(ir.Var("mf_xe"), self.x_slot(ir.Var("mf_j")))
        # value j is unpacked masked in place in its half word (below), i.e. times 2^place:
        # qmv keeps one sum per place and scales each once per chunk; qmvx, whose values each
        # serve mb rows of x, pre-scales x_j by 2^-place instead
        places = 16 // self.bits
        j, per_half = ir.Var("mf_j"), ir.Lit(places, "uint")
        place = j % per_half * ir.Lit(self.bits, "uint")
        xbody += [ir.Assign(xe, xv if mb == 1 else xv * ir.Call("mf_place_weight", (place,))),
                  ir.Assign(xsum, xsum + xv)]
        self.helpers.add("mf_place_weight")
        xs += self.x_rows_loop([ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(C, "uint"),
                                       xbody, unroll=True)])
        self.helpers |= el.helpers
        low = self.lowering(True)
        loads = low.lower([f.s, f.b])
        self.helpers |= low.helpers
        scale, bias = ir.Var("mf_row_scale"), ir.Var("mf_row_bias")
        r = ir.Var("mf_r")
        arrays: list[ir.Stmt] = [ir.ArrayDecl(scale.name, "float", rows),
                                 ir.ArrayDecl(bias.name, "float", rows)]
        loads += [ir.Assign(ir.Lane(scale, r), as_float(low.value(f.s), f.s)),
                  ir.Assign(ir.Lane(bias, r), as_float(low.value(f.b), f.b))]
        # value j: its half word shifted down (one shift for all the half's values), the value
        # masked where it sits there, at bit mf_at; x_j holds the 2^-mf_at that undoes it
        at_bits: list[ir.Stmt] = [
            ir.Decl("mf_half", "uint", j % ir.Lit(self.per_word, "uint") / per_half
                    * ir.Lit(16, "uint")),
            ir.Decl("mf_at", "uint", place)]
        mask = ir.Lit((1 << self.bits) - 1, "uint") << ir.Var("mf_at")
        code = ir.Cast("float", (self.word(f.q.args[0].attr) >> ir.Var("mf_half")) & mask)
        acc = self.acc()
        bx = ir.Call("fma", (ir.Lane(bias, r), xsum, acc))
        if mb == 1:
            # every row's sums first, one per place (independent chains), then each row's
            # s * sum_p 2^-p sum_(j at p) q_j x_j + b * sum x. H100, 2026-11-27, 4 rows: 6.1-14.5
            # us this way, 8.3-18.6 with x pre-scaled or each row in turn (bench/README.md)
            sums = ir.Var("mf_qx")
            at_place = ir.Lane(sums, r * per_half + j % per_half)
            qx: ir.Expr = ir.Lane(sums, r * per_half)
            for p in range(1, places):
                qx = ir.Call("fma", (ir.Lane(sums, r * per_half + ir.Lit(p, "uint")), ir.Call(
                    "mf_place_weight", (ir.Lit(p * self.bits, "uint"),)), qx))
            body: list[ir.Stmt] = [
                ir.ArrayDecl("mf_qx", "float", rows * places),
                ir.For("mf_p", "uint", ir.Lit(0, "uint"), ir.Lit(rows * places, "uint"),
                       [ir.Assign(ir.Lane(sums, ir.Var("mf_p")), ir.Lit(0.0, "float"))],
                       unroll=True),
                self.rows_loop([ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(C, "uint"),
                                       at_bits + [ir.Assign(at_place, ir.Call(
                                           "fma", (code, xe, at_place)))], unroll=True)]),
                self.rows_loop([ir.Assign(acc, ir.Call("fma", (ir.Lane(scale, r), qx, bx)))])]
            return xs, arrays, loads, body
        # qmvx: each value unpacked once, used for every row of x
        qx = ir.Lane(ir.Var("mf_qx"), i)
        row = [ir.ArrayDecl("mf_qx", "float", mb),
               self.each_x_row([ir.Assign(qx, ir.Lit(0.0, "float"))]),
               ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(C, "uint"), at_bits + [
                   ir.Decl("mf_q", "float", code),
                   self.each_x_row([ir.Assign(qx, ir.Call("fma", (ir.Var("mf_q"), xe, qx)))])],
                   unroll=True),
               self.each_x_row([ir.Assign(acc, ir.Call("fma", (ir.Lane(scale, r), qx, bx)))])]
        return xs, arrays, loads, [self.rows_loop(row)]

    # -- the kernel ---------------------------------------------------------------------
    def splits_of(self, variant: str) -> int:
        """Simdgroups per block of rows in kernel `variant`: k_splits in the _split kernels, and
        in qmv too where split_grid is 0 (every call splits)."""
        always = self.policy.split_grid == 0
        return self.policy.k_splits if variant.endswith("_split") or (
            variant == "qmv" and always) else 1

    @property
    def x_rows(self) -> int:
        """Rows of x per simdgroup in qmvx: x_rows, fewer where rows_per_group x x_rows sums
        would pass MAX_QUANT_ROWS (registers)."""
        return max(1, min(self.policy.x_rows, MAX_QUANT_ROWS // self.policy.rows_per_group))

    def rows_loop(self, body: list[ir.Stmt], clamp: bool = True) -> ir.Stmt:
        """Each row mf_r of the block, as row mf_n. With `clamp`, rows past N (the last block
        of a size N that is not a multiple of rows_per_group) repeat row N - 1: they read in
        bounds and take the same branches, and their results are never stored (the stores'
        loop tests mf_n < N instead)."""
        rows = self.policy.rows_per_group
        n = ir.Var("mf_n0") + ir.Cast(IDX, ir.Var("mf_r"))
        last = self.size(self.rows_axis) - ir.Lit(1, IDX)
        decl: list[ir.Stmt] = [ir.Decl("mf_n", IDX, n if rows == 1 or not clamp else
                                       ir.Call("min", (n, last)))]
        return ir.For("mf_r", "uint", ir.Lit(0, "uint"), ir.Lit(rows, "uint"),
                      (decl if ir.mentions(body, "mf_n") else []) + body, unroll=True)

    def load_shared(self) -> list[ir.Stmt]:
        """The chunk's values of the tensors every row uses, into registers (vector loads)."""
        out: list[ir.Stmt] = []
        vw, C = self.vw, self.chunk
        for t in self.shared:
            ct, st = compute_type(t.dtype), self.in_stype(t)
            reg = ir.Var(tensor_var(t.name, "reg"))
            start = (self.offset(t, ir.Var("mf_k0"))
                     + ir.Cast(IDX, ir.Var("mf_v") * ir.Lit(vw, "uint")))
            vec = ir.Var(tensor_var(t.name, "v"))
            lane = (lambda i: ir.Call("mf_lane8", (vec, i))) if vw == 8 else \
                (lambda i: ir.Lane(vec, i))
            if vw == 8:
                self.helpers.add("mf_pack8_of")
            out += [ir.ArrayDecl(reg.name, ct, self.mb * C)] + self.x_rows_loop([
                ir.For("mf_v", "uint", ir.Lit(0, "uint"), ir.Lit(C // vw, "uint"), [
                    ir.Decl(vec.name, ir.vector_type(st, vw),
                            ir.Load(self.names[t.name], start, vw, st)),
                    ir.For("mf_l", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                        ir.Assign(ir.Lane(reg, self.x_slot(ir.Var("mf_v") * ir.Lit(vw, "uint")
                                                           + ir.Var("mf_l"))),
                                  ir.Cast(ct, lane(ir.Var("mf_l"))))],
                        unroll=True)], unroll=True)])
        return out

    def load_words(self) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
        """(one register array of packed words per packed tensor, a vector per row; the row's
        load of its chunk of words into it: one vector load)."""
        arrays: list[ir.Stmt] = []
        loads: list[ir.Stmt] = []
        wtype = ir.vector_type("uint", self.words) if self.words > 1 else "uint"
        for name in self.packed:
            t = self.graph.tensor(name)
            base = self.offset(t, ir.Var("mf_k0"))       # the chunk's first word
            arrays.append(ir.ArrayDecl(tensor_var(name, "w"), wtype, self.policy.rows_per_group))
            loads.append(ir.Assign(ir.Lane(ir.Var(tensor_var(name, "w")), ir.Var("mf_r")),
                                   ir.Load(self.names[name], base, self.words, "uint")))
        return arrays, loads

    def aligned(self) -> ir.Expr:
        """Whether every row's words and shared values start at a whole vector (else all
        chunks take the guarded element path)."""
        ok: ir.Expr = ir.Lit(True, "bool")
        for name in self.packed:
            words = self.size(self.graph.tensor(name).axes[-1])
            ok = ok.and_((words % ir.Lit(self.words, IDX)).eq(ir.Lit(0, IDX)))
        if self.shared:
            ok = ok.and_((self.size(self.axis) % ir.Lit(self.vw, IDX)).eq(ir.Lit(0, IDX)))
        return ok

    def header(self) -> list[ir.Stmt]:
        """The simdgroup's block of rows (and slice of K), the alignment test and zeroed
        accumulators."""
        rows, S = self.policy.rows_per_group, self.splits
        blocks = (self.size(self.rows_axis) + ir.Lit(rows - 1, IDX)) / ir.Lit(rows, IDX)
        sg = ir.Var("mf_tid") / SIMD                   # the simdgroup's index in the grid
        out: list[ir.Stmt] = []
        if S == 1:
            out += [ir.Comment(f"one simdgroup per block of {rows} rows of '{self.rows_axis}'"),
                    ir.Decl("mf_task", IDX, ir.Cast(IDX, sg))]
        else:
            out += [ir.Comment(f"{S} simdgroups (of one threadgroup) per block of {rows} rows of "
                               f"'{self.rows_axis}'; simdgroup mf_split of them takes slice "
                               f"mf_split of '{self.axis}'"),
                    ir.Decl("mf_task", IDX, ir.Cast(IDX, sg / ir.Lit(S, "uint"))),
                    ir.Decl("mf_split", "uint", sg % ir.Lit(S, "uint"))]
        out += [ir.Decl("mf_blocks", IDX, blocks),
                ir.Decl("mf_outer", IDX, ir.Var("mf_task") / ir.Var("mf_blocks"))]
        tasks = self.span(self.prefix)     # positions of the other output axes (qmvx: blocks)
        if self.mb > 1:
            m = self.size(self.prefix[-1])
            mb = ir.Lit(self.mb, IDX)
            out += [ir.Comment(f"and a block of {self.mb} rows of '{self.prefix[-1]}' (of x): "
                               f"rows mf_m0, ..., mf_m0 + {self.mb - 1}"),
                    ir.Decl("mf_mblocks", IDX, (m + ir.Lit(self.mb - 1, IDX)) / mb)]
            tasks = (self.span(self.prefix[:-1]) * ir.Var("mf_mblocks") if self.prefix[:-1]
                     else ir.Var("mf_mblocks"))
        if S == 1:
            out.append(ir.If(ir.Var("mf_outer") >= tasks, [ir.Return()]))
        else:
            out += [ir.Comment("the grid is padded to whole threadgroups: simdgroups past the "
                               "end skip the work but stay for the barrier"),
                    ir.Decl("mf_live", "bool", ir.Var("mf_outer") < tasks)]
        if self.mb > 1:
            out += [ir.Decl("mf_xblock", IDX, ir.Var("mf_outer") / ir.Var("mf_mblocks")),
                    ir.Decl("mf_m0", IDX, ir.Var("mf_outer") % ir.Var("mf_mblocks")
                            * ir.Lit(self.mb, IDX))]
        out += [
            ir.Decl("mf_n0", IDX, ir.Var("mf_task") % ir.Var("mf_blocks") * ir.Lit(rows, IDX)),
            *([] if self.only_whole() else [ir.Decl("mf_vec_ok", "bool", self.aligned())]),
            ir.ArrayDecl("mf_acc", "float", rows * self.mb),
            ir.For("mf_r", "uint", ir.Lit(0, "uint"), ir.Lit(rows * self.mb, "uint"), [
                ir.Assign(ir.Lane(ir.Var("mf_acc"), ir.Var("mf_r")), ir.Lit(0.0, "float"))],
                unroll=True)]
        return out

    def whole_chunk(self) -> list[ir.Stmt]:
        """A chunk inside K with aligned rows: every load of the chunk first (each row's words
        and per-group values, then the shared values), then the arithmetic, so a lane has all
        its loads in flight at once."""
        C, rows = self.chunk, self.policy.rows_per_group
        arrays, row_loads = self.load_words()
        form = self.affine()
        what = f"{self.words} packed words (one {4 * self.words}-byte load)"
        if form is not None:
            xs, sb_arrays, sb_loads, rows_body = self.affine_chunk(form)
            arrays += sb_arrays
            row_loads += sb_loads
            what += ", its group's scale and bias"
        else:
            rows_body = [self.rows_loop(self.x_rows_loop([ir.For(
                "mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(C, "uint"), self.element(True),
                unroll=True)]))]
        # the rows' loads (from memory) go out first, then the shared values (cache hits)
        out: list[ir.Stmt] = [ir.Comment(f"loads of the block's {rows} row(s), all issued before "
                                         f"any is used: per row {what}")]
        out += arrays + [self.rows_loop(row_loads)]
        out += [ir.Comment(f"values every row shares: {C} per lane, in registers")]
        out += self.load_shared()
        if form is not None:
            out += [ir.Comment("x of each element and their sum: sum_k (q s + b) x = "
                               "s sum_k q x + b sum_k x (s, b: one per group)")] + xs
        out += [ir.Comment("each row: unpack its words from registers, add to its sum")]
        return out + rows_body

    def only_whole(self) -> bool:
        """Whether the kernel has no element-by-element path: K is always a multiple of the
        chunk, and the kernel does not split K. The split kernels keep the (never taken)
        branch: without it NVRTC gave qmv_split 72 registers instead of 64 and it ran 8-13%
        slower at 4096x11008 and 4096x14336 (H100, 2026-11-28), where qmv and qmvx ran as fast
        or faster (qmvx at M = 4: 119 registers instead of 166, 7-13% faster)."""
        return self.whole_k and self.splits == 1

    def chunk_loop(self) -> ir.Stmt:
        """Lane l's chunks along K (of slice s: chunks 32 s + l, then every 32 S-th): whole
        ones fast, the rest guarded (none where K is always a multiple of the chunk)."""
        C, K, S = self.chunk, self.size(self.axis), self.splits
        first: ir.Expr = ir.Var("mf_lane")
        if S > 1:
            first = ir.Var("mf_split") * SIMD + first
        if self.only_whole():
            body = [ir.Comment(f"'{self.axis}' is a multiple of {C} (its derived dims): every "
                               "chunk is whole, in registers, unguarded")] + self.whole_chunk()
        else:
            kj = ir.Var("mf_k0") + ir.Cast(IDX, ir.Var("mf_j"))
            tail = [self.rows_loop(self.x_rows_loop([
                ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(C, "uint"),
                       [ir.If(kj < K, self.element(False))], unroll=True)]))]
            body = [ir.If(ir.Var("mf_vec_ok").and_(ir.Var("mf_k0") + ir.Lit(C, IDX) <= K),
                          [ir.Comment("a whole chunk: registers, unguarded")]
                          + self.whole_chunk(),
                          [ir.Comment("the row's end (or unaligned rows): element by element, "
                                      "guarded")] + tail)]
        loop: ir.Stmt = ir.For("mf_k0", IDX, ir.Cast(IDX, first * ir.Lit(C, "uint")), K, body,
                               step=ir.Lit(S * SIMD_WIDTH * C, IDX))
        return loop if S == 1 else ir.If(ir.Var("mf_live"), [loop])

    def store_rows(self, v: reduce.Variant) -> list[ir.Stmt]:
        """Each row's sum across the simdgroup (and across the block's simdgroups, through
        threadgroup memory); one lane computes and stores the outputs."""
        S, rows = self.splits, self.policy.rows_per_group
        red = reduce.Reduction(self.red, "sum", self.axis, 1, acc_at=self.acc())
        row_vals = v.row_values
        row_vals.values[self.red] = red.acc_ref
        outs = self.graph.outputs
        stmts = row_vals.lower([o.node for o in outs])
        stores: list[ir.Stmt] = []
        for k, o in enumerate(outs):
            off: ir.Expr = ir.Lit(0, IDX)
            for i, a in enumerate(o.axes):
                p = self.at(a, ir.Lit(0, IDX))
                off = p if i == 0 else off * self.size(a) + p
            stores.append(ir.Store(self.out_names[k], off, self.out_value(k, row_vals)))
        lane0 = ir.Var("mf_lane").eq(ir.Lit(0, "uint"))
        # rows past N (clamped to N - 1 where they load) are not stored
        real: ir.Expr = ir.Lit(True, "bool") if rows == 1 else \
            ir.Var("mf_n") < self.size(self.rows_axis)
        keep = lane0 if rows == 1 else real.and_(lane0)
        if self.mb > 1:              # rows of x past M (clamped where they load) are not stored
            keep = keep.and_(ir.Var("mf_m") < self.size(self.prefix[-1]))
        if S == 1:
            return [ir.Comment("each row: sum across the simdgroup, lane 0 stores"),
                    self.rows_loop(self.x_rows_loop(reduce.simd_combine(red)
                                                    + [ir.If(keep, stmts + stores)],
                                                    clamp=False), clamp=False)]
        # partial (simdgroup g, weight row r, row i of x) at slot (g * rows + r) * mb + i
        lane, sg, mb = ir.Var("mf_lane"), ir.Var("mf_sg"), ir.Lit(self.mb, "uint")
        at = ir.Var("mf_r") * mb + (ir.Var("mf_i") if self.mb > 1 else ir.Lit(0, "uint"))
        per_sg = ir.Lit(rows * self.mb, "uint")
        put, merge = reduce.through_threadgroup(
            v, [red], SIMD_WIDTH * rows * self.mb, sg * per_sg + at,
            (sg - ir.Var("mf_split") + lane) * per_sg + at, lane < ir.Lit(S, "uint"))
        keep = ir.Var("mf_live").and_(ir.Var("mf_split").eq(ir.Lit(0, "uint"))).and_(keep)
        def each(body: list[ir.Stmt]) -> list[ir.Stmt]:
            return [self.each_x_row(body)] if self.mb > 1 else body
        return [ir.Comment("each row: sum across the simdgroup"),
                self.rows_loop(each(reduce.simd_combine(red))),
                ir.Comment(f"across the block's {S} simdgroups: one partial per simdgroup and "
                           f"row{' (of weights and of x)' if self.mb > 1 else ''} through "
                           "threadgroup memory, then a second simd reduction"),
                ir.If(lane0, [self.rows_loop(each(put))]), ir.Barrier(),
                ir.Comment("the first simdgroup's lane 0 stores each row"),
                self.rows_loop(self.x_rows_loop(merge + [ir.If(keep, stmts + stores)],
                                                clamp=False), clamp=False)]

    def kernel(self, v: reduce.Variant) -> ir.LoweredKernel:
        if v.name == "qmm":
            w, x = qmm.factors(self) or (self.red, self.red)
            summary = (f"{self.graph.name} (qmm): y = sum over '{self.axis}' of values "
                       f"unpacked from {self.bits}-bit words times rows of "
                       f"'{self.prefix[-1]}'; tiles of {qmm.TILE_M} x {qmm.TILE_N} outputs, "
                       f"{qmm.TILE_K} values of '{self.axis}' per step staged in threadgroup "
                       f"memory (weights dequantized once per tile), "
                       + ("products as 8x8 simdgroup matrices" if self.policy.qmm_matrix else
                          f"each thread {qmm.MICRO} x {qmm.MICRO} sums in registers over a "
                          f"slice of each step")
                       + "; fp32 accumulation")
            return make_kernel(self.graph, self.index64, qmm.THREAD_INPUTS,
                               qmm.body(self, v, w, x), summary, "qmm")
        self.splits = S = self.splits_of(v.name)
        self.mb = self.x_rows if v.name.startswith("qmvx") else 1
        threads = [ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),
                   ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup")]
        if S > 1:
            threads.append(ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"))
        head, loop, finish = self.header(), self.chunk_loop(), self.store_rows(v)
        lanes = "lane l takes chunks l, l + 32, ..." if S == 1 else \
            f"lane l of slice s takes chunks 32 s + l, then every {32 * S}th,"
        body = list(v.tg_arrays) + head + v.pre + [
            ir.Comment(f"{lanes} of {self.chunk} values along '{self.axis}'"), loop, *finish]
        split = "" if S == 1 else (f", {S} simdgroups per block each summing a slice of "
                                   f"'{self.axis}' (merged through threadgroup memory)")
        xrows = "" if self.mb == 1 else (f" and {self.mb} rows of '{self.prefix[-1]}' (each "
                                         f"value unpacked once for them)")
        summary = (f"{self.graph.name} ({v.name}): y = sum over '{self.axis}' of values "
                   f"unpacked from {self.bits}-bit words; one simdgroup per "
                   f"{self.policy.rows_per_group} rows of '{self.rows_axis}'{xrows}{split}, "
                   f"{self.chunk} values per lane per chunk ({self.words} words), shared values "
                   f"in registers; fp32 accumulation")
        kernel = make_kernel(self.graph, self.index64, tuple(threads), body, summary, v.name)
        self.mb, self.splits = 1, 1
        return kernel

    def position(self, axis: str) -> ir.Expr:
        """Positions for the epilogue's row values (inside the rows loop)."""
        return self.at(axis, ir.Lit(0, IDX))

    def outer_load(self, n: Node) -> ir.Expr:
        t = self.graph.tensor(n.attr)
        return ir.Cast(compute_type(t.dtype),
                       ir.Load(self.names[t.name], self.offset(t, ir.Lit(0, IDX))))

    def build(self) -> QuantSchedule:
        tiled = qmm.factors(self) is not None
        split = self.policy.k_splits > 1
        blocked = bool(self.prefix) and self.x_rows > 1 and bool(self.shared) and (
            not split or self.policy.split_grid > 0)
        beside = split and self.policy.split_grid > 0       # the _split kernels, by size
        names = ("qmv",) + (("qmv_split",) if beside else ()) \
            + (("qmvx",) + (("qmvx_split",) if beside else ()) if blocked else ()) \
            + (("qmm",) if tiled else ())
        kernels, _, tg = self.variants(names)
        policy = replace(self.policy, uses_simd=True, vector_width=self.words,
                         threadgroup_bytes=tg)
        return QuantSchedule("quant", self.graph, policy, kernels["qmv"],
                             (*self.outer, self.axis),
                             tuple(self.packed) + tuple(t.name for t in self.shared),
                             self.index64, axis=self.axis, rows_axis=self.rows_axis,
                             outer=self.outer, chunk=self.chunk, variants=kernels,
                             m_axis=self.prefix[-1] if tiled or blocked else None,
                             x_rows=self.x_rows,
                             splits={n: self.splits_of(n) for n in names if n != "qmm"})
