"""The named-axis op graph: what tracing produces, what scheduling and the reference consume.

A `Graph` is one specialisation of a kernel: every dtype variable and every `mf.Const` value is
already bound, so the graph holds concrete dtypes and no Python control flow. Sizes of axes are
*not* bound: they are runtime values the wrapper reads off the tensors.

Axes are strings. A plain dim is its name (``"D"``); a derived dim is its canonical text
(``"K/8"``) and an `AxisSpec` says how its size follows from its base; a batch dim ``*B`` is
the single axis ``"B"`` whose size is the product of the leading dims (the wrapper flattens).
Broadcasting is by axis name, so a node's ``axes`` is a set written in a canonical order: the
order in which the axes first appear in the kernel's parameters (then in ``mf.index`` calls).
A derived axis that is a whole division of its base (``"K/64"``) broadcasts against the base:
element k of the result reads element k // 64 of the derived axis (`broadcasts_over`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Iterator, Optional

from .dtypes import DType

# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class AxisSpec:
    """One dim of an annotation. size = (size(base) * mul) // div + add for derived dims."""
    name: str                   # canonical text: "D", "K/8", "N*2+1", or the batch name "B"
    base: Optional[str] = None  # derived dims: the dim they are computed from
    mul: int = 1
    div: int = 1
    add: int = 0
    batch: bool = False         # "*B": any number of leading dims, flattened into one axis
    joined: bool = False        # "(G R)": R shares G's storage dim (G outer, R inner)
    size: Optional[int] = None  # a literal dim ("T[C, 4]", "T[C, K=4]"): its fixed size

    @property
    def derived(self) -> bool:
        return self.base is not None

    @property
    def anonymous(self) -> bool:
        """A literal dim the user did not name ("4" in "T[C, 4]"): its axis is named after the
        parameter and dim, "w[1]", and is no other tensor's axis."""
        return self.size is not None and "[" in self.name


@dataclass(frozen=True)
class TensorParam:
    name: str
    dtype: DType                    # concrete (after specialisation)
    dtype_var: Optional[str]        # "T" when annotated with a dtype variable, else None
    dims: tuple[AxisSpec, ...]      # in storage order; the last is the contiguous one
    annotation: str                 # the user's text, for error messages

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    @property
    def storage(self) -> tuple[tuple[AxisSpec, ...], ...]:
        """The axes of each storage dim: one each, several for a grouped dim "(G R)"."""
        out: list[tuple[AxisSpec, ...]] = []
        for d in self.dims:
            if d.joined and out:
                out[-1] += (d,)
            else:
                out.append((d,))
        return tuple(out)


@dataclass(frozen=True)
class ScalarParam:
    """A runtime scalar (`float`, `int`, `bool` annotation): a kernel argument, no recompile."""
    name: str
    pytype: type                    # float | int | bool
    dtype: DType                    # the width the kernel declares and the wrapper binds
    default: Any = None
    has_default: bool = False


@dataclass(frozen=True)
class ConstParam:
    """A compile-time constant (`mf.Const[int]`/`mf.Const[bool]`): one variant per value."""
    name: str
    pytype: type
    default: Any = None
    has_default: bool = False


Param = TensorParam | ScalarParam | ConstParam

# --------------------------------------------------------------------------- nodes

class _Name(str, Enum):
    """A `str` enum that equals, hashes, prints and formats as its lower-case name ("load"),
    so code and data that still spell it as a string keep working."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class Op(_Name):
    """What a graph node computes; its `attr` says which one:

        LOAD    attr = tensor parameter name                  args = ()
        SCALAR  attr = scalar parameter name                  args = ()
        CONST   attr = Python value (int/float/bool)          args = ()
        INDEX   attr = axis name  (position along the axis, i64)
        SIZE    attr = axis name  (size of the axis, i64)
        UNARY   attr = a `UnaryOp`                            args = (x,)
        BINARY  attr = a `BinaryOp`                           args = (a, b)
        WHERE   attr = None                                   args = (cond, a, b)
        CAST    attr = None (target is node.dtype)            args = (x,)
        REDUCE  attr = (kind, axis), kind a `ReduceOp`        args = (x,)
        UNPACK  attr = bits (values per u32 word: 32 // bits)  args = (words,)
                words: a u32 value whose innermost axis is "K/(32/bits)"; the node is over
                "K": element k is bits [(k % (32/bits)) * bits, ...) of word k / (32/bits)
                (MLX's affine layout), an i32 in [0, 2**bits)
        TAKE    attr = (tensor parameter name, axis)          args = (index,)
                the tensor's element at position `index` along `axis` (its other axes at
                this element's positions): a gather. The node's axes are the tensor's without
                `axis`, plus the index's. An index outside [0, size) is an error the kernel
                reports (`take_sites` numbers the TAKE nodes for its report)
        TAKE_VALUE  attr = axis                           args = (value, index)
                `mf.take` of a computed value: `value`'s element at position `index` along
                `axis` (its other axes at this element's positions). Axes as TAKE's. Only a
                quantized matvec's epilogue lowers it, along its rows axis, with the index
                proven in range (`schedule/quant/gathers.py`)
        SCATTER attr = (axis, deterministic)                  args = (values, index)
                `mf.scatter_add`: a zeroed output over the values' and index's axes less the
                index's, plus `axis` (an axis of a tensor parameter); element e of the values
                is added at position index[e] along `axis`. A kernel's only output; an index
                outside [0, size) is reported like a gather's (`scatter_sites`, numbered after
                the TAKE nodes)
        SCAN    attr = (kind, axis), kind a `ScanOp`          args = (x,)
                the inclusive scan of x along `axis` (torch.cumsum and friends): the node
                keeps x's axes; element i combines x's elements 0..i along `axis`;
                attr = (kind, axis, True): the reverse scan (`scan_reversed`), element i
                combines elements i..n-1 (from the axis's end)
        RANDOM  attr = a `RandomOp` (the distribution)         args = (seed, offset)
                `mf.rand` / `mf.randn`: one Philox-4x32-10 draw per element of the node's
                axes (a leaf: no tensor read, no gradient); seed and offset are zero-dim
                integer values (runtime ints); the counter is the element's row-major linear
                position over the node's axes (canonical order) and the offset
                (`metalforge.philox` says exactly how)"""
    LOAD = "load"
    SCALAR = "scalar"
    CONST = "const"
    INDEX = "index"
    SIZE = "size"
    UNARY = "unary"
    BINARY = "binary"
    WHERE = "where"
    CAST = "cast"
    REDUCE = "reduce"
    UNPACK = "unpack"
    TAKE = "take"
    TAKE_VALUE = "take_value"
    SCATTER = "scatter"
    SCAN = "scan"
    RANDOM = "random"


class _Kind(_Name):
    """A sub-op (a node's attr, or a reduction's kind): its repr is its name's too, so the
    text of a graph (`tuning.cache.graph_text`, the key of tuned launches) reads as it did
    when sub-ops were strings."""

    def __repr__(self) -> str:
        return str.__repr__(self)


class UnaryOp(_Kind):
    """The function of a UNARY node (`mf.exp`, `-x`, `~x`, `not`...)."""
    NEG = "neg"
    EXP = "exp"
    EXP2 = "exp2"
    LOG = "log"
    LOG2 = "log2"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    SIN = "sin"
    COS = "cos"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    ERF = "erf"
    ABS = "abs"
    FLOOR = "floor"
    CEIL = "ceil"
    INVERT = "invert"
    NOT = "not"


class BinaryOp(_Kind):
    """The operator of a BINARY node (arithmetic, comparisons, bitwise and logical ops)."""
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    MOD = "mod"
    FLOORDIV = "floordiv"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    AND = "and"
    OR = "or"
    XOR = "xor"
    SHL = "shl"
    SHR = "shr"


class ReduceOp(_Kind):
    """The kind of a REDUCE node (mean = sum / size)."""
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"
    ARGMAX = "argmax"
    ARGMIN = "argmin"


class ScanOp(_Kind):
    """The kind of a SCAN node: the DSL function (and torch's) of the same name."""
    CUMSUM = "cumsum"
    CUMPROD = "cumprod"
    CUMMAX = "cummax"
    CUMMIN = "cummin"
    LOGCUMSUMEXP = "logcumsumexp"
    # internal (no DSL function: cummax/cummin's gradient, `adjoints.running_grad`): args =
    # (x, end), end a bool; the cumsum of x that restarts after each element where `end` is
    # true: element i sums x from the element after the latest end strictly before i (in scan
    # order) through i, in order (a segmented scan, exact: no difference of two cumsums)
    SEGSUM = "segsum"


class RandomOp(_Kind):
    """The distribution of a RANDOM node: the DSL function of the same name."""
    RAND = "rand"           # uniform in [0, 1)
    RANDN = "randn"         # standard normal (Box-Muller)


@dataclass(eq=False)
class Node:
    """One value in the DAG. Identity semantics: the same Node object is the same value (and
    nodes are dict keys by identity).

    ``dtype`` is the logical (torch-promoted) result dtype; code generation computes f16/bf16
    values in ``dtype.compute`` (f32) and casts only at loads and stores.
    ``weak`` marks Python-scalar-derived values, which follow torch's scalar promotion rules.
    """
    op: Op
    args: tuple["Node", ...]
    dtype: DType
    axes: tuple[str, ...]
    attr: Any = None
    weak: bool = False
    loc: Optional[tuple[str, int]] = None   # (user file, line) that created it

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.attr!r}, {self.dtype}, {list(self.axes)})"


@dataclass(frozen=True)
class Output:
    node: Node
    axes: tuple[str, ...]      # storage order of the output tensor
    dtype: DType


@dataclass
class Graph:
    name: str
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]
    consts: dict[str, Any] = field(default_factory=dict)    # bound Const values
    dtype_vars: dict[str, DType] = field(default_factory=dict)
    loc: Optional[tuple[str, int]] = None                   # where the kernel is defined

    # -- queries used by schedule, reference and runtime --------------------------------
    @property
    def tensors(self) -> tuple[TensorParam, ...]:
        return tuple(p for p in self.params if isinstance(p, TensorParam))

    @property
    def scalars(self) -> tuple[ScalarParam, ...]:
        return tuple(p for p in self.params if isinstance(p, ScalarParam))

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def tensor(self, name: str) -> TensorParam:
        """The tensor parameter `name` (a LOAD node's attr)."""
        p = self.param(name)
        if not isinstance(p, TensorParam):
            raise KeyError(f"{name} is not a tensor parameter")
        return p

    def scalar(self, name: str) -> ScalarParam:
        """The runtime scalar parameter `name` (a SCALAR node's attr)."""
        p = self.param(name)
        if not isinstance(p, ScalarParam):
            raise KeyError(f"{name} is not a runtime scalar parameter")
        return p

    def nodes(self) -> Iterator[Node]:
        """Every node reachable from the outputs, each once, operands before users."""
        return iter(topo_order([o.node for o in self.outputs]))

    def reductions(self) -> list[Node]:
        return [n for n in self.nodes() if n.op == Op.REDUCE]

    def axis_spec(self, axis: str) -> AxisSpec:
        """The spec of an axis: as a tensor declares it, or a plain axis that only appears as
        the base of derived dims (K in "u32[N, K/8]", which mf.unpack brings in)."""
        for t in self.tensors:
            for d in t.dims:
                if d.name == axis:
                    return d
        if any(d.base == axis for t in self.tensors for d in t.dims):
            return AxisSpec(axis)
        raise KeyError(axis)


def take_sites(graph: "Graph") -> list[Node]:
    """The graph's TAKE nodes in a fixed order: a kernel reports an index error by the number
    of its gather in this list. A constant element of a literal dim (`w[:, j]`) is no site: its
    index is known in range (`literal_index`)."""
    return [n for n in graph.nodes() if n.op == Op.TAKE and literal_index(graph, n) is None]


def literal_size(graph: "Graph", axis: str) -> Optional[int]:
    """The fixed size of a literal axis ("T[C, 4]"), None for an axis sized at the call."""
    try:
        return graph.axis_spec(axis).size
    except KeyError:
        return None


def literal_index(graph: "Graph", n: Node) -> Optional[int]:
    """For a TAKE node that reads a constant position of a literal axis (`w[:, j]`, j in
    range: checked while tracing), that position; None for any other gather."""
    idx = n.args[0]
    size = literal_size(graph, n.attr[1])
    if size is None or idx.op != Op.CONST or isinstance(idx.attr, bool):
        return None
    return idx.attr if isinstance(idx.attr, int) and 0 <= idx.attr < size else None


def scan_reversed(n: Node) -> bool:
    """Whether SCAN node `n` runs from the end of its axis (`mf.cumsum(x, axis, reverse=True)`:
    element i combines elements i..n-1)."""
    return len(n.attr) > 2 and bool(n.attr[2])


def scatter_sites(graph: "Graph") -> list[Node]:
    """The graph's SCATTER nodes in a fixed order: a kernel reports an index out of range by
    len(take_sites(graph)) plus the number of its scatter in this list."""
    return [n for n in graph.nodes() if n.op == Op.SCATTER]


def broadcasts_over(spec: AxisSpec) -> bool:
    """Whether a derived axis can broadcast against its base by integer division (K/GS: the
    base scaled by 1/div exactly, nothing added)."""
    return spec.derived and spec.mul == 1 and spec.add == 0 and spec.div > 1


def strip_casts(n: Node) -> Node:
    """The node under any casts of `n`."""
    while n.op == Op.CAST:
        n = n.args[0]
    return n


def topo_order(roots: Iterable[Node], seen: Iterable[Node] = ()) -> list[Node]:
    """Every node reachable from `roots` (in their order), each once, operands before users
    (an iterative post-order walk); nodes in `seen` are skipped, and so is
    everything reachable only through them."""
    visited: set[Node] = set(seen)
    order: list[Node] = []
    for r in roots:
        stack = [(r, False)]
        while stack:
            node, operands_done = stack.pop()
            if operands_done:
                order.append(node)
                continue
            if node in visited:
                continue
            visited.add(node)
            stack.append((node, True))
            stack.extend((a, False) for a in reversed(node.args) if a not in visited)
    return order
