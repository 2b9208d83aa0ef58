"""The row kernels' builder (see the package docstring)."""
from __future__ import annotations

from dataclasses import replace
from typing import AbstractSet, Callable, Iterable

from ... import ir
from ...errors import UnsupportedConstruct, at
from ...graph import Graph, Node, Op, TensorParam, take_sites, topo_order
from ..base import IDX, make_kernel
from ..lower import ElementLowering, compute_type
from ..names import tensor_var
from ..hardware import MAX_THREADGROUP_BYTES, SIMD_WIDTH
from ..policy import LaunchPolicy
from .. import gather, reduce
from .plan import (LANES, VARIANTS, WHOLE, RowSchedule, group_limit, group_threads,
                   reads_for, vector_width_for)


def build(graph: Graph, policy: LaunchPolicy, index64: bool) -> RowSchedule:
    return _Builder(graph, policy, index64).build()


class _Builder(reduce.Builder):
    def __init__(self, graph: Graph, policy: LaunchPolicy, index64: bool):
        reds = graph.reductions()
        axes = list(dict.fromkeys(n.attr[1] for n in reds))
        if len(axes) != 1:
            n = next(n for n in reds if n.attr[1] == axes[1])
            raise UnsupportedConstruct(
                f"kernel '{graph.name}': reductions over several axes ({', '.join(axes)}) in one "
                f"kernel{at(n.loc)}; a row-reduction kernel reduces one axis")
        super().__init__(graph, policy, index64, axes[0], "row", "row")
        for n in self.nodes:
            if n.op == Op.REDUCE and any(a not in self.allowed for a in n.axes):
                raise UnsupportedConstruct(f"mf.{n.attr[0]}{at(n.loc)}: unexpected axes")
        self.itemsizes = ({t.dtype.itemsize for t in self.inputs if self.axis in t.axes} |
                          {o.dtype.itemsize for o in graph.outputs if self.axis in o.axes}
                          or {4})
        self.itemsize = max(self.itemsizes)
        self.reads = self.vw = 1             # the variant's (set per kernel)
        self.staged: dict[str, int] = {}     # staged variant: input → first slot staged
        self.stage_plan: dict[str, int] = {}  # the staged kernel's `staging()`, if it is built
        self.interleaved = False              # the variant's `slot_pos` layout (set per kernel)
        self.strided = False                  # ... and whether unaligned rows spread its slots
        self.kept: dict[Node, str] = {}      # the register variants' `kept_values`
        self.early: list[int] = []           # ... and `early_outputs`
        self.fresh: set[str] = set()         # inputs the section being built loads
        self.own_slots: dict[Node, int] = {}  # the section's gathers from own registers
        # variant → the gathers some section loads from global memory
        self.loaded_gathers: dict[str, set[int]] = {v: set() for v in VARIANTS}

    # -- per-row offsets (declared in the row preamble on first use) --------------------
    def row_base(self, name: str, axes: tuple[str, ...]) -> ir.Expr:
        """Offset of this row's first element in a tensor/output with these axes."""
        var = f"mf_row_{name}"
        if var not in self.v.pre_names:
            ra = tuple(a for a in axes if a != self.axis)
            if ra == self.outer:
                e: ir.Expr = ir.Cast(IDX, ir.Var("mf_row"))
            elif not ra:
                e = ir.Lit(0, IDX)
            else:
                e = self.position(ra[0])
                for a in ra[1:]:
                    e = e * self.size(a) + self.position(a)
            if self.axis in axes and ra:
                e = e * self.size(self.axis)
            self.v.pre.append(ir.Decl(var, IDX, e))
            self.v.pre_names.add(var)
        return ir.Var(var)

    # -- lowering callbacks --------------------------------------------------------------
    def outer_load(self, n: Node) -> ir.Expr:
        t = self.graph.tensor(n.attr)
        return ir.Cast(compute_type(t.dtype), ir.Load(self.names[t.name],
                                                self.row_base(self.names[t.name], t.axes)))

    def el_position(self, axis: str) -> ir.Expr:
        return ir.Var("mf_pos") if axis == self.axis else self.position(axis)

    def gather(self, n: Node, pos: ir.Expr) -> ir.Expr:
        """A gathered element (mf.take) of this element: from this thread's own registers
        where the index provably stays in its block of R (`own_slots`: slot k ^ c), else a
        guarded global load (the row's other elements sit in other threads' registers), from
        cache for a row just read. Gathers fetched by simd shuffles never get here: their
        values are set before the element loop (`shuffle_block`)."""
        name, axis = n.attr
        if n in self.own_slots:
            c = self.own_slots[n]
            k: ir.Expr = ir.Var("mf_k")
            return self.reg_value(name, k ^ ir.Lit(c, "uint") if c else k)
        t = self.graph.tensor(name)
        e: ir.Expr = ir.Lit(0, IDX)
        for i, a in enumerate(t.axes):
            p = pos if a == axis else ir.Cast(IDX, self.el_position(a))
            e = p if i == 0 else e * self.size(a) + p
        return ir.Cast(compute_type(t.dtype), ir.Load(self.names[name], e))

    # -- register blocks -----------------------------------------------------------------
    def reg(self, name: str) -> str:
        """A tensor's register block (after its MSL name: never an output's, mf_reg_mf_out)."""
        return f"mf_reg_{self.names[name]}"

    def reg_type(self, t: TensorParam) -> str:
        """The type of a tensor's register block: the tensor's own for floats (a half or bfloat
        row, converted to fp32 where used: half the space in Apple's 16-bit registers; on the
        H100 f16 rms_norm 4096x8192 went from 88 to 97% of copy bandwidth, bench/README.md),
        the compute type otherwise."""
        ct = compute_type(t.dtype)
        return self.in_stype(t) if ct == "float" else ct

    def reg_value(self, name: str, k: ir.Expr) -> ir.Expr:
        """Slot k of a tensor's register block, in its compute type (in the staged variant,
        slots from `staged[name]` on are in threadgroup memory)."""
        t = self.graph.tensor(name)
        ct, rt = compute_type(t.dtype), self.reg_type(t)
        slot: ir.Expr = ir.Lane(ir.Var(self.reg(name)), k)
        if name in self.staged and name not in self.fresh:
            vw, st = ir.Lit(self.vw, "uint"), self.in_stype(t)
            first = ir.Lit(self.staged[name] // self.vw, "uint")
            # copied out of threadgroup memory (mf_lane8 takes a thread-space reference)
            chunk = ir.Cast(ir.vector_type(st, self.vw), ir.Load(
                self.stage(name), self.stage_chunk(k / vw - first) * vw, self.vw, st,
                space="threadgroup"))
            slot = ir.Select(k < ir.Lit(self.staged[name], "uint"), slot, self.lane(chunk, k % vw))
        return slot if rt == ct else ir.Cast(ct, slot)

    def most_threads(self) -> int:
        """Threads of the staged kernel's longest row (what its threadgroup arrays hold)."""
        return group_threads(self.policy, self.itemsize, group_limit(self.policy, self.itemsize))

    def stage(self, name: str) -> str:
        return f"mf_stage_{name}"

    def staging(self, reds: list[reduce.Reduction]) -> dict[str, int]:
        """The staged variant's split: {input: S} for the inputs phase 1 loads, in order, whose
        slots S..R-1 (the second half of the thread's block, whole vector chunks) fit in half
        of the threadgroup memory at the most threads a group row takes (float types only:
        their blocks keep the storage type), of those a later section reads (not only through
        kept values). Empty when the block is a single chunk."""
        p = self.policy
        reads = reads_for(p, "staged", self.itemsize)
        vw = vector_width_for(p, "staged", self.itemsizes)
        split = reads // vw // 2 * vw
        if vw < 2 or not split:
            return {}
        threads = self.most_threads()
        first = [r.arg for r in reds if r.phase == 0 and r.online_max is None]
        later = [r.arg for r in reds if r.phase > 0] + [o.node for o in self.graph.outputs]
        made = self.element_nodes(first)
        kept = [n for n in self.kept if n in made]
        read = set(self.cone(later, kept)[0])          # read again after phase 1
        out: dict[str, int] = {}
        room = MAX_THREADGROUP_BYTES // 2
        for name in self.cone(first)[0]:
            if name not in read:
                continue
            t = self.graph.tensor(name)
            need = (reads - split) * threads * t.dtype.itemsize
            if compute_type(t.dtype) == "float" and need <= room:
                out[name] = split
                room -= need
        return out

    def load_block(self, tensors: list[str], declare: bool) -> list[ir.Stmt]:
        """Fill mf_reg_<t>[R] with this thread's R elements of each tensor (guarded). The
        staged kernel takes only rows of whole blocks (`RowSchedule.stages`), so its loads are
        all whole vectors; a staged tensor's chunks from slot S on also go to threadgroup
        memory (`stage_chunk`), where the later phases read them."""
        reads, vw = self.reads, self.vw
        base, c, k = ir.Var("mf_base"), ir.Var("mf_c"), ir.Var("mf_k")
        staged = [n for n in tensors if n in self.staged]
        where = (f"; of {', '.join(staged)}, elements {self.staged[staged[0]]} on also into "
                 f"threadgroup memory, where later phases read them" if staged else "")
        out: list[ir.Stmt] = [ir.Comment(f"load {reads} elements per thread of "
                                         f"{', '.join(tensors)} into registers{where}")]
        vec: list[ir.Stmt] = []
        sca: list[ir.Stmt] = []
        for name in tensors:
            t = self.graph.tensor(name)
            ct, st, rt = compute_type(t.dtype), self.in_stype(t), self.reg_type(t)
            rb = self.row_base(self.names[name], t.axes)
            held = self.staged.get(name, reads)            # slots only in registers
            arr, got = ir.Var(self.reg(name)), ir.Var(tensor_var(name, "v"))
            if declare:
                out.append(ir.ArrayDecl(arr.name, rt, reads))
            start = rb + ir.Cast(IDX, base) + c * self.chunk_step()
            load = ir.Decl(got.name, ir.vector_type(st, vw),
                           ir.Load(self.names[name], start, vw, st))
            to_regs = ir.For("mf_l", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"), [
                ir.Assign(ir.Lane(arr, c * ir.Lit(vw, "uint") + ir.Var("mf_l")),
                          self.fill(self.lane(got, ir.Var("mf_l")), st, rt))], unroll=True)
            vec.append(ir.For("mf_c", "uint", ir.Lit(0, "uint"), ir.Lit(held // vw, "uint"),
                              [load, to_regs], unroll=True))
            sca.append(ir.Assign(ir.Lane(arr, k), ir.Select(
                self.slot_pos(k) < self.size(self.axis),
                self.fill(ir.Load(self.names[name], rb + ir.Cast(IDX, self.slot_pos(k))), st, rt),
                self.fill(ir.Lit(0.0 if ct == "float" else 0, ct), ct, rt))))
            if held < reads:
                stage = self.stage(name)
                if declare:
                    chunk_bytes = vw * t.dtype.itemsize
                    self.v.tg_arrays.append(ir.ArrayDecl(
                        f"{stage}_mem", "float4", -(-(reads - held) // vw * chunk_bytes *
                                                    self.most_threads() // 16),
                        "threadgroup"))
                    out.append(ir.Decl(stage, f"threadgroup {st}*", ir.Call(
                        f"reinterpret_cast<threadgroup {st}*>", (ir.Var(f"{stage}_mem"),)),
                        const=False))
                at = self.stage_chunk(c - ir.Lit(held // vw, "uint")) * ir.Lit(vw, "uint")
                vec.append(ir.For("mf_c", "uint", ir.Lit(held // vw, "uint"),
                                  ir.Lit(reads // vw, "uint"), [load, to_regs, ir.Store(
                                      stage, at, got, vw, st, space="threadgroup")],
                                  unroll=True))
        scalar: list[ir.Stmt] = [ir.For("mf_k", "uint", ir.Lit(0, "uint"),
                                        ir.Lit(reads, "uint"), sca, unroll=True)]
        if self.v.name in WHOLE:
            out += [ir.Comment(f"{vw}-wide vector loads (rows of whole blocks)")] + vec
        elif vw > 1:
            # registers a lane past the row's end skips are never read, except as the values it
            # offers to a row gather's shuffles: zeros there
            tail = [ir.Comment("row tail or unaligned rows: scalar, guarded")] + scalar
            out.append(ir.If(self.full(), [ir.Comment(f"{vw}-wide vector loads")] + vec,
                             tail if self.row_gathers() else self.holding(tail)))
        else:
            out += scalar
        return out

    def slot_pos(self, k: ir.Expr) -> ir.Expr:
        """Row position of slot k of this thread's block: mf_base + k; in a `strided` kernel
        mf_first + k * mf_step (`placement`); in an `interleaved` one (chunk c of the row's lane
        t at (c * mf_w + t) * vw) mf_base + k / vw * mf_stride + k % vw (mf_base = t * vw,
        mf_stride = mf_w * vw)."""
        if self.strided:
            return ir.Var("mf_first") + k * ir.Var("mf_step")
        if not self.interleaved:
            return ir.Var("mf_base") + k
        vw = ir.Lit(self.vw, "uint")
        return ir.Var("mf_base") + k / vw * ir.Var("mf_stride") + k % vw

    def placement(self, first: ir.Expr, span: ir.Expr) -> list[ir.Stmt]:
        """Where a `strided` kernel's thread holds its slots (after mf_base and mf_vec_ok):
        contiguously from mf_base in rows that are a multiple of the vector width; in the
        others, which move element by element, slot k at first + k * span, the row's threads
        side by side in each slot, so that a simdgroup's access is one contiguous span instead
        of touching a 32-byte sector a thread (H100, f16 softmax: 4096x4097 175 -> 36 µs, rows
        of 4098 64 µs in 4-byte vectors, 8192x101 6.5 -> 3.9 µs). mf_last: the last slot's
        position."""
        if not self.strided:
            return []
        ok, one = ir.Var("mf_vec_ok"), ir.Lit(1, "uint")
        return [ir.Decl("mf_first", "uint", ir.Select(ok, ir.Var("mf_base"), first)),
                ir.Decl("mf_step", "uint", ir.Select(ok, one, span)),
                ir.Decl("mf_last", "uint", self.slot_pos(ir.Lit(self.reads - 1, "uint")))]

    def chunk_step(self) -> ir.Expr:
        """How far apart along the row a thread's vector chunks start (see `slot_pos`)."""
        return ir.Cast(IDX, ir.Var("mf_stride")) if self.interleaved else ir.Lit(self.vw, IDX)

    def row_gathers(self) -> bool:
        """Whether the graph gathers along the row (their register and shuffle paths assume each
        lane's block is contiguous)."""
        return any(n.op == Op.TAKE and n.attr[1] == self.axis for n in self.nodes)

    @staticmethod
    def stage_chunk(i: ir.Expr) -> ir.Expr:
        """Staged variant: where chunk i of this thread's staged slots sits in threadgroup
        memory, in chunks: chunk-major over the group's threads (16-byte accesses, one chunk
        a thread, side by side)."""
        return i * ir.Var("mf_tpg") + ir.Var("mf_t")

    @staticmethod
    def fill(e: ir.Expr, frm: str, rt: str) -> ir.Expr:
        """A value of type `frm` as a register slot of type `rt`."""
        return e if rt == frm else ir.Cast(rt, e)

    def lane(self, v: ir.Expr, i: ir.Expr) -> ir.Expr:
        """Element i of a loaded vector (an mf_pack8 through its helper)."""
        return ir.Call("mf_lane8", (v, i)) if self.vw == 8 else ir.Lane(v, i)

    def holding(self, tail: list[ir.Stmt]) -> list[ir.Stmt]:
        """A lane's row-end path (each element checked), run only where the lane holds part of
        the row: a lane wholly past its end skips it instead of stepping through its checks
        (D = 96 at 8 a lane leaves 4 of a row's 16 lanes empty; on the H100 f16 log_softmax
        8192x96 went from 0.75x to 0.97-0.99x torch eager, softmax 0.9x to 1.11-1.15x)."""
        first = ir.Var("mf_first" if self.strided else "mf_base")
        return [ir.If(first < self.size(self.axis), tail)]

    def full(self) -> ir.Expr:
        end = ir.Var("mf_base") + ir.Lit(self.reads, "uint")
        return ir.Var("mf_vec_ok").and_(end <= self.size(self.axis))

    def element_lowering(self, frontier: list[Node], prefix: str = "mf_v") -> ElementLowering:
        """Lowering of this thread's element mf_k (at row position mf_pos): tensors from its
        registers, the row values `frontier` as the row computed them."""
        el = ElementLowering(self.graph,
                             lambda n: self.reg_value(n.attr, ir.Var("mf_k")),
                             self.el_position, self.size, lambda s: self.names[s], prefix=prefix,
                             take=self.gather)
        for n in frontier:
            el.values[n] = self.v.row_values.value(n)
        return el

    def row_takes(self, roots: list[Node], held: set[str]) -> tuple[dict[Node, int], list[Node]]:
        """The gathers along the row among the element values of `roots` that registers can
        serve: ({gather: c} read from this thread's own slot k ^ c, [gathers fetched from
        other lanes by simd shuffles]). Both need the gathered tensor held in registers
        (`held`) for this row; a shuffle needs the simd variant (one simdgroup holds the row),
        an index a lane can compute for any position (`lane_computable`) and a 32-bit value.
        The rest are loads (`gather`)."""
        own: dict[Node, int] = {}
        shuffled: list[Node] = []
        sites = take_sites(self.graph)
        for n in sorted((n for n in self.element_nodes(roots) if n.op == Op.TAKE),
                        key=sites.index):
            name, axis = n.attr
            if n in self.stored:             # kept in registers by an earlier phase
                continue
            c = gather.own_slot(n, self.reads)
            if axis != self.axis or name not in held:
                self.loaded_gathers[self.v.name].add(sites.index(n))
            elif c is not None:
                own[n] = c
            elif (self.v.name in LANES and gather.lane_computable(n, axis)
                  and compute_type(self.graph.tensor(name).dtype) in gather.SHUFFLE_TYPES):
                shuffled.append(n)
            else:
                self.loaded_gathers[self.v.name].add(sites.index(n))
        return own, shuffled

    def shuffle_block(self, takes: list[Node], frontier: list[Node]) -> list[ir.Stmt]:
        """Simd variant: fetch gathered elements from the lanes that hold them. The row's lane
        l holds its elements [l*R, l*R + R), so element p is the row's lane p / R, slot p % R
        (the row's lanes start at mf_lane - mf_t). Every lane computes (and checks) the index
        of each of its R slots, then takes the element with `simd_shuffle` (all lanes take
        part, in uniform control flow). When every element in the row gathers from its own
        slot number (offsets a multiple of R: rotate-half RoPE on head dims that are multiples
        of 2R), one shuffle per element; otherwise R per element, keeping the one at the
        gathered slot. Fills mf_gather<g>[R] (g: the gather's
        number) for the element loop."""
        reads, axis = self.reads, self.axis
        k, pos = ir.Var("mf_k"), ir.Var("mf_pos")
        first = ir.Var("mf_lane") - ir.Var("mf_t")        # the row's first lane
        in_row = pos < self.size(axis)
        sites = take_sites(self.graph)
        el = self.element_lowering(frontier, prefix="mf_i")
        names = ", ".join(f"{sites.index(n)} from '{n.attr[0]}'" for n in takes)
        out: list[ir.Stmt] = [ir.Comment(
            f"gathers along {axis} from the lanes holding them (gather {names}): row element p "
            f"is lane p / {reads}, slot p % {reads}")]
        index_loop: list[ir.Stmt] = [ir.Decl("mf_pos", "uint", self.slot_pos(k))]
        flag, past_end = ir.Var("mf_same_slot"), pos >= self.size(axis)
        same: list[ir.Stmt] = []            # mf_same_slot: each gather at its own slot number
        fetch_same: list[ir.Stmt] = []
        fetch_any: list[ir.Stmt] = []
        for n in takes:
            g = sites.index(n)
            src, val = ir.Var(f"mf_from{g}"), ir.Var(f"mf_gather{g}")
            ct = compute_type(self.graph.tensor(n.attr[0]).dtype)
            def reg(i: ir.Expr, name: str = n.attr[0]) -> ir.Expr:
                return self.reg_value(name, i)
            out += [ir.ArrayDecl(src.name, "uint", reads), ir.ArrayDecl(val.name, ct, reads)]
            stmts, checked = el.gather_position(n, report_if=in_row)
            index_loop += stmts + [ir.Assign(ir.Lane(src, k), ir.Cast("uint", checked))]
            slot = ir.Lane(src, k) % ir.Lit(reads, "uint")
            same.append(ir.Assign(flag, flag.and_(past_end.or_(slot.eq(k)))))
            lane = ir.Cast("ushort", first + ir.Lane(src, k) / ir.Lit(reads, "uint"))
            fetch_same.append(ir.Assign(ir.Lane(val, k),
                                        ir.Call("simd_shuffle", (reg(k), lane))))
            s, t = ir.Var("mf_s"), ir.Var(f"mf_t{g}")
            fetch_any += [
                ir.Assign(ir.Lane(val, k),
                          ir.Call("simd_shuffle", (reg(ir.Lit(0, "uint")), lane))),
                ir.For("mf_s", "uint", ir.Lit(1, "uint"), ir.Lit(reads, "uint"), [
                    ir.Decl(t.name, ct, ir.Call("simd_shuffle", (reg(s), lane))),
                    ir.Assign(ir.Lane(val, k), ir.Select(slot.eq(s), t, ir.Lane(val, k)))],
                    unroll=True)]
        self.helpers |= el.helpers

        def each(body: list[ir.Stmt]) -> ir.For:
            return ir.For("mf_k", "uint", ir.Lit(0, "uint"), ir.Lit(reads, "uint"), body,
                          unroll=True)
        if reads == 1:                  # one slot per lane: the source lane is all there is
            return out + [each(index_loop), ir.Comment("one shuffle per element"),
                          each(fetch_same)]
        index_loop += same
        return out + [
            ir.Decl(flag.name, "bool", ir.Lit(True, "bool"), const=False),
            ir.Comment(f"each of this lane's {reads} elements: where its gathered element is"),
            each(index_loop),
            ir.If(ir.Call("simd_all", (flag,)), [
                ir.Comment("every element in the row gathers from its own slot number of "
                           "another lane: one shuffle each"), each(fetch_same)],
                [ir.Comment(f"from any slot: shuffle all {reads} slots of the source lane, keep "
                            f"the gathered one"), each(fetch_any)])]

    def element_loop(self, roots: list[Node], reds: list[reduce.Reduction],
                     outs: list[int], kept: list[Node]
                     ) -> tuple[list[ir.Stmt], list[str], list[ir.Stmt], list[ir.Stmt]]:
        """(row statements before the loop, the tensors the loop reads from registers, the
        statements fetching gathered elements from other lanes (run once the registers are
        loaded), the loop over this thread's R elements, which also fills the register arrays
        of the `kept` values it computes)."""
        tensors, frontier = self.cone(roots, self.stored)
        self.fresh = set(tensors) - self.v.loaded     # read from the registers just loaded
        row_stmts = self.v.row_values.lower(frontier)
        held = set(tensors) | (set() if self.v.name == "looped" else self.v.loaded)
        self.own_slots, shuffled = self.row_takes(roots, held)
        fetch = self.shuffle_block(shuffled, frontier) if shuffled else []
        el = self.element_lowering(frontier)
        sites = take_sites(self.graph)
        for n in shuffled:
            el.values[n] = ir.Lane(ir.Var(f"mf_gather{sites.index(n)}"), ir.Var("mf_k"))
        for n in self.stored:
            el.values[n] = ir.Lane(ir.Var(self.keep[n]), ir.Var("mf_k"))
        values = el.lower(roots)
        self.helpers |= el.helpers
        pos = ir.Var("mf_pos")
        rest: list[ir.Stmt] = []                   # after the reductions' folds
        for n in kept:
            rest.append(ir.Assign(ir.Lane(ir.Var(self.keep[n]), ir.Var("mf_k")), el.value(n)))
        for k in outs:
            rest.append(ir.Assign(ir.Lane(ir.Var(f"mf_reg_{self.out_names[k]}"),
                                          ir.Var("mf_k")), self.out_value(k, el)))
        body = values + self.fold(el, reds, pos) + rest
        decl_pos: list[ir.Stmt] = [ir.Decl("mf_pos", "uint", self.slot_pos(ir.Var("mf_k")))]

        def each(stmts: list[ir.Stmt], guarded: bool) -> ir.Stmt:
            if guarded:
                stmts = decl_pos + [ir.If(pos < self.size(self.axis), stmts)]
            else:
                stmts = (decl_pos if ir.mentions(stmts, "mf_pos") else []) + stmts
            return ir.For("mf_k", "uint", ir.Lit(0, "uint"), ir.Lit(self.reads, "uint"), stmts,
                          unroll=True)
        whole: list[ir.Stmt] = [ir.Comment("all of them in the row: no per-element check")]
        pairs = [r for r in reds if r.online_sum is not None]
        if pairs:
            whole += self.online_chunk(el, reds, pairs, values, rest, each)
        else:
            whole.append(each(body, False))
        if self.v.name in WHOLE:                    # rows of whole blocks
            return row_stmts, tensors, fetch, whole
        end = ir.Var("mf_base") + ir.Lit(self.reads, "uint")
        inside = (ir.Var("mf_last") < self.size(self.axis) if self.strided
                  else end <= self.size(self.axis))
        loop: list[ir.Stmt] = [ir.If(inside, whole, self.holding([
            ir.Comment("the row's end: each element checked"), each(body, True)]))]
        return row_stmts, tensors, fetch, loop

    def online_chunk(self, el: ElementLowering, reds: list[reduce.Reduction],
                     pairs: list[reduce.Reduction], values: list[ir.Stmt], rest: list[ir.Stmt],
                     each: Callable[[list[ir.Stmt], bool], ir.Stmt]) -> list[ir.Stmt]:
        """The element loop over a chunk wholly in the row, with online (max, sum) pairs: the
        loop keeps each pair's argument in a register array instead of folding it element by
        element, and one `mf_online_add_chunk` per chunk folds them (one rescale test and one
        compensated add per chunk: f32 softmax rows of 16384 went from 0.93x to 1.02x torch
        eager on the H100)."""
        others = [r for r in reds if r.online_sum is None]
        keep: list[ir.Stmt] = []
        decls: list[ir.Stmt] = []
        after: list[ir.Stmt] = []
        for r in pairs:
            arr = f"mf_on{r.i}"
            decls.append(ir.ArrayDecl(arr, "float", self.reads))
            keep.append(ir.Assign(ir.Lane(ir.Var(arr), ir.Var("mf_k")), self.acc_value(el, r)))
            after += reduce.update_chunk(r, arr, self.reads)
        self.helpers.add("mf_online_add_chunk")
        body = values + self.fold(el, others, ir.Var("mf_pos")) + keep + rest
        return decls + [each(body, False), ir.Comment(
            "fold the chunk into the running max and sum at once")] + after

    def store_block(self, outs: list[int]) -> list[ir.Stmt]:
        reads, vw = self.reads, self.vw
        base = ir.Var("mf_base")
        vec: list[ir.Stmt] = []
        sca: list[ir.Stmt] = []
        for k in outs:
            o = self.graph.outputs[k]
            st = self.out_stype(k)
            arr = ir.Var(f"mf_reg_{self.out_names[k]}")
            rb = self.row_base(self.out_names[k], o.axes)
            start = rb + ir.Cast(IDX, base) + ir.Var("mf_c") * self.chunk_step()
            first = ir.Var("mf_c") * ir.Lit(vw, "uint")
            lanes = tuple(ir.Lane(arr, first + ir.Lit(j, "uint")) for j in range(vw))
            vec.append(ir.For("mf_c", "uint", ir.Lit(0, "uint"), ir.Lit(reads // vw, "uint"), [
                ir.Store(self.out_names[k], start,
                         ir.Call("mf_pack8_of" if vw == 8 else ir.vector_type(st, vw), lanes),
                         vw, st)],
                unroll=True))
            pos = self.slot_pos(ir.Var("mf_k"))
            sca.append(ir.If(pos < self.size(self.axis), [
                ir.Store(self.out_names[k], rb + ir.Cast(IDX, pos),
                         ir.Lane(arr, ir.Var("mf_k")))]))
        scalar: list[ir.Stmt] = [ir.For("mf_k", "uint", ir.Lit(0, "uint"),
                                        ir.Lit(reads, "uint"), sca, unroll=True)]
        if self.v.name in WHOLE:                    # rows of whole blocks
            return [ir.Comment(f"store the row's outputs, {vw}-wide")] + vec
        if vw > 1:
            return [ir.Comment("store the row's outputs"),
                    ir.If(self.full(), [ir.Comment(f"{vw}-wide vector stores")] + vec,
                          self.holding([ir.Comment("row tail or unaligned rows: scalar, "
                                                   "guarded")] + scalar))]
        return [ir.Comment("store the row's outputs")] + scalar

    # -- combining across the row ---------------------------------------------------------
    def combine(self, reds: list[reduce.Reduction], variant: str) -> list[ir.Stmt]:
        if variant in LANES:
            return self.row_lanes_combine(reds)
        out: list[ir.Stmt] = [ir.Comment("combine across the simdgroup")]
        for r in reds:
            if r.online_max is None:
                out += reduce.simd_combine(r)
        lane, sg = ir.Var("mf_lane"), ir.Var("mf_sg")
        stores, reads = reduce.through_threadgroup(self.v, reds, SIMD_WIDTH, sg, lane,
                                                   lane < ir.Var("mf_nsg"))
        out += [ir.Comment("across simdgroups: one partial per simdgroup through threadgroup "
                           "memory, then a second simd reduction in every simdgroup"),
                ir.If(lane.eq(ir.Lit(0, "uint")), stores), ir.Barrier()]
        return out + reads

    @staticmethod
    def row_lanes_combine(reds: list[reduce.Reduction]) -> list[ir.Stmt]:
        """Simd variant: combine the row's mf_w lanes by an xor butterfly (partners stay in
        the row's lanes); every lane of the row ends with the row's result."""
        off = ir.Var("mf_off")
        step: list[ir.Stmt] = []
        for r in reds:
            other = ir.Var(f"mf_o{r.i}")
            step.append(ir.Decl(other.name, r.acc_type,
                                ir.Call("simd_shuffle_xor", (r.acc_ref, off))))
            other_idx = None
            if r.has_index:
                other_idx = ir.Var(f"mf_oi{r.i}")
                step.append(ir.Decl(other_idx.name, "uint",
                                    ir.Call("simd_shuffle_xor", (ir.Var(r.idx), off))))
            step += reduce.merge(r, other, other_idx)
        w = ir.Var("mf_w")
        return [ir.Comment("combine the row's lanes (xor butterfly; a fixed trip count, so the "
                           "compiler unrolls it)"),
                ir.For(off.name, "uint", ir.Lit(1, "uint"), ir.Lit(SIMD_WIDTH, "uint"),
                       [ir.If(off < w, step)], step=off, unroll=True)]

    # -- one variant -----------------------------------------------------------------------
    def kernel(self, v: reduce.Variant) -> ir.LoweredKernel:
        graph = self.graph
        looped = v.name == "looped"
        self.reads = reads_for(self.policy, v.name, self.itemsize)
        self.vw = vector_width_for(self.policy, v.name, self.itemsizes)
        self.staged = self.stage_plan if v.name == "staged" else {}
        # the exact simd kernel spreads a lane's chunks over the row, the row's lanes side by
        # side in each (one contiguous span a vector access; see the module docstring)
        self.interleaved = (v.name == "simd_exact" and self.reads > self.vw
                            and not self.row_gathers())
        # rows that are not a multiple of the vector width: a thread's slots strided by the
        # row's threads (`placement`), so that each access of a simdgroup is one contiguous span
        self.strided = self.vw > 1 and v.name not in WHOLE and not self.row_gathers()
        if self.vw == 8:
            self.helpers.add("mf_pack8_of")
        # the looped variant adds thousands of elements per thread: compensated sums
        reds = reduce.phases(graph, online=looped, compensated=looped)
        self.keep = {} if looped else self.kept
        self.stored: set[Node] = set()
        self.helpers |= reduce.helpers_of(reds, simd=True) - {"mf_online_merge"}
        early = [] if looped else self.early
        for p in range(1 + max(r.phase for r in reds)):
            rs = [r for r in reds if r.phase == p]
            roots = [r.arg for r in rs if r.online_max is None]
            desc = ", ".join(self._desc(r) for r in rs)
            outs = early if p == 0 else []
            if outs:
                roots += [graph.outputs[k].node for k in outs]
                desc += f"; store {', '.join(self.out_names[k] for k in outs)}"
            self.section(v, roots, rs, outs, f"phase {p + 1}: {desc}")
        self.epilogue(v, early)
        threads, head = self.header(v.name)
        body = list(v.tg_arrays) + head + v.pre + v.main
        return make_kernel(graph, self.index64, threads, body, self._summary(v.name, reds), v.name)

    def kept_values(self, reds: list[reduce.Reduction]) -> dict[Node, str]:
        """Element values a register variant keeps in registers from the phase that computes
        them to the later phases or outputs that use them ({node: register array}):
        - the computed argument of a reduction that later element values use again (softmax's
          exp(x - max), computed once instead of twice);
        - the values `carried` in place of the inputs they are computed from."""
        g = self.graph
        later = [r.arg for r in reds] + [o.node for o in g.outputs]
        keep: dict[Node, str] = {}
        for r in reds:
            a = r.arg
            if not self.elem(a) or a.op == Op.LOAD or a in keep:
                continue
            if any(n is not a and a in self.element_nodes([n]) for n in later):
                keep[a] = f"mf_keep{r.i}"
        return keep | self.carried(reds, keep)

    def carried(self, reds: list[reduce.Reduction], keep: dict[Node, str]) -> dict[Node, str]:
        """Element values a phase computes from the inputs it holds that the later sections
        read in their place, where that leaves fewer register blocks live past the phase
        (greedily, each value at least one block fewer than it costs): add_rms_norm's
        h = x + r is one block of floats where x and r are two, and the epilogue no longer
        adds them again. Values are unchanged: the epilogue read the same fp32 h."""
        order = {n: i for i, n in enumerate(self.nodes)}
        outs = [o.node for o in self.graph.outputs if self.elem(o.node)]
        carry: dict[Node, str] = {}
        loaded: set[str] = set()
        made: set[Node] = set()
        for p in range(1 + max(r.phase for r in reds)):
            stop = set(keep) | set(carry)
            now = [r.arg for r in reds if r.phase == p and r.online_max is None]
            later = [r.arg for r in reds if r.phase > p and r.online_max is None] + outs
            loaded |= set(self.cone(now, stop)[0])
            fresh = self.element_nodes(now, stop) - made
            made |= fresh
            used = self.element_nodes(later, stop)
            options = sorted((n for n in fresh & used if n.op != Op.LOAD), key=order.__getitem__)

            def held(stop: set[Node]) -> int:
                return len(loaded & set(self.cone(later, stop)[0]))
            while options:
                now_held = held(stop)
                gain, best = max(((now_held - held(stop | {n}) - 1, n) for n in options),
                                 key=lambda t: t[0])
                if gain <= 0:
                    break
                carry[best] = f"mf_carry{len(carry) + 1}"
                stop.add(best)
                options.remove(best)
        return carry

    def early_outputs(self, reds: list[reduce.Reduction]) -> list[int]:
        """Outputs along the row computed from no reduction's result and only from inputs the
        first phase loads (add_rms_norm's h): the register variants store them in the first phase,
        not the epilogue (the looped one reads the row again anyway; storing there too ran f32
        add_rms_norm 2048x16384 2% slower on the H100)."""
        first = [r.arg for r in reds if r.phase == 0 and r.online_max is None]
        loaded = set(self.cone(first)[0])
        out: list[int] = []
        for k, o in enumerate(self.graph.outputs):
            tensors, frontier = self.cone([o.node])
            if self.elem(o.node) and set(tensors) <= loaded and \
                    not any(n.op == Op.REDUCE for n in topo_order(frontier)):
                out.append(k)
        return out

    def element_nodes(self, roots: Iterable[Node], stop: AbstractSet[Node] = frozenset()
                      ) -> set[Node]:
        """The element nodes the values of `roots` are computed from (themselves included; not
        below `stop`, values already in registers)."""
        seen: set[Node] = set()
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n in seen or not self.elem(n):
                continue
            seen.add(n)
            if n not in stop:
                stack.extend(n.args)
        return seen

    def section(self, v: reduce.Variant, roots: list[Node], rs: list[reduce.Reduction],
                outs: list[int], title: str) -> None:
        """One pass over the row: load the inputs it needs (once per row in the register
        variants, per chunk in the looped one), compute element values, fold the reductions
        `rs` and store the outputs `outs`; then combine `rs` across the row."""
        reads, looped = self.reads, v.name == "looped"
        reach = self.element_nodes(roots, self.stored)
        kept = [n for n in self.keep if n in reach and n not in self.stored]
        row_stmts, tensors, fetch, loop = self.element_loop(roots, rs, outs, kept)
        v.main.append(ir.Comment(title))
        v.main.extend(row_stmts)
        for r in rs:
            v.main.extend(reduce.declare(r))
        regs = [ir.ArrayDecl(f"mf_reg_{self.out_names[k]}", self.out_stype(k), reads) for k in outs]
        regs += [ir.ArrayDecl(self.keep[n], compute_type(n.dtype), reads) for n in kept]
        body: list[ir.Stmt] = []
        new = [t for t in tensors if looped or t not in v.loaded]
        for t in new:
            v.passes[t] = v.passes.get(t, 0) + 1
        if looped:
            thread = ir.Var("mf_j") * ir.Var("mf_tpg") + ir.Var("mf_t")
            body += [ir.Decl("mf_base", "uint", thread * ir.Lit(reads, "uint"))]
            body += self.placement(ir.Var("mf_j") * ir.Var("mf_tpg") * ir.Lit(reads, "uint") +
                                   ir.Var("mf_t"), ir.Var("mf_tpg"))
            if new:
                body += self.load_block(new, declare=True)
            body += regs
        else:
            if new:
                v.main.extend(self.load_block(new, declare=True))
                v.loaded.update(new)
            v.main.extend(regs)
        body += fetch + [ir.Comment(f"each of this thread's {reads} elements")] + loop
        if outs:
            body += self.store_block(outs)
        if looped:
            v.main.append(ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Var("mf_chunks"), body))
        else:
            v.main.extend(body)
        self.stored.update(kept)
        if rs:
            v.main.extend(reduce.finish(rs))
            v.main.extend(self.combine(rs, v.name))
            for r in rs:
                v.row_values.values[r.node] = reduce.result(r)

    def epilogue(self, v: reduce.Variant, early: list[int]) -> None:
        """The outputs the first phase did not store (`early`): those along the row in one more
        section; one value per row stored by the row's first thread."""
        graph = self.graph
        along = [k for k, o in enumerate(graph.outputs) if self.elem(o.node) or self.axis in o.axes]
        el_outs = [k for k in along if k not in early]
        row_outs = [k for k in range(len(graph.outputs)) if k not in along]
        if el_outs:
            self.section(v, [graph.outputs[k].node for k in el_outs], [], el_outs,
                         "epilogue: compute and store the outputs along the row")
        if row_outs:
            stmts = v.row_values.lower([graph.outputs[k].node for k in row_outs])
            stores: list[ir.Stmt] = []
            for k in row_outs:
                stores.append(ir.Store(self.out_names[k], self.row_base(
                    self.out_names[k], graph.outputs[k].axes), self.out_value(k, v.row_values)))
            v.main += [ir.Comment("epilogue: the row's results, stored by its first thread")]
            v.main += stmts + [ir.If(ir.Var("mf_t").eq(ir.Lit(0, "uint")), stores)]

    def header(self, variant: str) -> tuple[tuple[ir.ThreadInput, ...], list[ir.Stmt]]:
        """(thread inputs, statements placing the thread): its row, its index in the row,
        where its elements start, the chunk count (looped) and whether vector loads apply."""
        reads = self.reads
        head: list[ir.Stmt] = []
        threads = [ir.ThreadInput("mf_group", "uint", "threadgroup_position_in_grid"),
                   ir.ThreadInput("mf_tpg", "uint", "threads_per_threadgroup"),
                   ir.ThreadInput("mf_sg", "uint", "simdgroup_index_in_threadgroup"),
                   ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup")]
        if variant in LANES:
            threads = [ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),
                       ir.ThreadInput("mf_lane", "uint", "thread_index_in_simdgroup")]
            one, shift = ir.Lit(1, "uint"), ir.Var("mf_wlog")
            per_lane = ir.Lit(reads, "uint")
            lanes = (ir.Cast("uint", self.size(self.axis)) + (per_lane - one)) / per_lane
            head += [ir.Comment(f"mf_w = 1 << mf_wlog lanes per row: the fewest, a power of two "
                                f"up to 32, that hold it at {reads} elements each (32 / mf_w rows "
                                f"per simdgroup; threads per threadgroup: set at launch)"),
                     ir.Decl("mf_wlog", "uint", ir.Lit(32, "uint") - ir.Call(
                         "clz", (ir.Call("max", (lanes, one)) - one,))),
                     ir.Decl("mf_w", "uint", one << shift),
                     ir.Decl("mf_row", "uint", ir.Binary(">>", ir.Var("mf_tid"), shift)),
                     ir.If(ir.Cast(IDX, ir.Var("mf_row")) >= self.span(self.outer),
                           [ir.Return()]),
                     ir.Decl("mf_t", "uint", ir.Var("mf_tid") & (ir.Var("mf_w") - one))]
        else:
            threads.insert(1, ir.ThreadInput("mf_lid", "uint", "thread_position_in_threadgroup"))
            head += [ir.Comment("one threadgroup per row"),
                     ir.Decl("mf_row", "uint", ir.Var("mf_group")),
                     ir.Decl("mf_t", "uint", ir.Var("mf_lid")),
                     ir.Decl("mf_nsg", "uint", (ir.Var("mf_tpg") + ir.Lit(SIMD_WIDTH - 1, "uint")) /
                             ir.Lit(SIMD_WIDTH, "uint"))]
        if self.interleaved:
            vw = ir.Lit(self.vw, "uint")
            head += [ir.Decl("mf_base", "uint", ir.Var("mf_t") * vw),
                     ir.Decl("mf_stride", "uint", ir.Var("mf_w") * vw)]
        elif variant != "looped":
            head.append(ir.Decl("mf_base", "uint", ir.Var("mf_t") * ir.Lit(reads, "uint")))
        if variant == "looped":
            span = ir.Var("mf_tpg") * ir.Lit(reads, "uint")
            length = ir.Cast("uint", self.size(self.axis))
            head.append(ir.Decl("mf_chunks", "uint", (length + (span - ir.Lit(1, "uint"))) / span))
        if self.vw > 1 and variant not in WHOLE:     # the others take rows of whole blocks
            whole = (self.size(self.axis) % ir.Lit(self.vw, IDX)).eq(ir.Lit(0, IDX))
            head.append(ir.Decl("mf_vec_ok", "bool", whole))
        if self.strided and variant != "looped":     # looped: per chunk (`section`)
            head.append(ir.Comment("rows that are not a multiple of the vector width move "
                                   "element by element: a thread's slots strided by the row's "
                                   "threads there, a simdgroup's accesses contiguous"))
            head += self.placement(ir.Var("mf_t"), ir.Var("mf_w" if variant in LANES
                                                          else "mf_tpg"))
        return tuple(threads), head

    @staticmethod
    def _desc(r: reduce.Reduction) -> str:
        if r.online_sum is not None:
            return f"{r.kind} and (online) sum of exp(x - max)"
        if r.online_max is not None:
            return "(with the max above)"
        return f"{r.kind} over {r.axis}"

    def _summary(self, variant: str, reds: list[reduce.Reduction]) -> str:
        # launch-only choices (threads and rows per group) stay out of the text, so changing
        # them reuses the compiled library
        lanes = (f"the fewest lanes of a simdgroup per row that hold it, {self.reads} "
                 f"elements per lane in registers")
        spread = (f", each {self.vw}-wide chunk of the row a span of the row's lanes side by "
                  f"side" if self.interleaved else "")
        how = {"simd": lanes,
               "simd_exact": f"{lanes}, for rows they cover exactly (D = lanes x "
                             f"{self.reads}: no row-end checks){spread}",
               "group": f"one threadgroup per row, {self.reads} elements per thread in registers, "
                        f"global memory read once",
               "staged": f"rows of whole blocks (a multiple of 32 x {self.reads}), one "
                         f"threadgroup per row, {self.reads} elements per thread, global "
                         f"memory read once; after the first phase, elements "
                         f"{min(self.staged.values(), default=0)} on of "
                         f"{', '.join(self.staged)} from threadgroup memory, not registers",
               "looped": f"one threadgroup per row (its size set at launch), streamed in "
                         f"chunks of {self.reads} elements per thread per phase, compensated "
                         f"sums"}[variant]
        nph = 1 + max(r.phase for r in reds)
        return (f"{self.graph.name} ({variant}): reduces '{self.axis}' over rows "
                f"[{', '.join(self.outer)}] in {nph} phase(s); {how}; {self.vw}-wide vector "
                f"loads/stores where aligned; fp32 accumulation")

    # -- the schedule -------------------------------------------------------------------
    def build(self) -> RowSchedule:
        # what the register variants keep in registers and store early, the staged kernel
        # where it may run and the block splits
        reds = reduce.phases(self.graph, online=False)
        self.kept, self.early = self.kept_values(reds), self.early_outputs(reds)
        self.stage_plan = self.staging(reds) if self.policy.stage_rows is not False else {}
        names = tuple(v for v in VARIANTS if v != "staged" or self.stage_plan)
        kernels, passes, tg = self.variants(names)
        # the widest access any variant makes: the alignment the launcher checks inputs for
        vw = max(vector_width_for(self.policy, name, self.itemsizes) for name in VARIANTS)
        policy = replace(self.policy, threadgroup_bytes=tg, uses_simd=True, vector_width=vw)
        first = kernels[VARIANTS[0]]
        return RowSchedule("row", self.graph, policy, first, tuple(self.outer) + (self.axis,),
                           tuple(t.name for t in self.inputs if self.axis in t.axes
                                 and vw > 1),
                           self.index64, axis=self.axis, rows=self.outer, variants=kernels,
                           reductions=reds, passes=passes, itemsize=self.itemsize,
                           held_gathers=self.held_gathers(names))

    def held_gathers(self, names: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
        """{variant: the gathers no section of it loads}: registers or shuffles serve them."""
        sites = range(len(take_sites(self.graph)))
        return {v: tuple(k for k in sites if k not in self.loaded_gathers[v]) for v in names}
