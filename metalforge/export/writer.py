"""Exporting one specialisation of a kernel: its Metal source, a build script and its entry in
the manifest (manifest.py), for sizes fixed at export time.

The kernel is traced and planned once here, as a call with tensors of the given shapes would
be (the same checks, the same schedule and variant choice, compiled by the simulator so that
the thread limits that pick some variants are known); what that call would launch and bind is
written down, so `load_exported` runs it later with no tracing, no planning and no Python
source of the kernel.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import BindingError
from ..graph import ScalarParam, TensorParam
from ..runtime import launcher
from ..runtime.binding import (
    CounterSource,
    InputSource,
    LaunchSource,
    NumelSource,
    OutputSource,
    ReportSource,
    ScalarSource,
    ScratchSource,
    SizeSource,
    SortedSource,
    Source,
)
from ..runtime.indexcheck import IndexErrors
from ..shapes import output_shape
from . import mlx
from . import rule as rule_mod
from .manifest import SCHEMA, merge_into
from .rule import all_sizes, base_axes, param_shape

BUILD = """#!/bin/sh
# Build {name}.metallib from the exported Metal source (macOS, Xcode command-line tools).
# metalforge.load_exported uses it where torch has torch.mps.load_metallib (2.13 and later).
set -e
cd "$(dirname "$0")"
xcrun -sdk macosx metal -c {name}.metal -o {name}.air
xcrun -sdk macosx metallib {name}.air -o {name}.metallib
"""


def _placeholder(p: ScalarParam) -> Any:
    return p.default if p.has_default else p.pytype(0)


def _argument(a: Source, fixed: Mapping[int, int], s: Any, sizes: Mapping[str, int]
              ) -> dict[str, Any]:
    """One argument's entry: where a call takes it from."""
    if isinstance(a, InputSource):
        return {"index": a.index, "kind": "input", "name": a.name}
    if isinstance(a, OutputSource):
        return {"index": a.index, "kind": "output", "output": a.output}
    if isinstance(a, ScalarSource):
        return {"index": a.index, "kind": "scalar", "name": a.name,
                "type": "float" if a.is_float else "int"}
    if isinstance(a, (SizeSource, NumelSource, LaunchSource)):
        what = a.axis if isinstance(a, SizeSource) else getattr(a, "name", "numel")
        return {"index": a.index, "kind": "constant", "of": what, "value": fixed[a.index]}
    if isinstance(a, ScratchSource):
        return {"index": a.index, "kind": "scratch", "floats": max(1, s.scratch_floats(sizes))}
    if isinstance(a, SortedSource):
        return {"index": a.index, "kind": "sorted", "name": a.name, "part": a.part}
    if isinstance(a, CounterSource):
        raise BindingError("export: a one-launch column reduction binds ticket counters that "
                           "must stay zeroed between launches, which the manifest cannot "
                           "describe; export it with launch={'one_launch': False}")
    assert isinstance(a, ReportSource)
    return {"index": a.index, "kind": "report"}


def _rule(call: launcher.CheckedCall, schedule: Any, plan: Any, where: str,
          base: Mapping[str, int]) -> dict[str, Any]:
    """The entry's size rule (rule.py), with where each base size is read from."""
    ctx = rule_mod.Context(call.spec.graph, schedule, plan, call.index64, call.spec.grid,
                           call.binding.groups, where)
    lib = call.spec.library(call.index64, "sim")
    limits = {i.host_name: lib.kernel(i.host_name).max_threads
              for k in schedule.kernels for i in k.instances}
    got = rule_mod.rule(ctx, base, limits)
    if "checks" in got:
        read = rule_mod.size_sources(ctx, list(base))
        got = {"sizes": read, **got} if isinstance(read, dict) else {"unavailable": read}
    return got


def specialisation(kernel: Any, bindings: Mapping[str, Any], sizes: Mapping[str, int]
                   ) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(the manifest entry of the kernel at these dtype/Const bindings and sizes, its Metal
    source, its kernels in mx.fast.metal_kernel's form: export/mlx.py)."""
    graph = kernel.graph(**bindings)
    missing = [a for a in base_axes(graph) if a not in sizes]
    if missing:
        raise BindingError(f"kernel '{graph.name}': export needs every size: give "
                           + " ".join(f"--shape {a}=..." for a in missing))
    full = all_sizes(graph, sizes)
    values: dict[str, Any] = {}
    for p in graph.params:
        if isinstance(p, TensorParam):
            values[p.name] = torch.empty(param_shape(p, full), dtype=p.dtype.torch)
        elif isinstance(p, ScalarParam):
            values[p.name] = _placeholder(p)
    call = launcher.check_call(graph, values, "sim", kernel.launch)
    schedule = call.spec.schedule(call.index64)
    plan = call.spec.binding(call.index64)
    fixed = plan.fixed(schedule, call.binding.sizes, call.numel)
    launches = launcher.bind(call).plan if call.numel else ()
    errors = IndexErrors.of(graph, plan.report, call.binding.sizes)
    where = f"kernel '{graph.name}'" + (f" ({Path(graph.loc[0]).name}:{graph.loc[1]})"
                                        if graph.loc else "")
    entry = {
        "kernel": graph.name, "bindings": {k: str(v) for k, v in bindings.items()},
        "sizes": dict(call.binding.sizes),
        "inputs": [{"name": p.name, "kind": "tensor", "dtype": p.dtype.name,
                    "annotation": p.annotation, "shape": param_shape(p, full)}
                   if isinstance(p, TensorParam) else
                   {"name": p.name, "kind": "scalar", "type": p.pytype.__name__,
                    **({"default": p.default} if p.has_default else {})}
                   for p in graph.params if isinstance(p, (TensorParam, ScalarParam))],
        "outputs": [{"dtype": o.dtype.name, "axes": list(o.axes),
                     "shape": list(output_shape(call.binding, o))} for o in graph.outputs],
        "arguments": [_argument(a, fixed, schedule, call.binding.sizes) for a in plan.sources],
        "arg_casts": {str(i): c for i, c in plan.casts},
        "launches": [{"host_name": h, "threads": t, "group_size": g} for h, t, g in launches],
        "index_errors": list(errors.sites) if errors is not None else [],
        "where": where,
        "rule": _rule(call, schedule, plan, where, {a: sizes[a] for a in base_axes(graph)}),
    }
    return entry, call.spec.library(call.index64, "sim").source, mlx.forms(schedule)


def export(kernel: Any, bindings: Mapping[str, Any], sizes: Mapping[str, int],
           out: str | Path) -> Path:
    """Write (or add to) the export folder `out`: <kernel>-<n>.metal for this specialisation,
    its build script, and manifest.json; returns the manifest's path."""
    entry, source, forms = specialisation(kernel, bindings, sizes)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = out / "manifest.json"
    doc = json.loads(manifest.read_text()) if manifest.exists() else {
        "schema": SCHEMA, "specialisations": []}
    name = merge_into(doc, entry)
    entry["source"] = f"{name}.metal"
    (out / entry["source"]).write_text(source)
    entry["mlx"] = mlx.write(out, name, forms)
    script = out / f"build_{name}.sh"
    script.write_text(BUILD.format(name=name))
    script.chmod(0o755)
    manifest.write_text(json.dumps(doc, indent=1) + "\n")
    return manifest
