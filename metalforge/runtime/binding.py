"""The binding plan: where each argument of a launch comes from, and the one binder.

A schedule's kernels share one parameter list; each `ir.Argument.binds` names what the runtime
passes there. `BindingPlan.of` turns that list, once per specialisation and index width, into
typed sources (an input tensor, an output, a runtime scalar, an axis size, the grid's element
count, a launch value, the scratch buffer, a gather's report), in argument order. Every runner
reads the plan: the launcher (torch tensors), the warm fast path, the MLX backend.

For torch tensors a checked call resolves the plan into a `Binder` (what varies per call is
data: which inputs need a copy, the shape a batch-flattened input is viewed as, the sizes),
and the binder is compiled to straight-line Python (`Binder.code`). The full path calls that
function (`bound`); the warm path's replay inlines the same lines: the fast binder is the only
binder.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch

from ..dtypes import INT64_MAX, INT64_MIN, check_float, check_int64
from ..errors import kernel_at
from ..graph import Graph, ScalarParam, TensorParam
from ..ir import BIND_KINDS, Argument
from ..schedule import Schedule
from ..shapes import ShapeBinding, flat_shape, output_shape
from .counters import COUNTERS
from .indexcheck import IndexErrors

# --------------------------------------------------------------------------- the sources

@dataclass(frozen=True)
class Indexed:
    """A kernel argument's source: the argument at `index` in the kernels' parameter list.
    The sources that need nothing else (the grid's element count, the scratch buffer, the
    ticket counters, a gather's report) are this with only a name of their own."""
    index: int


@dataclass(frozen=True)
class ParameterSource(Indexed):
    """A graph parameter passed to the kernel: `name`, at `position` among the graph's
    parameters (where a call's values hold it)."""
    name: str
    position: int


@dataclass(frozen=True)
class InputSource(ParameterSource):
    """A tensor argument, read with vector loads of `vector` elements (0: scalar loads);
    `batch`: its leading batch dims are flattened into one."""
    vector: int
    batch: bool


@dataclass(frozen=True)
class OutputSource(Indexed):
    """Output `output` of the graph (a 0-dim output binds as one element)."""
    output: int


@dataclass(frozen=True)
class ScalarSource(ParameterSource):
    """A runtime scalar, passed as a float or as an int checked to fit 64 bits (`where` names
    it in that error)."""
    is_float: bool
    where: str


@dataclass(frozen=True)
class SizeSource(Indexed):
    """The size of axis `axis`."""
    axis: str


@dataclass(frozen=True)
class LaunchSource(Indexed):
    """A per-call launch parameter (`Schedule.launch_value(name, sizes)`)."""
    name: str


@dataclass(frozen=True)
class SortedSource(ParameterSource):
    """An integer tensor argument sorted on the device before the launch (mf.scatter_add's
    deterministic mode): `part` "keys" (its values, ascending, int64) or "order" (where each
    was, int64; stable). The tensor is sorted once per call for both."""
    part: str


class NumelSource(Indexed):
    """The number of output elements the grid covers."""


class ScratchSource(Indexed):
    """A fresh fp32 buffer for partial results passed between a call's launches."""


class CounterSource(Indexed):
    """The ticket counters of a one-launch kernel (runtime/counters.py): zero between launches."""


class ReportSource(Indexed):
    """A gather kernel's 4-int error report (`indexcheck.IndexErrors`)."""


Source = Union[InputSource, OutputSource, ScalarSource, SizeSource, NumelSource, LaunchSource,
               ScratchSource, ReportSource, SortedSource, CounterSource]
FIXED = (SizeSource, NumelSource, LaunchSource)     # the same for every call of given sizes


def _source(p: Argument, graph: Graph, s: Schedule) -> Source:
    """The typed source of one kernel argument (its `binds`, one of `ir.BIND_KINDS`)."""
    kind, rest = p.binds[0], p.binds[1:]
    if kind not in BIND_KINDS:
        raise ValueError(f"argument {p.name}: unknown binding {p.binds!r}")
    position = {q.name: i for i, q in enumerate(graph.params)}
    if kind == "input":
        name = str(rest[0])
        dims = _tensor(graph, name).dims
        return InputSource(p.index, name, position[name],
                           s.policy.vector_width if name in s.vector_inputs else 0,
                           bool(dims and dims[0].batch))
    if kind == "output":
        return OutputSource(p.index, int(rest[0]))
    if kind == "scalar":
        name = str(rest[0])
        scalar = graph.param(name)
        assert isinstance(scalar, ScalarParam)
        return ScalarSource(p.index, name, position[name], scalar.dtype.is_float,
                            f"{kernel_at(graph.name, graph.loc)}, argument '{name}'")
    if kind == "size":
        return SizeSource(p.index, str(rest[0]))
    if kind == "launch":
        return LaunchSource(p.index, str(rest[0]))
    if kind == "numel":
        return NumelSource(p.index)
    if kind == "sorted":
        return SortedSource(p.index, str(rest[0]), position[str(rest[0])], str(rest[1]))
    if kind == "counter":
        return CounterSource(p.index)
    return ScratchSource(p.index) if kind == "scratch" else ReportSource(p.index)


def _tensor(graph: Graph, name: str) -> TensorParam:
    p = graph.param(name)
    assert isinstance(p, TensorParam)
    return p


@dataclass(frozen=True)
class BindingPlan:
    """Every argument's source, in argument order, and the `arg_casts` of the kernels."""
    sources: tuple[Source, ...]
    casts: tuple[tuple[int, str], ...]

    @classmethod
    def of(cls, graph: Graph, s: Schedule) -> BindingPlan:
        params = sorted(s.kernel.params, key=lambda p: p.index)
        assert [p.index for p in params] == list(range(len(params)))
        return cls(tuple(_source(p, graph, s) for p in params),
                   tuple((p.index, p.cast) for p in params if p.cast))

    @property
    def arg_casts(self) -> Optional[dict[int, str]]:
        return dict(self.casts) or None

    @property
    def report(self) -> Optional[int]:
        """The argument index of a gather's error report, if the kernel has one."""
        return next((a.index for a in self.sources if isinstance(a, ReportSource)), None)

    def fixed(self, s: Schedule, sizes: Mapping[str, int],
              numel: Optional[int]) -> dict[int, int]:
        """The values of the sizes, the element count and the launch values, by argument index
        (those that `sizes` and `numel` determine: all of them for a call)."""
        out: dict[int, int] = {}
        for a in self.sources:
            if isinstance(a, SizeSource) and a.axis in sizes:
                out[a.index] = sizes[a.axis]
            elif isinstance(a, NumelSource) and numel is not None:
                out[a.index] = numel
            elif isinstance(a, LaunchSource) and numel is not None:
                out[a.index] = s.launch_value(a.name, sizes)
        return out

    def by_value(self, a: Source, values: Sequence[Any], fixed: Mapping[int, int]) -> Any:
        """A runtime scalar's value (from `values`, in parameter order) or a fixed value."""
        return values[a.position] if isinstance(a, ScalarSource) else fixed[a.index]

    def binder(self, s: Schedule, values: Sequence[Any], binding: ShapeBinding,
               graph: Graph, numel: int) -> Binder:
        """This plan resolved for one checked torch call (`values` in parameter order)."""
        fixed = self.fixed(s, binding.sizes, numel)
        inputs, outputs = [], []
        scratch: Optional[tuple[int, int]] = None
        counter: Optional[tuple[int, int]] = None
        for a in self.sources:
            if isinstance(a, InputSource):
                t = values[a.position]
                flat = flat_shape(binding, _tensor(graph, a.name)) if a.batch else None
                inputs.append((a.index, a.position, not t.is_contiguous(), a.vector,
                               None if flat is None or flat == tuple(t.shape) else flat))
            elif isinstance(a, OutputSource):
                out = output_shape(binding, graph.outputs[a.output])
                outputs.append((a.index, a.output, not out))
            elif isinstance(a, ScratchSource):
                scratch = (a.index, s.scratch_floats(binding.sizes))   # 0: unused here
            elif isinstance(a, CounterSource):
                counter = (a.index, max(1, s.counter_words(binding.sizes)))
        return Binder(len(self.sources), tuple(sorted(fixed.items())), tuple(inputs),
                      tuple(outputs),
                      tuple(a for a in self.sources if isinstance(a, ScalarSource)),
                      scratch, self.report,
                      errors=IndexErrors.of(graph, self.report, binding.sizes,
                                            s.policy.index_check),
                      sorts=tuple(a for a in self.sources if isinstance(a, SortedSource)),
                      counter=counter, where=kernel_at(graph.name, graph.loc))


# --------------------------------------------------------------------------- the binder

def sort_index(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An index tensor flattened and sorted on its device, stably: (keys, order), both int64
    (mf.scatter_add's deterministic mode)."""
    keys, order = torch.sort(t.reshape(-1).to(torch.int64), stable=True)
    return keys, order


def converter(a: ScalarSource) -> Callable[[Any], Any]:
    """What a call passes for a runtime scalar: a float, or an int checked to fit the kernel's
    64-bit integer (checked on every call because values are not in warm keys)."""
    where = a.where
    return (lambda v: check_float(v, where)) if a.is_float else \
        (lambda v: check_int64(v, where))


@dataclass(frozen=True)
class Binder:
    """A binding plan resolved for one kind of call: per input (argument index, position,
    make contiguous, vector width or 0, shape to view it as or None), per output (argument
    index, output index, 0-dim: bind as one element), the scalars, the fixed values
    (argument index, value), the scratch buffer (argument index, fp32 elements) and the
    report's argument index, and what the call does with the report (`errors`)."""
    count: int
    fixed: tuple[tuple[int, int], ...]
    inputs: tuple[tuple[int, int, bool, int, Optional[tuple[int, ...]]], ...]
    outputs: tuple[tuple[int, int, bool], ...]
    scalars: tuple[ScalarSource, ...]
    scratch: Optional[tuple[int, int]]
    report: Optional[int]
    errors: Optional[IndexErrors] = None
    sorts: tuple[SortedSource, ...] = ()
    counter: Optional[tuple[int, int]] = None      # (argument index, words): ticket counters
    where: str = ""

    def code(self, env: dict[str, Any], device: str) -> tuple[list[str], list[str]]:
        """(lines, argument expressions) binding a call's arguments from `values` (parameter
        order) and the outputs `o0`, `o1`, ...: each input made contiguous, or copied to an
        aligned start, and viewed flat as the call needs; the scalars converted; the
        report (`IndexErrors.buffer`: fresh, or a deferred check's persistent one) and a fresh
        scratch buffer on `device` (an expression). Names it reads go in `env`."""
        return self._code(env, device, None)[:2]

    def pointer_code(self, env: dict[str, Any], device: str, itemsize: Sequence[int]
                     ) -> tuple[list[str], list[str], dict[int, str]]:
        """`code` for a launch that reads only the tensors' data pointers (a cuda plan
        inlined in the replay): also {argument index: expression of its data pointer} of the
        inputs and outputs, each input's taken once (`p<i>`) and its aligned start checked on
        the pointer itself (`itemsize`: bytes per element of the argument at each position),
        no views (a view has its tensor's data pointer)."""
        return self._code(env, device, itemsize)

    def _code(self, env: dict[str, Any], device: str, itemsize: Optional[Sequence[int]]
              ) -> tuple[list[str], list[str], dict[int, str]]:
        lines: list[str] = []
        args = [""] * self.count
        ptrs: dict[int, str] = {}
        for i, v in self.fixed:
            env[f"_c{i}"] = v
            args[i] = f"_c{i}"
        for i, pos, contiguous, vector, flat in self.inputs:
            if itemsize is not None:
                lines += _pointer_lines(i, pos, contiguous, vector * itemsize[pos])
                args[i], ptrs[i] = f"a{i}", f"p{i}"
                continue
            lines.append(f"    a{i} = values[{pos}]")
            if contiguous:
                lines.append(f"    a{i} = a{i}.contiguous()")
            elif vector:                       # vector loads need an aligned start
                lines.append(f"    if a{i}.storage_offset() % {vector}:")
                lines.append(f"        a{i} = a{i}.clone()")
            if flat is not None:
                env[f"_flat{i}"] = flat
                lines.append(f"    a{i} = a{i}.view(_flat{i})")
            args[i] = f"a{i}"
        for i, o, zero_dim in self.outputs:     # a 0-dim output binds as one element
            args[i] = f"o{o}.view(1)" if zero_dim else f"o{o}"
            if itemsize is not None:
                args[i], ptrs[i] = f"o{o}", f"o{o}.data_ptr()"
        for a in self.scalars:              # `converter`'s checks, inline (it raises)
            env[f"_conv{a.index}"] = converter(a)
            name, given = f"v{a.index}", f"values[{a.position}]"
            lines += (["    try:", f"        {name} = float({given})", "    except OverflowError:",
                       f"        {name} = _conv{a.index}({given})"] if a.is_float else
                      [f"    {name} = {given}", f"    if not {INT64_MIN} <= {name} <= {INT64_MAX}:",
                       f"        _conv{a.index}({name})"])
            args[a.index] = name
        if self.report is not None:
            assert self.errors is not None
            env["_report"] = self.errors.buffer
            lines.append(f"    err = _report({device})")
            args[self.report] = "err"
        for k, srt in enumerate(self.sorts):
            if all(b.position != srt.position for b in self.sorts[:k]):
                env["_sort"] = sort_index
                lines.append(f"    s{srt.position} = _sort(values[{srt.position}])")
            args[srt.index] = f"s{srt.position}[{0 if srt.part == 'keys' else 1}]"
        if self.scratch is not None and self.scratch[1] == 0:   # not read at these sizes
            env["_unused"] = unused_scratch
            lines.append(f"    scratch = _unused({device})")
            args[self.scratch[0]] = "scratch"
        elif self.scratch is not None:
            i, n = self.scratch
            env["_empty"], env["_float32"] = torch.empty, torch.float32
            lines.append(f"    scratch = _empty({n}, dtype=_float32, device={device})")
            args[i] = "scratch"
        if self.counter is not None:
            i, n = self.counter
            env["_counters"], env["_where"] = COUNTERS.words, self.where
            lines.append(f"    counter = _counters({device}, {n}, _where)")
            args[i] = "counter"
        return lines, args, ptrs


def _pointer_lines(i: int, pos: int, contiguous: bool, align: int) -> list[str]:
    """An input bound by its data pointer `p<i>`: made contiguous, or copied where its start
    is not `align`-byte aligned (vector loads; 0: none needed). The pointer itself is checked:
    a start aligned in its storage (what `storage_offset` says) of a storage that is not (a
    foreign buffer) is copied too."""
    lines = [f"    a{i} = values[{pos}]"]
    if contiguous:
        return lines + [f"    a{i} = a{i}.contiguous()", f"    p{i} = a{i}.data_ptr()"]
    lines.append(f"    p{i} = a{i}.data_ptr()")
    if align:
        lines += [f"    if p{i} % {align}:", f"        a{i} = a{i}.clone()",
                  f"        p{i} = a{i}.data_ptr()"]
    return lines


@lru_cache(maxsize=64)
def unused_scratch(device: Any) -> torch.Tensor:
    """One fp32 element per device, bound where a kernel's scratch argument is not read at the
    call's sizes (a row kernel whose rows are not split): no allocation per call."""
    return torch.empty(1, dtype=torch.float32, device=device)


@lru_cache(maxsize=1024)
def bound(binder: Binder, outputs: int) -> Callable[..., tuple[Any, ...]]:
    """The binder as a function of (values in parameter order, *outputs) returning the
    arguments (compiled once per binder: the full path's calls reuse it)."""
    env: dict[str, Any] = {}
    names = "".join(f", o{o}" for o in range(outputs))
    lines, args = binder.code(env, "o0.device" if outputs else "None")
    text = "\n".join([f"def bind(values{names}):", *lines,
                      f"    return ({''.join(a + ', ' for a in args)})"]) + "\n"
    exec(compile(text, "<metalforge binder>", "exec"), env)     # noqa: S102
    fn: Callable[..., tuple[Any, ...]] = env["bind"]
    return fn
