"""What a scan kernel is built from: the graph checked for what the scan schedule takes (one
scan axis, no reductions, no scan of a scan, value types it accumulates), its `Scan`s, and the
reduction context the rows and column schedules share (`reduce.ReductionContext`: names,
sizes, positions of the thread's row or column, the element cone of a value)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...errors import UnsupportedConstruct, at
from ...graph import Graph, Node, Op, ScanOp, scan_reversed, topo_order
from .. import reduce
from ..column import ColumnContext
from ..lower import compute_type
from ..policy import LaunchPolicy, access_width
from ..rows import is_row
from ..rows.context import RowContext

# what a scan's element combines with its running value
SUMS = (ScanOp.CUMSUM,)


@dataclass(frozen=True)
class Scan:
    """One scan of the kernel: its node, kind and number (register array mf_scan{i}, running
    value mf_run{i}, carry mf_carry{i})."""
    node: Node
    kind: ScanOp
    i: int
    slot: int = 0          # its first float of a segment's totals in scratch (`floats` of them)

    @property
    def floats(self) -> int:
        """Floats of a segment's total in scratch: a segmented cumsum's pair takes two."""
        return 2 if self.kind == ScanOp.SEGSUM else 1

    @property
    def arg(self) -> Node:
        return self.node.args[0]

    @property
    def acc_type(self) -> str:
        """MSL type of the running value (`reduce.accumulator_type`; a segmented cumsum's
        float2 pair, `blocks.combine`)."""
        if self.kind == ScanOp.SEGSUM:
            return "float2"
        return reduce.accumulator_type(self.arg.dtype)

    @property
    def is_float(self) -> bool:
        return self.arg.dtype.is_float

    @property
    def value_type(self) -> str:
        """The compute type of the scan's result (what element lowerings read)."""
        return compute_type(self.node.dtype)

    @property
    def args(self) -> tuple[Node, ...]:
        """The nodes each element reads: the argument (and a segmented cumsum's `end`)."""
        return self.node.args

    def name(self, what: str) -> str:
        return f"mf_{what}{self.i}"


def scans_of(graph: Graph) -> list[Scan]:
    """The graph's scans, numbered in dependency order, their totals' scratch slots in turn."""
    out: list[Scan] = []
    for i, n in enumerate(n for n in graph.nodes() if n.op == Op.SCAN):
        out.append(Scan(n, n.attr[0], i + 1, out[-1].slot + out[-1].floats if out else 0))
    return out


def match(graph: Graph) -> Optional[str]:
    """The scan axis of a graph with scans (after `check`), None for a graph without."""
    scans = scans_of(graph)
    if not scans:
        return None
    check(graph, scans)
    axis: str = scans[0].node.attr[1]
    return axis


def check(graph: Graph, scans: list[Scan]) -> None:
    """What the scan schedule takes, or an UnsupportedConstruct naming the construct and what
    to write instead."""
    where = f"kernel '{graph.name}'"
    axis = scans[0].node.attr[1]
    for s in scans:
        if s.node.attr[1] != axis:
            raise UnsupportedConstruct(
                f"{where}: scans along several axes ({axis!r}, {s.node.attr[1]!r}), "
                f"mf.{s.kind}(..., {s.node.attr[1]!r}){at(s.node.loc)}; one kernel scans one "
                f"axis: split it into one kernel per axis")
        if scan_reversed(s.node) != scan_reversed(scans[0].node):
            raise UnsupportedConstruct(
                f"{where}: scans in both directions along {axis!r} (mf.{s.kind}"
                f"{at(s.node.loc)} and mf.{scans[0].kind}{at(scans[0].node.loc)}, one with "
                f"reverse=True): one kernel scans one way; split it into one kernel each")
        inner = [n for n in topo_order(s.node.args) if n.op == Op.SCAN]
        if inner:
            raise UnsupportedConstruct(
                f"{where}: mf.{s.kind}{at(s.node.loc)} scans the result of "
                f"mf.{inner[0].attr[0]}{at(inner[0].loc)}: a scan of a scan needs the whole "
                f"first scan first; split it into two kernels")
        check_type(graph, s)
    for n in graph.nodes():
        if n.op == Op.REDUCE:
            raise UnsupportedConstruct(
                f"{where}: a scan (mf.{scans[0].kind}{at(scans[0].node.loc)}) and a reduction "
                f"(mf.{n.attr[0]}{at(n.loc)}) in one kernel: the scan schedule keeps every "
                f"axis; split it into a reduction kernel and a scan kernel")
        if n.op in (Op.TAKE, Op.UNPACK):
            what = "mf.take" if n.op == Op.TAKE else "mf.unpack"
            raise UnsupportedConstruct(
                f"{where}: {what}{at(n.loc)} in a scan kernel: the scan schedule reads "
                f"tensors at the element's own position; gather or unpack in a kernel "
                f"before the scan")
        lost = next((x for a in n.args for x in a.axes if x not in n.axes), None)
        if lost is not None:
            raise UnsupportedConstruct(
                f"{where}: axis '{lost}' broadcast against its base{at(n.loc)} in a scan "
                f"kernel: the scan schedule reads every tensor at the element's own position")
    for o in graph.outputs:
        if axis not in o.axes:
            raise UnsupportedConstruct(
                f"{where}: an output over {list(o.axes)}, without the scan axis '{axis}': "
                f"every output of a scan kernel runs along the scan axis (write the per-row "
                f"values from another kernel)")


def check_type(graph: Graph, s: Scan) -> None:
    """Float values; max/min of integers up to 32 bits (cumsum and cumprod of integers give
    i64 in torch, which simdgroup collectives do not move)."""
    dt = s.arg.dtype
    if dt.is_float or (s.kind in (ScanOp.CUMMAX, ScanOp.CUMMIN) and dt.is_int and
                       dt.itemsize <= 4):
        return
    if s.kind in (ScanOp.CUMSUM, ScanOp.CUMPROD):
        what = (f"an integer or bool value gives i64, as in torch, which the scan schedule does "
                f"not accumulate (no 64-bit simdgroup prefix); scan floats: "
                f"mf.{s.kind}(x.to(mf.f32), ...)")
    else:
        what = (f"{dt} values cannot be scanned (floats and integers up to 32 bits can); "
                f"convert first, e.g. mf.{s.kind}(x.to(mf.i32), ...)")
    raise UnsupportedConstruct(f"kernel '{graph.name}': mf.{s.kind}{at(s.node.loc)}: {what}")


def is_inner(graph: Graph, axis: str) -> bool:
    """Whether the scan axis is innermost (contiguous) in every tensor and output that has
    it: the row kernel; otherwise the column kernel."""
    return is_row(graph, axis)


def row_context(graph: Graph, policy: LaunchPolicy, index64: bool, axis: str) -> RowContext:
    """The context of the row kernel (the rows schedule's loads and stores read it)."""
    red = reduce.reduction_context(graph, policy, index64, axis, "row", "scan")
    itemsizes = frozenset({t.dtype.itemsize for t in red.inputs if axis in t.axes} |
                          {o.dtype.itemsize for o in graph.outputs} or {4})
    return RowContext(**reduce.context_fields(red), itemsizes=itemsizes,
                      loaded_gathers={"scan": set()})


def column_context(graph: Graph, policy: LaunchPolicy, index64: bool,
                   axis: str) -> ColumnContext:
    """The context of the column kernel (the column schedule's per-column offsets read it)."""
    red = reduce.reduction_context(graph, policy, index64, axis, "col", "scan")
    return ColumnContext(**reduce.context_fields(red))


def reads(ctx: RowContext) -> int:
    """Elements each thread of the row kernel holds per chunk (reads_per_thread)."""
    return ctx.policy.reads_per_thread


def mirrored(graph: Graph) -> bool:
    """Whether the graph's scans run from the axis's end (reverse=True; `check` makes them
    all run one way): its kernels read and write position D - 1 - p where a forward scan's
    read p, so the same scan code runs on the mirrored row, nothing copied."""
    return any(s.node.op == Op.SCAN and scan_reversed(s.node) for s in scans_of(graph))


def vector_width(ctx: RowContext) -> int:
    """Elements per vector access of the row kernel: at most 16 bytes of the widest row
    tensor, the policy's vector_width and the thread's reads (`access_width`); scalar
    accesses in a reverse scan's (`mirrored`: its slots run down the row)."""
    if mirrored(ctx.graph):
        return 1
    return access_width(min(ctx.policy.vector_width, reads(ctx)), set(ctx.itemsizes))
