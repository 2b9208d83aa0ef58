"""The elementwise schedule: a grid over the output's elements, several per thread.

Layout. Thread t covers `elements_per_thread` consecutive elements of the grid (the output with
the most axes, in its storage order), in chunks of `vector_width`. A chunk that lies wholly inside
the grid is read and written with vector loads/stores for every tensor whose elements at those
positions are contiguous (same axes as the grid; or a suffix of them, when that suffix's span is
a multiple of the vector width); other tensors (broadcast ones) are read one element per lane at
their own offset. The last, partial chunk takes a guarded scalar path. The vector width is the
policy's, at most 16 bytes of the widest tensor read or written as vectors; where that gives 8
(2-byte data), a second kernel (`small`) at 4 runs on grids of fewer than `small_grid` elements.

Broadcast inputs are indexed by their own axes: an offset is `i` (same axes as the grid),
`i % span` (a suffix), `i / span` (a prefix), or built from the element's position along each
axis (any other subset/order). Axis sizes are kernel arguments. The index type is a template
parameter: 32-bit (`uint`) when every size fits below 2^31, else 64-bit (`ulong`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol

from .. import ir
from ..dtypes import DType
from ..errors import UnsupportedConstruct, at
from ..graph import (
    Graph,
    Node,
    Op,
    ScalarParam,
    TensorParam,
    broadcasts_over,
    literal_size,
    take_sites,
)
from ..shapes import size_multiple
from . import gather, ranges
from .base import IDX, Schedule, make_kernel
from .lower import ElementLowering, compute_type, convert, ident
from .names import param_name, template_vars, tensor_var, type_name
from .policy import LaunchPolicy, access_width
from .random import DrawPosition

MAX_BUFFERS = 31                 # Metal's buffer argument table: indices 0..30
_SCALAR_CASTS = {"f16": "fp16", "bf16": "bf16", "i32": "int32", "u32": "int32", "i16": "int16",
                 "u16": "int16", "i8": "int8", "u8": "uint8", "bool": "uint8"}
def used_params(graph: Graph, nodes: list[Node]) -> tuple[list[TensorParam], list[ScalarParam]]:
    """(the tensors the kernel loads, the scalars it reads), in parameter order."""
    used = {n.attr for n in nodes if n.op == Op.LOAD}
    used |= {n.attr[0] for n in nodes if n.op == Op.TAKE}
    scalars = {n.attr for n in nodes if n.op == Op.SCALAR}
    return ([t for t in graph.tensors if t.name in used],
            [s for s in graph.scalars if s.name in scalars])


def output_stype(graph: Graph, tvars: Mapping[str, DType], k: int) -> str:
    """Output k's storage type: the dtype variable that binds its dtype, else the dtype."""
    o = graph.outputs[k]
    return next((v for v, d in tvars.items() if d == o.dtype), o.dtype.msl)


def input_stype(t: TensorParam, tvars: Mapping[str, DType]) -> str:
    """An input's storage type: its dtype variable where the kernel is templated on it, else
    its dtype."""
    var = type_name(t.dtype_var) if t.dtype_var else None
    return var if var and var in tvars else t.dtype.msl


def product(size: Callable[[str], ir.Expr], axes: Iterable[str]) -> ir.Expr:
    """The product of the sizes of `axes` as an expression (1 for none)."""
    e: ir.Expr = ir.Lit(1, IDX)
    for k, a in enumerate(axes):
        e = size(a) if k == 0 else e * size(a)
    return e


def msl_names(graph: Graph) -> tuple[dict[str, str], list[str]]:
    """({parameter: its name in MSL}, the outputs' names: mf_out, or mf_out0, mf_out1, ...)."""
    names = {t.name: param_name(t.name, graph.dtype_vars) for t in graph.tensors}
    names.update({s.name: param_name(s.name, graph.dtype_vars) for s in graph.scalars})
    single = len(graph.outputs) == 1
    return names, ["mf_out" if single else f"mf_out{k}" for k in range(len(graph.outputs))]


def build(graph: Graph, policy: LaunchPolicy, index64: bool) -> Schedule:
    """The kernel at the table's width and, where that is 8 and `small_grid` is set, a second
    one (`small`) at 4 elements a thread for grids of fewer than small_grid elements."""
    wide = ElementwiseKernel(graph, policy, index64).build()
    if wide.policy.vector_width <= SMALL_WIDTH or policy.small_grid == 0:
        return wide
    small = ElementwiseKernel(graph, replace(policy, vector_width=SMALL_WIDTH), index64,
                              "small").build()
    assert small.kernel.params == wide.kernel.params, "the two widths bind the same arguments"
    return ElementwiseSchedule(**{f.name: getattr(wide, f.name) for f in fields(wide)},
                               small=small.kernel)


# Elements a thread of the `small` kernel covers: a grid too small to fill the GPU is bounded by
# each thread's chain of work, not by bandwidth. H100, 2026-11-27, f16, us, 8 elements a thread
# -> 4 (threads_per_group 64-256 alike): rope 32x32x1x128 (131 K elements) 6.7-7.0 -> 4.8-5.3,
# silu 32x4096 2.6-2.7 -> 2.3-2.5; the two cross at about 2 M elements, 8 faster from 4 M on
# (every elementwise example at 1-16 M elements, bench/README.md)
SMALL_WIDTH = 4


@dataclass
class ElementwiseSchedule(Schedule):
    """An elementwise schedule with the `small` kernel beside the wide one: calls over fewer
    than policy.small_grid elements launch it."""
    small: Optional[ir.LoweredKernel] = None

    def _is_small(self, sizes: Mapping[str, int]) -> bool:
        return self.numel(sizes) < self.policy.small_grid

    @property
    def kernels(self) -> tuple[ir.LoweredKernel, ...]:
        assert self.small is not None
        return (self.kernel, self.small)

    def host_name(self, sizes: Mapping[str, int]) -> str:
        assert self.small is not None
        return (self.small if self._is_small(sizes) else self.kernel).host_name

    def width(self, sizes: Mapping[str, int]) -> int:
        return SMALL_WIDTH if self._is_small(sizes) else self.policy.vector_width

    def selecting(self, host_name: str) -> list[dict[str, Any]]:
        """Sizes that make a call launch kernel `host_name` (testing's coverage): the wide
        kernel over at least small_grid elements, its innermost axis one whole chunk long (8,
        or what its derived axes need: 64 for K/GS) and, where it may be, one more (a partial
        chunk: the element-by-element path), the outermost axis making up the count (a batch
        dim's leading shape as a tuple)."""
        if host_name != self.kernel.host_name:
            return []
        n, outer, inner = self.policy.small_grid, self.grid_axes[0], self.grid_axes[-1]
        # a length the innermost axis can take: a multiple of what its derived axes divide by
        # (K of K/8 and K/GS: 64), so the partial chunk only where that is 1
        step = size_multiple(self.graph.tensors, inner)
        if outer == inner:
            return [{inner: n}] + ([{inner: n + 1}] if step == 1 else [])
        batch = {d.name for t in self.graph.tensors for d in t.dims if d.batch}
        whole = math.lcm(self.policy.vector_width, step)
        out = []
        for row in [whole] + ([whole + 1] if step == 1 else []):
            rows = -(-n // row)
            out.append({outer: (rows,) if outer in batch else rows, inner: row})
        return out


@dataclass
class KernelUses:
    """What an elementwise kernel collects while it is built: the axis sizes it reads (its
    size parameters), the multi-axis spans it declares once up front, its helper functions,
    the gathers its vector path reads from lanes already loaded."""
    sizes: list[str] = field(default_factory=list)
    spans: dict[tuple[str, ...], str] = field(default_factory=dict)
    span_decls: list[ir.Stmt] = field(default_factory=list)
    helpers: set[str] = field(default_factory=set)
    lane_takes: list[int] = field(default_factory=list)


class ElementwiseKernel:
    """One elementwise kernel (`variant`: None, or "small") being built: what the graph and
    the policy fix (checked and computed once, here) and what it collects (`uses`)."""

    def __init__(self, graph: Graph, policy: LaunchPolicy, index64: bool,
                 variant: Optional[str] = None):
        self.graph, self.policy, self.index64 = graph, policy, index64
        self.variant = variant
        outs = graph.outputs
        self.grid = max(outs, key=lambda o: len(o.axes)).axes
        for o in outs:
            extra = [a for a in o.axes if a not in self.grid]
            if extra:
                raise UnsupportedConstruct(
                    f"kernel '{graph.name}': outputs over different axes ({list(o.axes)} and "
                    f"{list(self.grid)}) are not supported by the elementwise schedule")
        nodes = list(graph.nodes())
        self.inputs, self.scalars = used_params(graph, nodes)
        taken = {n.attr for n in nodes if n.op == Op.TAKE}
        self.loaded = {n.attr for n in nodes if n.op == Op.LOAD}
        for t in self.inputs:
            extra = [a for a in t.axes if a not in self.grid and not self._on_grid(a)
                     and (t.name, a) not in taken]
            if extra:
                raise UnsupportedConstruct(
                    f"kernel '{graph.name}': input '{t.name}' has axis {extra[0]!r}, which no "
                    f"output has: only a reduction can remove an axis")
        for n in nodes:
            if n.op == Op.INDEX and n.attr not in self.grid:
                raise UnsupportedConstruct(
                    f"mf.index({n.attr!r}){at(n.loc)}"
                    f": '{n.attr}' is not an axis of the output {list(self.grid)}")
        # template parameters: dtype variables, then the index type
        self.tvars = template_vars(graph.dtype_vars)
        self.names, self.out_names = msl_names(graph)
        # vector_width is an upper bound: an access moves at most 16 bytes (`access_width`) of
        # the tensors read or written as vectors (rows gathered whole among them); those read
        # element by element (broadcast, or packed words read once per word) do not bound it
        self.row_gathers = [n for n in take_sites(graph) if self._row_gather(n)]
        wide = {t.dtype.itemsize for t in self.inputs
                if self._vectorisable(t.axes) and t.name in self.loaded} | {
                    o.dtype.itemsize for o in outs if o.axes == self.grid} | {
                    graph.tensor(n.attr[0]).dtype.itemsize for n in self.row_gathers}
        vw = access_width(policy.vector_width, wide)
        self.policy = replace(policy, vector_width=vw)
        if vw == 1:
            self.row_gathers = []
        self.vec_in = [t for t in self.inputs if vw > 1 and self._vectorisable(t.axes)
                       and t.name in self.loaded]
        self.vec_out = [k for k, o in enumerate(outs) if vw > 1 and o.axes == self.grid]
        self.uses = KernelUses()

    @property
    def sizes_used(self) -> list[str]:
        """The axis sizes the kernel reads, in parameter order."""
        return self.uses.sizes

    # -- naming and types --------------------------------------------------------------
    def stype(self, dtype: DType, var: str | None = None) -> str:
        """Storage type spelling: the template parameter where a dtype variable binds it."""
        return type_name(var) if var and type_name(var) in self.tvars else dtype.msl

    def out_stype(self, k: int) -> str:
        return output_stype(self.graph, self.tvars, k)

    def in_stype(self, t: TensorParam) -> str:
        return self.stype(t.dtype, t.dtype_var)

    def size(self, axis: str) -> ir.Expr:
        fixed = literal_size(self.graph, axis)     # a literal dim: a constant of the kernel
        if fixed is not None:
            return ir.Lit(fixed, IDX)
        if axis not in self.uses.sizes:
            self.uses.sizes.append(axis)
        return ir.Var(f"mf_size_{ident(axis)}")

    def span(self, axes: tuple[str, ...]) -> ir.Expr:
        """Product of the sizes of `axes` (declared once at the top of the kernel)."""
        if len(axes) == 1:
            return self.size(axes[0])
        spans = self.uses.spans
        if axes not in spans:
            name = "mf_span_" + "_".join(ident(a) for a in axes)
            e: ir.Expr = self.size(axes[0])
            for a in axes[1:]:
                e = e * self.size(a)
            spans[axes] = name
            self.uses.span_decls.append(ir.Decl(name, IDX, e))
        return ir.Var(spans[axes])

    def _on_grid(self, axis: str) -> bool:
        """A derived axis read by integer division of a grid axis (K/8 of K: element k // 8)."""
        spec = self.graph.axis_spec(axis)
        return broadcasts_over(spec) and spec.base in self.grid

    def _row_gather(self, n: Node) -> bool:
        """Whether gather `n` reads whole rows: along an outer axis of a tensor whose innermost
        axis is the grid's, by an index that does not move along it (an embedding's ids, a
        paged cache's block table), the tensor's other axes the grid's. A chunk of the vector
        path then gathers `vector_width` consecutive elements of one row: one vector load."""
        name, axis = n.attr
        t, inner = self.graph.tensor(name), self.grid[-1]
        return (len(self.grid) > 1 and t.axes[-1] == inner and axis != inner
                and inner not in n.args[0].axes
                and all(a == axis or a in self.grid for a in t.axes))

    def _vectorisable(self, axes: tuple[str, ...]) -> bool:
        n = len(axes)
        return n > 0 and axes == self.grid[len(self.grid) - n:]

    # -- offsets -----------------------------------------------------------------------
    def position(self, axis: str, i: ir.Expr, need: dict[str, ir.Decl]) -> ir.Expr:
        """Position of element i along a grid axis, or a derived axis K/d of one as k / d
        (declared per element, on first use)."""
        if axis not in need and axis not in self.grid:
            spec = self.graph.axis_spec(axis)
            assert spec.base is not None
            base = self.position(spec.base, i, need)
            need[axis] = ir.Decl(f"mf_pos_{ident(axis)}", IDX, base / ir.Lit(spec.div, IDX))
        if axis not in need:
            k = self.grid.index(axis)
            inner = self.grid[k + 1:]
            e = i / self.span(inner) if inner else i
            if k > 0:
                e = e % self.size(axis)
            need[axis] = ir.Decl(f"mf_pos_{ident(axis)}", IDX, e)
        return ir.Var(f"mf_pos_{ident(axis)}")

    def chunk_position(self, axis: str, chunk: dict[str, ir.Decl],
                       lane: dict[str, ir.Decl]) -> ir.Expr:
        """Vector path: the position of element mf_start + mf_k along an axis. A chunk lies
        inside one row of the innermost axis (`vector_condition`), so only that axis moves with
        k: the others are the chunk's, declared once before the lanes (`chunk`), and so is a
        derived K/d of the innermost axis when d is a multiple of the vector width (the chunk
        sits in one group: a packed word, a scale)."""
        name, inner = f"mf_pos_{ident(axis)}", self.grid[-1]
        if axis in chunk or axis in lane:
            return ir.Var(name)
        if axis == inner:
            lane[axis] = ir.Decl(name, IDX, self.chunk_start(chunk) + ir.Cast(IDX,
                                                                              ir.Var("mf_k")))
        elif axis in self.grid:
            k = self.grid.index(axis)
            e = ir.Var("mf_start") / self.span(self.grid[k + 1:])
            chunk[axis] = ir.Decl(name, IDX, e % self.size(axis) if k > 0 else e)
        else:
            spec = self.graph.axis_spec(axis)
            assert spec.base is not None
            d = ir.Lit(spec.div, IDX)
            if spec.base == inner and spec.div % self.policy.vector_width == 0:
                chunk[axis] = ir.Decl(name, IDX, self.chunk_start(chunk) / d)
            else:
                base = self.chunk_position(spec.base, chunk, lane)
                (lane if spec.base == inner else chunk)[axis] = ir.Decl(name, IDX, base / d)
        return ir.Var(name)

    def chunk_start(self, chunk: dict[str, ir.Decl]) -> ir.Expr:
        """The chunk's first position along the innermost axis (declared once)."""
        inner = self.grid[-1]
        pos0 = ir.Var(f"mf_pos0_{ident(inner)}")
        if "#pos0" not in chunk:
            start = ir.Var("mf_start")
            chunk["#pos0"] = ir.Decl(pos0.name, IDX, start % self.size(inner)
                                     if len(self.grid) > 1 else start)
        return pos0

    def chunk_shift(self, n: Node, chunk: dict[str, ir.Decl],
                    lane: dict[str, ir.Decl]) -> ir.Expr:
        """Vector path: where element mf_start + mf_k of an UNPACK sits in its word. The
        chunk starts at a multiple of the vector width inside its row, so with whole words
        per chunk the slot is k % values per word (a literal once unrolled), and with whole
        chunks per word (pos0 % values per word) + k."""
        base = next(a for a in n.axes if a not in n.args[0].axes)
        per, vw, k = 32 // n.attr, self.policy.vector_width, ir.Var("mf_k")
        if base == self.grid[-1] and vw % per == 0:
            slot: ir.Expr = k % ir.Lit(per, "uint")
        elif base == self.grid[-1] and per % vw == 0:
            slot = ir.Cast("uint", self.chunk_start(chunk) % ir.Lit(per, IDX)) + k
        else:
            slot = ir.Cast("uint", self.chunk_position(base, chunk, lane) % ir.Lit(per, IDX))
        return slot * ir.Lit(n.attr, "uint")

    def offset(self, axes: tuple[str, ...], i: ir.Expr,
               position: Callable[[str], ir.Expr]) -> ir.Expr:
        grid = self.grid
        if axes == grid:
            return i
        if not axes:
            return ir.Lit(0, IDX)
        if axes == grid[len(grid) - len(axes):]:
            return i % self.span(axes)
        if axes == grid[:len(axes)]:
            return i / self.span(grid[len(axes):])
        e = position(axes[0])
        for a in axes[1:]:
            e = e * self.size(a) + position(a)
        return e

    def lane(self, v: ir.Expr, k: ir.Expr) -> ir.Expr:
        """Lane k of a loaded vector (an mf_pack8 through its helper)."""
        return ir.Call("mf_lane8", (v, k)) if self.policy.vector_width == 8 else ir.Lane(v, k)

    # -- one element -------------------------------------------------------------------
    def element(self, vector: bool
                ) -> tuple[list[ir.Decl], list[ir.Stmt], list[ir.Stmt]]:
        """(the chunk's position declarations, its gathered rows (`row_gathers`), statements
        computing and storing element `mf_i` (lane `mf_k` of the vector path, whose positions
        come from the chunk's))."""
        i, k = ir.Var("mf_i"), ir.Var("mf_k")
        need: dict[str, ir.Decl] = {}
        chunk: dict[str, ir.Decl] = {}
        vec_names = {t.name for t in self.vec_in}
        per_chunk = [False]                     # lowering a row gather's index, once a chunk

        def position(a: str) -> ir.Expr:
            return self.chunk_position(a, chunk, need) if vector else self.position(a, i, need)

        def load(n: Node) -> ir.Expr:
            t = self.graph.tensor(n.attr)
            if vector and t.name in vec_names:
                raw: ir.Expr = self.lane(ir.Var(tensor_var(t.name, "v")), k)
            else:
                at_ = ir.Var("mf_start") if per_chunk[0] else i
                raw = ir.Load(self.names[t.name], self.offset(t.axes, at_, position))
            return ir.Cast(compute_type(t.dtype), raw)

        def take(n: Node, pos: ir.Expr) -> ir.Expr:
            name, axis = n.attr
            t = self.graph.tensor(name)
            e: ir.Expr = ir.Lit(0, IDX)
            for j, a in enumerate(t.axes):
                p = pos if a == axis else position(a)
                e = p if j == 0 else e * self.size(a) + p
            return ir.Cast(compute_type(t.dtype), ir.Load(self.names[name], e))

        def linear(axes: tuple[str, ...]) -> Optional[DrawPosition]:
            """A draw over the grid's axes in its order: the element's own index (in the
            vector path lane k of the chunk at mf_start, a multiple of the vector width)."""
            if axes != self.grid:
                return None
            if not vector:
                return DrawPosition(ir.Cast("ulong", i))
            start = ir.Var("mf_start")
            return DrawPosition(ir.Cast("ulong", start + ir.Cast(IDX, k)), start, k,
                                self.policy.vector_width)

        shift = (lambda n: self.chunk_shift(n, chunk, need)) if vector else None
        low = ElementLowering(self.graph, load, position, self.size,
                              lambda s: self.names[s], shift=shift, take=take, linear=linear)
        gathered: list[ir.Stmt] = []
        if vector:
            per_chunk[0] = True
            gathered = self.row_gather_loads(low, position, chunk)
            per_chunk[0] = False
        body = self.held_takes(low) if vector else []
        body += low.lower([o.node for o in self.graph.outputs])
        self.uses.helpers.update(low.helpers)
        stores: list[ir.Stmt] = []
        for kk, o in enumerate(self.graph.outputs):
            v = ir.Cast(self.out_stype(kk), self._to_out(low.value(o.node), o.node.dtype, o.dtype))
            if vector and kk in self.vec_out:
                stores.append(ir.Assign(ir.Lane(ir.Var(f"{self.out_names[kk]}_v"), k), v))
                continue
            st = ir.Store(self.out_names[kk], self.offset(o.axes, i, position), v)
            missing = [a for a in self.grid if a not in o.axes]
            if missing:      # the value repeats along these axes: one thread writes it
                cond: ir.Expr = position(missing[0]).eq(ir.Lit(0, IDX))
                for a in missing[1:]:
                    cond = cond.and_(position(a).eq(ir.Lit(0, IDX)))
                stores.append(ir.If(cond, [st]))
            else:
                stores.append(st)
        pos: list[ir.Stmt] = [need[a] for a in self.grid if a in need]
        pos += [d for a, d in need.items() if a not in self.grid]   # derived: after their base
        out: list[ir.Stmt] = []
        if pos:
            out += [ir.Comment("position along each axis")] + pos
        out += [ir.Comment("compute (f16/bf16 in f32)")] + body
        out += [ir.Comment("store")] + stores
        return list(chunk.values()), gathered, out

    def row_gather_loads(self, low: ElementLowering, position: Callable[[str], ir.Expr],
                         chunk: dict[str, ir.Decl]) -> list[ir.Stmt]:
        """Vector path: each row gather's index computed and checked once for the chunk, and
        the chunk's `vector_width` elements of the gathered row read with one vector load (the
        row holds whole chunks, so the load is aligned); sets each lane's value in `low`."""
        vw, inner = self.policy.vector_width, self.grid[-1]
        out: list[ir.Stmt] = []
        for n in self.row_gathers:
            name, axis = n.attr
            t = self.graph.tensor(name)
            stmts, pos = low.gather_position(n)
            off: ir.Expr = ir.Lit(0, IDX)
            for j, a in enumerate(t.axes):
                p = pos if a == axis else self.chunk_start(chunk) if a == inner else position(a)
                off = p if j == 0 else off * self.size(a) + p
            var = tensor_var(name, f"row{take_sites(self.graph).index(n)}")
            out += [ir.Comment(f"'{name}' gathered along '{axis}': the chunk's {vw} elements "
                               f"of one row, one vector load"), *stmts,
                    ir.Decl(var, ir.vector_type(self.in_stype(t), vw),
                            ir.Load(self.names[name], off, vw, self.in_stype(t)))]
            low.values[n] = ir.Cast(compute_type(t.dtype), self.lane(ir.Var(var),
                                                                     ir.Var("mf_k")))
        return out

    def held_takes(self, low: ElementLowering) -> list[ir.Stmt]:
        """Vector path: gathers along the innermost axis whose element is in the vector this
        chunk already loaded. A chunk starts at a multiple of the vector width inside its row
        (`vector_condition`), so an index `mf.index(axis) ^ c` that stays inside aligned
        blocks of the width (`gather.own_slot`: interleaved RoPE's `i ^ 1`) reads lane k ^ c:
        no second load, and no index check (the lane is in the row). Declares those values
        and sets them in `low`; the other gathers stay guarded loads."""
        vw, inner = self.policy.vector_width, self.grid[-1]
        vec_names = {t.name for t in self.vec_in}
        out: list[ir.Stmt] = []
        for n in take_sites(self.graph):
            name, axis = n.attr
            c = gather.own_slot(n, vw) if axis == inner and name in vec_names else None
            if c is None:
                continue
            t = self.graph.tensor(name)
            k: ir.Expr = ir.Var("mf_k")
            var = tensor_var(name, f"xor{c}")
            out += [ir.Comment(f"'{name}' at index {inner} ^ {c}: lane k ^ {c} of the vector "
                               f"already loaded"),
                    ir.Decl(var, compute_type(t.dtype), ir.Cast(compute_type(t.dtype), self.lane(
                        ir.Var(tensor_var(name, "v")), k ^ ir.Lit(c, "uint") if c else k)))]
            low.values[n] = ir.Var(var)
            self.uses.lane_takes.append(take_sites(self.graph).index(n))
        return out

    @staticmethod
    def _to_out(e: ir.Expr, src: DType, dst: DType) -> ir.Expr:
        return convert(e, src, dst)

    # -- the kernel --------------------------------------------------------------------
    def scalar_path(self) -> list[ir.Stmt]:
        """The guarded path: the chunk's elements one at a time, each checked against the
        element count (the tail, and every chunk when vector_width is 1)."""
        vw = self.policy.vector_width
        _, _, element = self.element(vector=False)
        in_range = ir.Var("mf_i") < ir.Var("mf_numel")
        if vw == 1:
            return [ir.Decl("mf_i", IDX, ir.Var("mf_start")), ir.If(in_range, element)]
        return [ir.For("mf_k", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"),
                       [self.i_decl(), ir.If(in_range, element)])]

    @staticmethod
    def i_decl() -> ir.Decl:
        return ir.Decl("mf_i", IDX, ir.Var("mf_start") + ir.Var("mf_k"))

    def vector_chunk(self, scalar: list[ir.Stmt]) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
        """(statements before the thread's loop, one chunk): vector loads of the contiguous
        inputs, the lanes computed, vector stores; `scalar` where the chunk is the tail."""
        vw = self.policy.vector_width
        if vw == 8:
            self.uses.helpers.add("mf_pack8_of")
        start = ir.Var("mf_start")
        loads: list[ir.Stmt] = [ir.Comment(f"load: {vw}-wide vectors from the contiguous "
                                           f"inputs")]
        for t in self.vec_in:
            off = self.offset(t.axes, start, lambda a: self.position(a, start, {}))
            loads.append(ir.Decl(tensor_var(t.name, "v"), ir.vector_type(self.in_stype(t), vw),
                                 ir.Load(self.names[t.name], off, vw, self.in_stype(t))))
        for kk in self.vec_out:
            if vw == 8:          # 8 lanes: an array, packed into one 16-byte store below
                loads.append(ir.ArrayDecl(f"{self.out_names[kk]}_v", self.out_stype(kk), vw))
            else:
                loads.append(ir.Decl(f"{self.out_names[kk]}_v",
                                     f"vec<{self.out_stype(kk)}, {vw}>", None, const=False))
        chunk, gathered, lane_el = self.element(vector=True)
        if chunk:
            loads.append(ir.Comment("the chunk's position (it lies in one row)"))
            loads += chunk
        loads += gathered
        uses_i = ir.mentions(lane_el, "mf_i")
        lanes = ir.For("mf_k", "uint", ir.Lit(0, "uint"), ir.Lit(vw, "uint"),
                       ([self.i_decl()] if uses_i else []) + lane_el, unroll=True)
        vstores: list[ir.Stmt] = [ir.Comment(f"store: {vw}-wide vectors")]
        for kk in self.vec_out:
            val: ir.Expr = ir.Var(f"{self.out_names[kk]}_v")
            if vw == 8:
                val = ir.Call("mf_pack8_of", tuple(ir.Lane(val, ir.Lit(j, "uint"))
                                                   for j in range(8)))
                self.uses.helpers.add("mf_pack8_of")
            vstores.append(ir.Store(self.out_names[kk], start, val, vw, self.out_stype(kk)))
        # lanes finding their positions, or gathered elements, from the chunk's: it must
        # lie in one row
        in_row = bool(chunk) or bool(self.uses.lane_takes) or bool(self.row_gathers)
        pre, cond = self.vector_condition(start + ir.Lit(vw, IDX) <= ir.Var("mf_numel"),
                                          rows=in_row and len(self.grid) > 1)
        return pre, [ir.If(cond, loads + [ir.Comment("compute each lane"), lanes] + vstores,
                           [ir.Comment("tail: scalar, guarded")] + scalar)]

    def vector_condition(self, full: ir.Expr, rows: bool = False
                         ) -> tuple[list[ir.Stmt], ir.Expr]:
        """(declarations, condition) for taking the vector path: the chunk is whole and every
        broadcast input read as vectors has rows holding whole chunks (as do the output's
        innermost rows when `rows`: lanes find their positions from the chunk's)."""
        vw = self.policy.vector_width
        suffix = [t.axes for t in self.vec_in if t.axes != self.grid]
        if rows:
            suffix.append(self.grid[-1:])
        if not suffix:
            return [], full
        spans = list(dict.fromkeys(tuple(a) for a in suffix))
        ok: ir.Expr = (self.span(spans[0]) % ir.Lit(vw, IDX)).eq(ir.Lit(0, IDX))
        for s in spans[1:]:
            ok = ok.and_((self.span(s) % ir.Lit(vw, IDX)).eq(ir.Lit(0, IDX)))
        what = "rows hold" if rows else "broadcast inputs can be read as vectors when " \
            "their rows hold"
        pre: list[ir.Stmt] = [
            ir.Comment(f"{what} whole {vw}-element chunks"),
            ir.Decl("mf_vec_ok", "bool", ok)]
        return pre, full.and_(ir.Var("mf_vec_ok"))

    def thread_body(self, pre: list[ir.Stmt], chunk: list[ir.Stmt]) -> list[ir.Stmt]:
        """The kernel body: this thread's first element, then its chunks (one, or a loop of
        vectors_per_thread)."""
        p = self.policy
        vw, vpt, ept = p.vector_width, p.vectors_per_thread, p.elements_per_thread
        base = ir.Cast(IDX, ir.Var("mf_tid")) * ir.Lit(ept, IDX)
        body: list[ir.Stmt] = [ir.Comment(f"each thread covers {ept} consecutive output "
                                          f"elements")]
        body.append(ir.Decl("mf_start" if vpt == 1 else "mf_base", IDX, base))
        if self.uses.span_decls:
            body += [ir.Comment("sizes of multi-axis spans")] + self.uses.span_decls
        body += pre
        if vpt == 1:
            return body + chunk
        j = ir.Cast(IDX, ir.Var("mf_j"))
        loop_body = [ir.Decl("mf_start", IDX, ir.Var("mf_base") + j * ir.Lit(vw, IDX))] + chunk
        body.append(ir.For("mf_j", "uint", ir.Lit(0, "uint"), ir.Lit(vpt, "uint"), loop_body,
                           unroll=True))
        return body

    def build(self) -> Schedule:
        p = self.policy
        scalar = self.scalar_path()
        pre, chunk = self.vector_chunk(scalar) if p.vector_width > 1 else ([], scalar)
        body = self.thread_body(pre, chunk)
        summary = (f"{self.graph.name}: elementwise over [{', '.join(self.grid)}], "
                   f"{p.elements_per_thread} elements per thread ({p.vector_width}-wide vector "
                   f"loads/stores where contiguous), {'64' if self.index64 else '32'}-bit "
                   f"indexing")
        kernel = make_kernel(self.graph, self.index64,
                             (ir.ThreadInput("mf_tid", "uint", "thread_position_in_grid"),),
                             body, summary, variant=self.variant, params=self._params(),
                             helpers=tuple(sorted(self.uses.helpers)))
        return Schedule("elementwise", self.graph, p, kernel, tuple(self.grid),
                        tuple(dict.fromkeys([*(t.name for t in self.vec_in),
                                             *(n.attr[0] for n in self.row_gathers)])),
                        self.index64,
                        lane_gathers=tuple(self.uses.lane_takes))

    def _params(self) -> tuple[ir.Argument, ...]:
        return kernel_params(self, numel=True, what=" (tensors, outputs, scalars and sizes)")


class ParamSource(Protocol):
    """What `kernel_params` reads off a schedule builder or context."""
    @property
    def graph(self) -> Graph: ...

    @property
    def inputs(self) -> list[TensorParam]: ...

    @property
    def names(self) -> dict[str, str]: ...

    @property
    def out_names(self) -> list[str]: ...

    @property
    def scalars(self) -> list[ScalarParam]: ...

    @property
    def sizes_used(self) -> list[str]: ...

    @property
    def index64(self) -> bool: ...

    def in_stype(self, t: TensorParam) -> str: ...

    def out_stype(self, k: int) -> str: ...


def kernel_params(b: ParamSource, numel: bool = False, what: str = "",
                  proven: Optional[frozenset[int]] = None) -> tuple[ir.Argument, ...]:
    """The kernel's parameter list, in binding order: the inputs it reads, the outputs, the
    scalars it uses, [mf_numel,] the axis sizes it uses. `b` is a schedule builder (its graph
    `graph`, `inputs`, `names`, `in_stype`, `out_names`, `out_stype`, `scalars`, `sizes_used`,
    `index64`); `what` goes after "kernel arguments" in the too-many-arguments error. A
    gather's error report (mf_err) is there when some gather is not in `proven` (None: the
    gathers `ranges.proven_sites` proves in range, which `ElementLowering` reads unchecked)."""
    ps: list[ir.Argument] = []
    add = partial(add_param, ps)
    for t in b.inputs:
        add(b.names[t.name], "buffer", b.in_stype(t), ("input", t.name))
    for k in range(len(b.graph.outputs)):
        add(b.out_names[k], "buffer", b.out_stype(k), ("output", k), writable=True)
    add_scalars(ps, b.names, b.scalars)
    checked = set(range(len(take_sites(b.graph))))
    if checked - (ranges.proven_sites(b.graph) if proven is None else proven):
        add("mf_err", "buffer", "int", ("error",), writable=True)
    if numel:
        add("mf_numel", "scalar", IDX, ("numel",), cast=index_cast(b.index64))
    return with_sizes(ps, b.graph.name, b.sizes_used, b.index64, what)


def add_param(ps: list[ir.Argument], name: str, kind: str, typ: str,
              binds: tuple[str | int, ...], writable: bool = False,
              cast: Optional[str] = None) -> None:
    """Kernel argument `name` appended to `ps` (its index: its place)."""
    ps.append(ir.Argument(name, len(ps), kind, typ, binds, writable, cast))


def add_scalars(ps: list[ir.Argument], names: Mapping[str, str],
                scalars: Iterable[ScalarParam]) -> None:
    """The runtime scalars (MSL names `names`), each passed as its own type."""
    for s in scalars:
        add_param(ps, names[s.name], "scalar", s.dtype.msl, ("scalar", s.name),
                  cast=_SCALAR_CASTS.get(s.dtype.name))


def index_cast(index64: bool) -> Optional[str]:
    """How an index-typed scalar (an element count, a size) is passed: int32 unless 64-bit."""
    return None if index64 else "int32"


def with_sizes(ps: list[ir.Argument], kernel: str, sizes_used: Iterable[str], index64: bool,
               what: str = "") -> tuple[ir.Argument, ...]:
    """`ps` and the sizes of the axes `sizes_used` (mf_size_<axis>), checked to fit Metal's
    buffer slots (`what` goes after "kernel arguments" in that error)."""
    for a in sizes_used:
        add_param(ps, f"mf_size_{ident(a)}", "scalar", IDX, ("size", a),
                  cast=index_cast(index64))
    if len(ps) > MAX_BUFFERS:
        raise UnsupportedConstruct(
            f"kernel '{kernel}' needs {len(ps)} kernel arguments{what}, over Metal's "
            f"{MAX_BUFFERS} buffer slots; split it into smaller kernels")
    return tuple(ps)
