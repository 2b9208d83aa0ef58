"""Outputs written into tensors the caller owns: `kernel(..., out=t)` and declared in-place
outputs (`@mf.kernel(inplace=...)`).

A call normally allocates its outputs. With `out=` (one tensor, or a tuple with one entry per
output, None where the call should allocate) or an output the kernel declares as written into
one of its arguments, the launch binds the caller's tensor instead: the kernel's stores land in
its storage at its offset (a row of a KV cache, `cache[pos]`, is written in place; no temporary
and no copy), and the call returns that tensor. The generated Metal is the same either way.

`given` resolves a call's out tensors; `place` checks them against the call (dtype, shape,
device, contiguity, the alignment the kernel's vector stores need) and `check_aliasing` refuses
an out that overlaps an input the kernel reads, except where the kernel reads each element of
that input only at the position it writes, from the same thread (`element_for_element`).
"""
from __future__ import annotations

from typing import Any, Callable, Collection, Iterator, Mapping, Optional, Sequence, Union

import torch

from .. import ir
from ..errors import BindingError, DeviceError, ShapeError, UnsupportedConstruct, kernel_at
from ..graph import Graph, Node, Op
from ..once import OnceMap


class Outs(tuple[Optional[torch.Tensor], ...]):
    """The tensors a call writes its outputs into, one entry per output (None: allocated), and
    how errors name each: "out", "out[1]", or the argument a declared in-place output is."""
    labels: tuple[str, ...]

    def __new__(cls, items: Sequence[Optional[torch.Tensor]],
                labels: Sequence[str] = ()) -> Outs:
        self = super().__new__(cls, items)
        n = len(self)
        self.labels = tuple(labels) or tuple("out" if n == 1 else f"out[{i}]" for i in range(n))
        return self

    def label(self, i: int) -> str:
        return self.labels[i]

# what `inplace=` declares: output index -> the tensor parameter it is written into
Inplace = tuple[tuple[int, str], ...]
ELEMENTWISE_OPS = (Op.UNARY, Op.BINARY, Op.WHERE, Op.CAST)


class AliasError(BindingError):
    """An `out` tensor that overlaps an input the kernel reads (or another `out`) where the
    kernel would read elements after writing them."""


# --------------------------------------------------------------------------- declaring

def declare_inplace(spec: Union[None, str, Mapping[int, str]], tensors: Sequence[str],
                    where: str) -> Inplace:
    """`@mf.kernel(inplace=...)` checked: "cache" (the kernel's one output is written into
    argument 'cache') or {output index: argument name}."""
    if spec is None:
        return ()
    items = {0: spec} if isinstance(spec, str) else spec
    if not isinstance(items, Mapping):
        raise BindingError(f"{where}: inplace= takes an argument name (\"cache\") or a dict "
                           f"{{output index: argument name}}, got {spec!r}")
    out: list[tuple[int, str]] = []
    for i, name in items.items():
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise BindingError(f"{where}: inplace={spec!r}: {i!r} is not an output index "
                               "(0 for the first output)")
        if name not in tensors:
            raise BindingError(f"{where}: inplace={spec!r}: output {i} is declared written "
                               f"into {name!r}, which is not a tensor parameter (tensor "
                               f"parameters: {', '.join(tensors) or 'none'})")
        if any(name == n for _, n in out):
            raise BindingError(f"{where}: inplace={spec!r}: two outputs are declared written "
                               f"into '{name}'")
        out.append((i, name))
    return tuple(sorted(out))


# --------------------------------------------------------------------------- resolving

def _where(graph: Graph) -> str:
    return kernel_at(graph.name, graph.loc)


def given(graph: Graph, values: Mapping[str, Any], out: Any, inplace: Inplace,
          is_array: Callable[[Any], bool]) -> Optional[Outs]:
    """The tensors a call writes its outputs into, one entry per output (None: allocate), or
    None when the call allocates them all. MLX arrays are immutable: an explicit `out=` is
    refused, and a declared in-place output is returned as a fresh array."""
    where, n = _where(graph), len(graph.outputs)
    mlx = any(is_array(v) for v in values.values())
    if out is not None and mlx:
        raise UnsupportedConstruct(
            f"{where}: out= on MLX arrays: mx arrays are immutable, so no kernel can write into "
            "one; drop out= and use the array the call returns")
    outs: list[Optional[torch.Tensor]] = list(split(where, out, n)) if out is not None \
        else [None] * n
    labels = list(Outs(outs).labels)
    for i, name in inplace:
        if i >= n:
            raise BindingError(f"{where}: inplace= declares output {i} written into '{name}', "
                               f"but the kernel has {n} output(s)")
        if outs[i] is not None:
            raise BindingError(f"{where}: output {i} is declared written into argument "
                               f"'{name}' (inplace=); pass None for it in out=")
        if not mlx:
            outs[i] = values[name]
            labels[i] = f"argument '{name}' (written in place)"
    return Outs(outs, labels) if any(o is not None for o in outs) else None


def split(where: str, out: Any, n: int) -> tuple[Optional[torch.Tensor], ...]:
    """`out=` as one entry per output (a tensor for a kernel of one output), checked."""
    if isinstance(out, torch.Tensor):
        if n != 1:
            raise BindingError(f"{where}: the kernel has {n} outputs; pass out=(t0, t1, ...) "
                               f"with {n} entries (None where the call should allocate)")
        return (out,)
    if not isinstance(out, (tuple, list)) or len(out) != n:
        raise BindingError(f"{where}: out= takes {'a tensor' if n == 1 else ''}"
                           f"{' or ' if n == 1 else ''}a tuple of {n} tensor(s) (None where "
                           f"the call should allocate), got {_describe(out)}")
    for i, t in enumerate(out):
        if t is not None and not isinstance(t, torch.Tensor):
            raise BindingError(f"{where}: out[{i}] must be a torch.Tensor or None, got "
                               f"{type(t).__name__}")
    return tuple(out)


def _describe(v: Any) -> str:
    return f"a {type(v).__name__} of {len(v)}" if isinstance(v, (tuple, list)) else \
        type(v).__name__


def refuse_grad(graph: Graph, values: Mapping[str, Any], outs: Outs) -> None:
    """Like torch's out= functions: a call that writes into given tensors records no autograd
    graph, so it is refused while grad mode is on and a tensor involved requires grad."""
    if not torch.is_grad_enabled():
        return
    need = [n for n, v in values.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    need += [outs.label(i) for i, o in enumerate(outs) if o is not None and o.requires_grad]
    if need:
        raise BindingError(
            f"{_where(graph)}: a call with out= (or an in-place output) does not support "
            f"automatic differentiation, but {', '.join(need)} require(s) grad; call it under "
            "torch.no_grad() if no gradient is needed, or without out= to differentiate")


# --------------------------------------------------------------------------- checking

def place(where: str, graph: Graph, outs: Outs, shapes: Sequence[tuple[int, ...]],
          device: torch.device) -> list[torch.Tensor]:
    """The call's output tensors: each given one checked (dtype, shape, device, contiguity),
    the others allocated."""
    placed: list[torch.Tensor] = []
    for i, (o, t, shape) in enumerate(zip(graph.outputs, outs, shapes)):
        if t is None:
            placed.append(torch.empty(shape, dtype=o.dtype.torch, device=device))
            continue
        what = f"{where}: {outs.label(i)} (output {i}, axes [{', '.join(o.axes)}])"
        if t.dtype != o.dtype.torch:
            raise BindingError(f"{what} has dtype {t.dtype}, but the output is "
                               f"{o.dtype.torch}; pass a {o.dtype.torch} tensor")
        if tuple(t.shape) != tuple(shape):
            raise ShapeError(f"{what} has shape {tuple(t.shape)}, but the arguments bind the "
                             f"output to {tuple(shape)}")
        if t.device != device:
            raise DeviceError(f"{what} is on {t.device}, but the arguments are on {device}")
        if not t.is_contiguous():
            raise BindingError(
                f"{what} is not contiguous (strides {tuple(t.stride())}); the kernel writes "
                f"its outputs densely, so pass a contiguous tensor (a view at an offset is "
                "fine: a row of a cache, cache[pos]), or call without out= and copy the "
                "result with t.copy_(...)")
        placed.append(t)
    return placed


def check_alignment(where: str, graph: Graph, outs: Outs, widths: Mapping[int, int]) -> None:
    """An out written with vector stores of `w` elements must start at a storage offset that is
    a multiple of `w` (Metal and CUDA vector stores need it aligned)."""
    for i, t in enumerate(outs):
        w = widths.get(i, 1)
        if t is not None and w > 1 and t.numel() and t.storage_offset() % w:
            raise BindingError(
                f"{where}: {outs.label(i)} starts at storage offset {t.storage_offset()}, but "
                f"this kernel writes output {i} with vector stores of {w} elements, which "
                f"need an offset that is a multiple of {w}; pass a view that starts at such "
                "an offset, or call without out= and copy the result")


def store_widths(kernels: Sequence[ir.LoweredKernel]) -> dict[int, int]:
    """Output index -> the widest vector store of it in these kernels."""
    names = {p.name: int(p.binds[1]) for p in kernels[0].params if p.binds[0] == "output"}
    widths: dict[int, int] = {}
    for k in kernels:
        for s in _stores(k.body):
            if s.buffer in names and s.space == "device":
                i = names[s.buffer]
                widths[i] = max(widths.get(i, 1), s.width)
    return widths


def _stores(stmts: Any) -> Iterator[ir.Store]:
    for s in stmts:
        if isinstance(s, ir.Store):
            yield s
        for v in vars(s).values() if hasattr(s, "__dict__") else ():
            if isinstance(v, (list, tuple)) and v and not isinstance(v[0], (str, int)):
                yield from _stores(v)


# --------------------------------------------------------------------------- aliasing

def byte_range(t: torch.Tensor) -> tuple[int, int, int]:
    """(storage, first byte, one past the last byte) of the memory `t` spans: exact for a
    contiguous tensor, the enclosing span for a strided one."""
    start = t.storage_offset()
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    low = start + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if st < 0)
    es = t.element_size()
    return t.untyped_storage().data_ptr(), int(low * es), int((low + span) * es)


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, a0, a1 = byte_range(a)
    sb, b0, b1 = byte_range(b)
    return sa == sb and a0 < b1 and b0 < a1 and a0 < a1 and b0 < b1


def same_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether element k of `a` is element k of `b` for every k (the same memory, laid out
    alike, both contiguous)."""
    return (a.data_ptr() == b.data_ptr() and a.numel() == b.numel() and a.is_contiguous()
            and b.is_contiguous() and a.dtype == b.dtype)


def reads(graph: Graph) -> dict[str, list[Node]]:
    """Tensor parameter -> the nodes that read it (loads and gathers)."""
    names = {t.name for t in graph.tensors}
    out: dict[str, list[Node]] = {}
    for n in graph.nodes():
        a = n.attr
        src = a if n.op == Op.LOAD else a[0] if isinstance(a, tuple) and a else None
        if isinstance(src, str) and src in names and n.op not in (Op.SCALAR, Op.INDEX,
                                                                     Op.SIZE, Op.CONST):
            out.setdefault(src, []).append(n)
    return out


def element_for_element(graph: Graph, family: str, name: str, output: int) -> Optional[str]:
    """None when writing output `output` over input `name` (the same memory) gives the right
    answer: every read of `name` is a load at the output's axes, used only through elementwise
    ops by outputs over the same axes, in a schedule whose threads store exactly the elements
    they loaded (the elementwise family). Else why not, as words for the error."""
    p, o = graph.tensor(name), graph.outputs[output]
    if any(n.op == Op.TAKE and n.attr[0] == name for n in graph.nodes()):
        return f"the kernel gathers from '{name}' (mf.take): it reads other elements"
    if p.axes != o.axes or any(d.derived or d.joined for d in p.dims):
        return (f"'{name}' (axes [{', '.join(p.axes)}]) is not laid out like output {output} "
                f"(axes [{', '.join(o.axes)}])")
    tainted: set[int] = set()
    for n in graph.nodes():
        if n.op == Op.LOAD and n.attr == name:
            tainted.add(id(n))
        elif any(id(a) in tainted for a in n.args):
            if n.op not in ELEMENTWISE_OPS:
                return (f"the kernel reads '{name}' through a {n.op} (it combines elements "
                        "of different positions)")
            tainted.add(id(n))
    for k, out in enumerate(graph.outputs):
        if id(out.node) in tainted and set(out.axes) != set(p.axes):
            return (f"output {k} (axes [{', '.join(out.axes)}]) broadcasts '{name}', so "
                    "several threads read each of its elements")
    if family != "elementwise":
        return (f"this is a {family} kernel, and only elementwise kernels are known to read "
                f"each element of '{name}' in the thread that writes it")
    return None


def check_aliasing(where: str, graph: Graph, family: str, outs: Outs,
                   tensors: Mapping[str, torch.Tensor],
                   read: Optional[Collection[str]] = None) -> None:
    """Refuse an out that overlaps another out, or an input the kernel reads (`read`: their
    names, default `reads(graph)`), unless that input is the out itself element for element
    and `element_for_element` allows it."""
    given = [(i, t) for i, t in enumerate(outs) if t is not None and t.numel()]
    for k, (i, t) in enumerate(given):
        for j, u in given[k + 1:]:
            if overlaps(t, u):
                raise AliasError(f"{where}: {outs.label(i)} and {outs.label(j)} overlap in "
                                 "memory; each output needs its own memory")
    read = reads(graph) if read is None else read
    for i, t in given:
        for name, src in tensors.items():
            if name not in read or not src.numel() or not overlaps(t, src):
                continue
            why = element_for_element(graph, family, name, i) if same_elements(t, src) else \
                f"'{name}' and {outs.label(i)} overlap at different positions"
            if why is not None:
                raise AliasError(
                    f"{where}: {outs.label(i)} overlaps input '{name}', which the kernel "
                    f"reads: {why}, so some elements would be read after they were "
                    f"overwritten (wrong results). Pass an out that does not overlap "
                    f"'{name}', or pass {name}.clone()")


# --------------------------------------------------------------------------- at the call

_widths: OnceMap[int, tuple[Any, dict[int, int]]] = OnceMap()    # id(schedule) -> widths


def widths(schedule: Any) -> dict[int, int]:
    """`store_widths` of a schedule's kernels (computed once per schedule)."""
    return _widths.get_or_build(id(schedule), lambda: (schedule, store_widths(schedule.kernels)),
                                lambda got: got[0] is schedule)[1]


def check_given(where: str, graph: Graph, family: str, outs: Outs,
                tensors: Mapping[str, torch.Tensor], schedule: Optional[Any]) -> None:
    """The checks of given outs that need the schedule (`schedule`: the one the call launches,
    None when it launches nothing): the alignment its vector stores need, and aliasing."""
    if schedule is not None:
        check_alignment(where, graph, outs, widths(schedule))
    check_aliasing(where, graph, family, outs, tensors)
