"""The MLX backend: metalforge kernels on `mlx.core.array` inputs through `mx.fast.metal_kernel`.

`mx.fast.metal_kernel` takes a kernel *body* and a header, and writes the signature itself
(MLX ≥ 0.32, `mlx/backend/common/metal_kernel.cpp`):

- inputs, in the order given, at buffers 0, 1, ...: `const device T* name` (`const constant`
  when the array has fewer than 8 elements; `T&` instead of `T*` for a 0-d array), then the
  outputs as `device T* name`; T is MLX's type name (`float`, `float16_t`, `bfloat16_t`,
  `uint32_t`, ...);
- after an input, `<name>_shape`, `<name>_strides` and `<name>_ndim` parameters whenever those
  substrings occur anywhere in the body; then one parameter per Metal thread attribute whose
  name occurs anywhere in the body (`uint3 thread_position_in_grid [[thread_position_in_grid]]`);
- `template=[(name, dtype|int|bool), ...]` makes the function a template with one explicit
  instantiation; the grid counts threads (`dispatchThreads`), the threadgroup is clamped to the
  grid per axis.

This module turns one IR kernel (as rendered by metalforge.codegen) into that form: the helpers
become the header, the kernel body becomes the source with a prologue binding metalforge's
thread variables (`mf_tid`, ...) to MLX's attribute parameters, every runtime scalar and size
becomes a 0-d MLX input, dtypes and the index width become template arguments. Identifiers that
would trigger MLX's substring rules by accident are renamed, and the result is checked against
those rules before it is used.

Calls with MLX arrays run on "mlx" (Metal through MLX, on a Mac) or, under `mf.backend("sim")`,
through the simulator: MLX itself writes the full source it would compile (`mx.export_function`
tracing with `verbose=True` works without Metal), and that source is run with MLX's buffer order,
grid and threadgroup. This is how the MLX path is tested on Linux.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import torch

from .. import dtypes
from .. import schedule as sched_mod
from ..codegen import render_msl
from ..errors import (
    BackendUnavailable,
    BindingError,
    DeviceError,
    LaunchError,
    UnsupportedOnBackend,
    kernel_at,
)
from ..graph import Graph, Output
from ..ir import LoweredKernel
from ..once import OnceMap
from ..shapes import numel as shapes_numel
from ..shapes import output_shape
from ..sim import compile_shader
from ..tuning.launch import merge
from .backends import DEVICE_OF, current_backend
from .binding import BindingPlan, InputSource, LaunchSource, ScalarSource, SizeSource, Source
from .launcher import eager_outputs, shaped, specialisation, target_launch, target_options

# Metal thread attributes MLX recognises in a body, with the type it declares them as.
ATTRIBUTES: dict[str, str] = {
    "dispatch_quadgroups_per_threadgroup": "uint", "dispatch_simdgroups_per_threadgroup": "uint",
    "dispatch_threads_per_threadgroup": "uint3", "grid_origin": "uint3", "grid_size": "uint3",
    "quadgroup_index_in_threadgroup": "uint", "quadgroups_per_threadgroup": "uint",
    "simdgroup_index_in_threadgroup": "uint", "simdgroups_per_threadgroup": "uint",
    "thread_execution_width": "uint", "thread_index_in_quadgroup": "uint",
    "thread_index_in_simdgroup": "uint", "thread_index_in_threadgroup": "uint",
    "thread_position_in_grid": "uint3", "thread_position_in_threadgroup": "uint3",
    "threadgroup_position_in_grid": "uint3", "threadgroups_per_grid": "uint3",
    "threads_per_grid": "uint3", "threads_per_simdgroup": "uint",
    "threads_per_threadgroup": "uint3",
}
SHAPE_SUFFIXES = ("_shape", "_strides", "_ndim")
CONSTANT_LIMIT = 8          # MLX passes inputs with fewer elements in the constant address space
MAX_GRID = 2 ** 31 - 1      # MLX takes the grid as C++ ints

# MSL type (as the IR spells it) -> (MLX dtype name, the type name MLX writes in signatures)
_MSL_TO_MLX = {"float": ("float32", "float"), "half": ("float16", "float16_t"),
               "bfloat": ("bfloat16", "bfloat16_t"), "int": ("int32", "int32_t"),
               "uint": ("uint32", "uint32_t"), "long": ("int64", "int64_t"),
               "ulong": ("uint64", "uint64_t"), "short": ("int16", "int16_t"),
               "ushort": ("uint16", "uint16_t"), "char": ("int8", "int8_t"),
               "uchar": ("uint8", "uint8_t"), "bool": ("bool_", "bool")}
# MLX dtype name -> metalforge dtype (the ones a kernel argument may have)
_FROM_MLX = {"float32": dtypes.F32, "float16": dtypes.F16, "bfloat16": dtypes.BF16,
             "int32": dtypes.I32, "uint32": dtypes.U32, "int16": dtypes.I16,
             "uint16": dtypes.U16, "int8": dtypes.I8, "uint8": dtypes.U8, "bool": dtypes.BOOL,
             "int64": dtypes.I64, "uint64": dtypes.U64}
_TO_MLX = {d.name: name for name, d in _FROM_MLX.items()} | {"bool": "bool_"}
TO_MLX = _TO_MLX            # metalforge dtype name -> MLX dtype name (export/mlx.py)

# What MLX prepends to every kernel it compiles (`metal::utils()`) declares the type names its
# signatures use; the simulator gets the two of them that are not MSL's own.
SIM_UTILS = "#include <metal_stdlib>\nusing namespace metal;\ntypedef half float16_t;\n" \
            "typedef bfloat bfloat16_t;\n"


# --------------------------------------------------------------------------- MLX itself

def is_array(v: Any) -> bool:
    """Whether v is an `mlx.core.array` (without importing MLX)."""
    t = type(v)
    return t.__name__ == "array" and t.__module__ == "mlx.core"


def mx() -> Any:
    """`mlx.core`, or an ImportError that says how to get it."""
    try:
        import mlx.core as core
    except ImportError as e:
        raise ImportError("metalforge's MLX backend needs MLX: pip install 'metalforge[mlx]' "
                          f"(or mlx itself) ({e})") from None
    return core


def dtype_of(a: Any) -> dtypes.DType:
    """The metalforge dtype of an MLX array, or a TypeError naming what is supported."""
    name = str(a.dtype).rsplit(".", 1)[-1]
    try:
        return _FROM_MLX[name]
    except KeyError:
        raise BindingError(f"MLX dtype {name} is not supported by metalforge (supported: "
                           f"{', '.join(_FROM_MLX)})") from None


def mlx_dtype(msl_type: str) -> Any:
    return getattr(mx(), _MSL_TO_MLX[msl_type][0])


# --------------------------------------------------------------------------- translation

@dataclass(frozen=True)
class MetalKernel:
    """Everything `mx.fast.metal_kernel` and its call take for one metalforge kernel instance.

    inputs: per MLX input, the kernel argument it carries (its index: the binding plan says
    what goes there) and its MSL type (element type for arrays);
    outputs: the output index of each MLX output (None: the scratch buffer, dropped).
    template: (parameter, MSL type) pairs, passed as MLX dtypes."""
    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    header: str
    source: str
    template: tuple[tuple[str, str], ...]
    inputs: tuple[tuple[int, str], ...]
    outputs: tuple[Optional[int], ...]
    attributes: tuple[str, ...]


def scan(source: str, input_names: Iterable[str]) -> tuple[list[str], list[str]]:
    """What MLX adds to the signature for this body: (attribute names, `<input>_shape|_strides|
    _ndim` parameter names), by its substring rules."""
    attrs = [a for a in ATTRIBUTES if a in source]
    shapes = [n + s for n in input_names for s in SHAPE_SUFFIXES if n + s in source]
    return attrs, shapes


def _split(msl: str, k: LoweredKernel) -> tuple[str, list[str]]:
    """(header, body lines) of a one-kernel MSL source as metalforge renders it: everything
    before the kernel's `template <...>` line, and the lines between its braces (a declared
    [[max_total_threads_per_threadgroup]] is dropped: metal_kernel writes the signature)."""
    lines = msl.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.endswith(f"kernel void {k.name}("))
    open_ = lines.index("{", start)
    close = lines.index("}", open_)
    head_end = start - 1 if k.template else start
    return "\n".join(lines[:head_end]).rstrip("\n") + "\n\n", lines[open_ + 1:close]


def _fresh(taken: set[str], reserved: list[str]) -> Iterator[str]:
    i = 0
    while True:
        i += 1
        name = f"mf_r{i}"
        if name not in taken and not any(r in name for r in reserved):
            taken.add(name)
            yield name


def translate(k: LoweredKernel, host_name: str) -> MetalKernel:
    """The metal_kernel form of instance `host_name` of IR kernel `k`."""
    inst = next(i for i in k.instances if i.host_name == host_name)
    types = dict(zip(k.template, inst.types))
    header, body = _split(render_msl(k), k)
    params = sorted(k.params, key=lambda p: p.index)
    if any(p.binds == ("error",) for p in params):
        raise UnsupportedOnBackend(f"kernel '{host_name}' gathers (mf.take) at an index not "
                                   "proven in range, and reports index errors through a buffer "
                                   "it writes; the mlx backend does not bind that buffer yet: "
                                   "call it with torch tensors (gathers proven in range run "
                                   "on mlx)")
    # a ("scratch",) buffer is written, so MLX must see it as an output (dropped after the
    # call; with one key block per row, attention never touches it)
    ins = [p for p in params if p.binds[0] not in ("output", "scratch")]
    outs = [p for p in params if p.binds[0] in ("output", "scratch")]
    for th in k.threads:
        if th.attribute not in ATTRIBUTES:
            raise UnsupportedOnBackend(f"kernel '{host_name}' reads [[{th.attribute}]], which "
                                       "mx.fast.metal_kernel cannot pass")
    # rename every identifier that MLX's substring scan would mistake for an attribute or an
    # input's shape parameter (it scans the body only, comments included)
    text = "\n".join(body)
    reserved = list(ATTRIBUTES) + [p.name + s for p in ins for s in SHAPE_SUFFIXES]
    tokens = set(re.findall(r"\w+", header + text)) | {p.name for p in params}
    fresh = _fresh(set(tokens), reserved)
    rename = {t: next(fresh) for t in sorted(tokens) if any(r in t for r in reserved)}
    if rename:
        def sub(s: str) -> str:
            return re.sub(r"\w+", lambda m: rename.get(m.group(0), m.group(0)), s)
        header, text = sub(header), sub(text)
    name_of = {p.name: rename.get(p.name, p.name) for p in params}
    prologue = ["    // thread position from MLX's attribute parameters (1-D grid)"]
    for th in k.threads:
        src = th.attribute
        if ATTRIBUTES[th.attribute] == "uint3" and not th.type.endswith("3"):
            src += ".xy" if th.type.endswith("2") else ".x"
        prologue.append(f"    const {th.type} {th.name} = {th.type}({src});")
    source = "\n".join(prologue + [text]) + "\n"
    mk = MetalKernel(
        name=host_name, input_names=tuple(name_of[p.name] for p in ins),
        output_names=tuple(name_of[p.name] for p in outs), header=header, source=source,
        template=tuple((t, types[t]) for t in k.template),
        inputs=tuple((p.index, types.get(p.type, p.type)) for p in ins),
        outputs=tuple(int(p.binds[1]) if p.binds[0] == "output" else None for p in outs),
        attributes=tuple(dict.fromkeys(th.attribute for th in k.threads)))
    attrs, shapes = scan(mk.source, mk.input_names)
    if set(attrs) != set(mk.attributes) or shapes:
        raise AssertionError(f"kernel '{host_name}': MLX would add {attrs + shapes} to the "
                             f"signature, expected only {list(mk.attributes)}")
    return mk


# --------------------------------------------------------------------------- a call

@dataclass
class MLXLaunch:
    """One launch: the kernel, its MLX inputs and the keyword arguments of the call."""
    kernel: MetalKernel
    obj: Any                  # the mx.fast.metal_kernel object
    inputs: list[Any]
    kwargs: dict[str, Any]
    options: tuple[tuple[str, int], ...] = ()   # the simulator's compile keywords (target)


# (schedule, host) → (schedule, translation, kernel object)
_built: OnceMap[tuple[int, str], tuple[Any, MetalKernel, Any]] = OnceMap()


def built(schedule: sched_mod.Schedule, host: str) -> tuple[MetalKernel, Any]:
    """The translation and the `mx.fast.metal_kernel` object of one kernel of a schedule
    (made once per schedule and host name: one MLX kernel object per specialisation)."""
    got = _built.get_or_build((id(schedule), host), lambda: _build(schedule, host),
                              lambda got: got[0] is schedule)
    return got[1], got[2]


def _build(schedule: sched_mod.Schedule, host: str) -> tuple[Any, MetalKernel, Any]:
    k = next(kk for kk in schedule.kernels if any(i.host_name == host for i in kk.instances))
    mk = translate(k, host)
    obj = mx().fast.metal_kernel(name=mk.name, input_names=list(mk.input_names),
                                 output_names=list(mk.output_names), source=mk.source,
                                 header=mk.header, ensure_row_contiguous=True)
    return schedule, mk, obj


def prepare(graph: Graph, values: Mapping[str, Any],
            launch: Optional[Mapping[str, Any]] = None) -> tuple[Optional[MLXLaunch], list[Any]]:
    """The launch a call with these MLX arrays makes: (MLXLaunch or None when the outputs are
    empty, the output shapes and dtypes)."""
    core = mx()
    where = kernel_at(graph.name, graph.loc)
    spec = specialisation(graph, _one_launch(graph, launch, where))
    layer = target_launch("mlx", spec.family)             # the target (contractions)
    if layer:
        spec = specialisation(graph, merge(layer, _one_launch(graph, launch, where)))
    arrays = _check_arrays(graph, values, where)
    binding, numel = shaped(spec, arrays)         # the torch path's shape checks
    sizes = binding.sizes
    shapes = [(output_shape(binding, o), getattr(core, _TO_MLX[o.dtype.name]))
              for o in graph.outputs]
    if not numel:
        return None, shapes
    index64 = sched_mod.needs_index64(sizes, numel)
    s = spec.schedule(index64)
    mk, obj = built(s, s.host_name(sizes))
    threads, group = s.launch(sizes)
    if threads > MAX_GRID:
        raise LaunchError(f"{where}: {numel} output elements need {threads} threads, over the "
                          f"{MAX_GRID} an MLX grid holds; raise launch={{'vectors_per_thread': "
                          f"...}}")
    plan = spec.binding(index64)
    fixed = plan.fixed(s, sizes, numel)
    positional = [values.get(p.name) for p in graph.params]
    inputs = [_input(plan, plan.sources[i], typ, positional, fixed) for i, typ in mk.inputs]
    kwargs = dict(template=[(n, mlx_dtype(t)) for n, t in mk.template],
                  output_shapes=[(1,) if i is None else shapes[i][0] for i in mk.outputs],
                  output_dtypes=[core.float32 if i is None else shapes[i][1]
                                 for i in mk.outputs],
                  grid=(threads, 1, 1), threadgroup=(group, 1, 1))
    return MLXLaunch(mk, obj, inputs, kwargs, target_options(s, "sim")), shapes


def _one_launch(graph: Graph, launch: Optional[Mapping[str, Any]],
                where: str) -> Optional[Mapping[str, Any]]:
    """The launch options under MLX, which launches one kernel per call: attention keeps one
    block of keys per query row (key_splits 1), a column reduction one chunk of the reduced
    axis (fill_groups 0: no partials to merge in a second launch), a reduction over several
    axes one threadgroup per row (the same)."""
    family = sched_mod.family(graph)
    if family == "scatter":
        raise UnsupportedOnBackend(
            f"{where}: mf.scatter_add runs several launches a call (a zeroing pass before its "
            f"atomic adds, an f32 accumulator's cast, or a device sort of the index in "
            f"deterministic mode) and reports an index out of range through a buffer it "
            f"writes; the mlx backend launches one kernel per call and binds no report "
            f"buffer: call it with torch tensors (backends 'mps', 'cuda', 'sim')")
    if family == "scan":                # one threadgroup a row: no totals launch first
        if (launch or {}).get("fill_groups", 0):
            raise LaunchError(f"{where}: the mlx backend launches one kernel per call, so a "
                              f"scan keeps each row in one threadgroup; got "
                              f"launch={dict(launch or {})}")
        return {**(launch or {}), "fill_groups": 0}
    if family in ("column", "multiaxis"):
        if (launch or {}).get("fill_groups", 0):
            raise LaunchError(f"{where}: the mlx backend launches one kernel per call, so a "
                              f"{family} reduction keeps the reduced axis in one chunk; got "
                              f"launch={dict(launch or {})}")
        return {**(launch or {}), "fill_groups": 0}
    if family != "attention":
        return launch
    if (launch or {}).get("key_splits", 1) != 1:
        raise LaunchError(f"{where}: the mlx backend launches one kernel per call, so "
                          f"attention keeps one block of keys per query row; got "
                          f"launch={dict(launch or {})}")
    return {**(launch or {}), "key_splits": 1}


def _check_arrays(graph: Graph, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The tensor arguments by name, each an MLX array of the traced dtype."""
    arrays: dict[str, Any] = {}
    for p in graph.tensors:
        v: Any = values.get(p.name)
        if not is_array(v):
            raise BindingError(f"{where}: argument '{p.name}' must be an mlx.core.array like the "
                               f"other arguments of this call, got {type(v).__name__}")
        if dtype_of(v) is not p.dtype:
            raise BindingError(f"{where}: argument '{p.name}' has dtype {v.dtype}, but this "
                               f"specialisation was built for {p.dtype}")
        arrays[p.name] = v
    return arrays


def _input(plan: BindingPlan, a: Source, typ: str, values: Sequence[Any],
           fixed: Mapping[int, int]) -> Any:
    """The MLX input bound to one kernel input (see `MetalKernel.inputs`): a tensor argument,
    or a runtime scalar, the element count, a launch value or an axis size as a 0-d array."""
    if isinstance(a, InputSource):
        return device_input(values[a.position])
    return mx().array(plan.by_value(a, values, fixed), dtype=mlx_dtype(typ))


def device_input(arr: Any) -> Any:
    """An input array as the kernel takes it: one of fewer than CONSTANT_LIMIT elements, which
    MLX would pass in the constant address space where the body's `device` vector loads
    cannot point, padded to a device buffer."""
    if arr.size >= CONSTANT_LIMIT:
        return arr
    core = mx()
    return core.concatenate([arr.reshape(-1), core.zeros((CONSTANT_LIMIT - arr.size,),
                                                         dtype=arr.dtype)])


def run(graph: Graph, values: Mapping[str, Any], backend: Optional[str] = None,
        launch: Optional[Mapping[str, Any]] = None) -> Any:
    """Run one specialisation on MLX arrays: on "mlx" (Metal through mx.fast.metal_kernel), or
    on "sim" (the source MLX builds for it, in the simulator). Returns MLX arrays."""
    be = backend or current_backend(a for a in values.values() if is_array(a))
    where = kernel_at(graph.name, graph.loc)
    if be not in ("mlx", "sim"):
        raise DeviceError(f"{where}: backend '{be}' runs on torch tensors on "
                          f"{DEVICE_OF.get(be, be)}, but the arguments are MLX arrays; use "
                          f"backend 'mlx' (or 'sim' to simulate the MLX kernel)")
    core = mx()
    if be == "mlx" and not core.metal.is_available():
        raise BackendUnavailable(f"{where}: MLX has no Metal back-end on this machine "
                                 "(mx.metal.is_available() is False); the 'mlx' backend runs on "
                                 "Apple-silicon Macs. To run the kernel MLX would build in "
                                 "metalforge's simulator, call it inside `with mf.backend('sim'):`")
    call, shapes = prepare(graph, values, launch)
    if call is None:
        outs = _beside_an_empty_grid(graph, values, shapes)
    elif be == "mlx":
        got = call.obj(inputs=call.inputs, **call.kwargs)
        outs = [None] * len(shapes)
        for i, o in zip(call.kernel.outputs, got):
            if i is not None:
                outs[i] = o
    else:
        outs = simulate(call)
    return outs[0] if len(outs) == 1 else tuple(outs)


# --------------------------------------------------------------------------- the simulator

_sources: OnceMap[tuple[Any, ...], str] = OnceMap()
_capture_lock = threading.Lock()        # one capture at a time: it redirects the process's stdout


def captured_source(call: MLXLaunch) -> str:
    """The complete Metal source MLX builds for this call (signature, body, instantiation),
    captured once per kernel and kind of inputs (see `_capture`)."""
    key = (call.kernel, tuple((str(a.dtype), a.ndim == 0, a.size < CONSTANT_LIMIT)
                               for a in call.inputs),
           tuple(str(d) for d in call.kwargs["output_dtypes"]),
           tuple((n, str(t)) for n, t in call.kwargs["template"]))
    return _sources.get_or_build(key, lambda: _capture(call))


def _capture(call: MLXLaunch) -> str:
    """The source, from `mx.export_function` tracing with `verbose=True`, which MLX prints to
    the process's stdout (file descriptor 1, redirected here for the duration)."""
    core = mx()

    def traced(*arrays: Any) -> Any:
        return call.obj(inputs=list(arrays), verbose=True, **call.kwargs)

    with _capture_lock, tempfile.TemporaryDirectory() as tmp, \
            tempfile.TemporaryFile() as out:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(out.fileno(), 1)
        try:
            core.export_function(os.path.join(tmp, "k.mlxfn"), traced, *call.inputs)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        out.seek(0)
        text = out.read().decode()
    m = re.search(r"Generated source code for `[^`]*`:\n```\n(.*)\n```\n", text, re.S)
    if m is None:
        raise RuntimeError("MLX did not print the kernel source it builds (mx.export_function "
                           f"with verbose=True); got: {text[:500]!r}")
    return m.group(1)


_libs: OnceMap[tuple[str, tuple[tuple[str, int], ...]], Any] = OnceMap()


def _beside_an_empty_grid(graph: Graph, values: Mapping[str, Any],
                          shapes: list[Any]) -> list[Any]:
    """The outputs of a call whose grid is empty: empty ones as such, the others (`w * 2`
    beside `x * w` with no rows of x) from `launcher.eager_outputs`."""
    core = mx()
    outs = [core.zeros(shape, dtype=dt) for shape, dt in shapes]
    filled = [i for i, (shape, _) in enumerate(shapes) if 0 not in shape]
    if not filled:
        return outs
    tensors = {k: to_torch(v) if is_array(v) else v for k, v in values.items()}
    for i, t in zip(filled, eager_outputs(graph, tensors, filled)):
        outs[i] = to_mlx(t.cpu())
    return outs


def to_torch(a: Any) -> torch.Tensor:
    """An MLX array as a CPU torch tensor (a copy), bf16 included."""
    import numpy as np
    core = mx()
    if a.dtype == core.bfloat16:
        return torch.from_numpy(np.array(core.view(a, core.uint16))).view(torch.bfloat16)
    arr = np.array(a)
    if arr.dtype.kind in "iu" and arr.itemsize == 8:     # MLX gives (u)longlong; torch wants
        arr = arr.astype(np.int64 if arr.dtype.kind == "i" else np.uint64)   # (u)int64
    return torch.from_numpy(arr)


def to_mlx(t: torch.Tensor) -> Any:
    """A CPU torch tensor as an MLX array (a copy), bf16 included."""
    core = mx()
    if t.dtype == torch.bfloat16:
        return core.view(core.array(t.view(torch.uint16).numpy()), core.bfloat16)
    return core.array(t.numpy())


def simulate(call: MLXLaunch) -> list[Any]:
    """Run the source MLX builds for this call in metalforge's simulator, bound as MLX binds
    it (inputs, then outputs, by buffer index), with MLX's grid and (clamped) threadgroup.
    Returns the outputs as MLX arrays, in the graph's output order."""
    src = captured_source(call)
    lib = _libs.get_or_build((src, call.options), lambda: compile_shader(
        SIM_UTILS + src, **dict[str, Any](call.options)))
    host = re.findall(r"\[\[kernel\]\] void (\w+)\(", src)[0]
    args = [to_torch(a) for a in call.inputs]
    outs = [torch.empty(shape, dtype=_torch_dtype(dt))
            for shape, dt in zip(call.kwargs["output_shapes"], call.kwargs["output_dtypes"])]
    grid = list(call.kwargs["grid"])
    group = [min(t, g) for t, g in zip(call.kwargs["threadgroup"], grid)]
    getattr(lib, host)(*args, *outs, threads=grid, group_size=group)
    result = [None] * sum(i is not None for i in call.kernel.outputs)
    for i, t in zip(call.kernel.outputs, outs):
        if i is not None:
            result[i] = to_mlx(t)
    return result


def _torch_dtype(mlx_dt: Any) -> torch.dtype:
    dt: torch.dtype = getattr(torch, str(mlx_dt).rsplit(".", 1)[-1])   # the same names
    return dt


# --------------------------------------------------------------------------- show

def show(graph: Graph, sizes: Optional[Mapping[str, int]] = None,
         launch: Optional[Mapping[str, Any]] = None) -> str:
    """The header, body and `mx.fast.metal_kernel` call of every kernel of this
    specialisation (a reduction has one per row-length variant), as Python a reader can
    follow. With all sizes known, the grid and threadgroup are numbers."""
    spec = specialisation(graph, launch)
    sizes = dict(sizes or {})
    numel = shapes_numel(spec.grid, sizes) if all(a in sizes for a in spec.grid) else None
    index64 = numel is not None and sched_mod.needs_index64(sizes, numel)
    s = spec.schedule(index64)
    plan = spec.binding(index64)
    out = []
    for k in s.kernels:
        for inst in k.instances:
            mk = translate(k, inst.host_name)
            out.append(_show_one(graph, mk, s, plan, sizes, numel))
    if len(out) > 1:
        out.insert(0, f"# {graph.name}: {len(out)} MLX kernels; each call launches the one its "
                      "sizes select (row length)")
    return "\n\n".join(out) + "\n"


def _show_one(graph: Graph, mk: MetalKernel, s: sched_mod.Schedule, plan: BindingPlan,
              sizes: Mapping[str, int], numel: Optional[int]) -> str:
    fixed = plan.fixed(s, sizes, numel)

    def arg(i: int, typ: str) -> str:
        a = plan.sources[i]
        if isinstance(a, InputSource):
            return a.name
        what = str(fixed[i]) if i in fixed else \
            f"size_{a.axis}" if isinstance(a, SizeSource) else \
            a.name if isinstance(a, (ScalarSource, LaunchSource)) else "numel"
        return f"mx.array({what}, dtype=mx.{_MSL_TO_MLX[typ][0]})"

    try:
        threads, group = s.launch(sizes) if numel is not None else (None, None)
    except (KeyError, ValueError):
        threads = group = None
    grid = f"({threads}, 1, 1)" if threads else "(threads, 1, 1)"
    tg = f"({group}, 1, 1)" if group else "(threads_per_group, 1, 1)"
    batch = {d.name for t in graph.tensors for d in t.dims if d.batch}

    def shape(o: Output) -> str:
        axes = [("*" if a in batch else "") + a for a in o.axes]
        return "(" + ", ".join(axes) + ("," if len(axes) == 1 else "") + ")"

    outs = [graph.outputs[i] for i in mk.outputs if i is not None]
    template = [f"({n!r}, mx.{_MSL_TO_MLX[t][0]})" for n, t in mk.template]
    lines = [f"# ---- MLX kernel {mk.name} ({s.family})",
             f"header_{mk.name} = r'''" + mk.header.rstrip("\n"), "'''",
             f"source_{mk.name} = r'''" + mk.source.rstrip("\n"), "'''",
             f"{mk.name} = mx.fast.metal_kernel(",
             f"    name={mk.name!r},",
             f"    input_names={list(mk.input_names)!r},",
             f"    output_names={list(mk.output_names)!r},",
             f"    header=header_{mk.name}, source=source_{mk.name},",
             "    ensure_row_contiguous=True)",
             f"outputs = {mk.name}(",
             f"    inputs=[{', '.join(arg(i, t) for i, t in mk.inputs)}],",
             f"    template=[{', '.join(template)}],",
             f"    output_shapes=[{', '.join(shape(o) for o in outs)}],",
             f"    output_dtypes=[{', '.join('mx.' + _TO_MLX[o.dtype.name] for o in outs)}],",
             f"    grid={grid}, threadgroup={tg})"]
    if threads is None:
        lines.append("# grid and threadgroup: from the launch policy and the call's sizes "
                     "(metalforge computes them per call)")
    return "\n".join(lines)
