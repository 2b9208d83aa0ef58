"""Exported kernels on MLX arrays, through `mx.fast.metal_kernel`.

metal_kernel takes a kernel body and a header and writes the signature itself, so the export
also writes each kernel in that form (`<stem>.mlx.json`: `runtime.mlx.translate` of each kernel
instance, the transformation the MLX backend makes of a traced kernel). A call binds it as the
MLX backend binds a traced call (`runtime.mlx.prepare`): inputs in the translation's order
(tensors, then runtime scalars, sizes and constants as 0-d arrays of their MSL type), outputs
by index, the grid and threadgroup of the call's one launch. On backend "mlx" (a Mac) the
kernel object runs it; on "sim" the source MLX generates for it runs in the simulator
(`runtime.mlx.simulate`), which is how it is tested on Linux.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from ..errors import BackendUnavailable, UnsupportedOnBackend
from ..runtime import mlx as mfx
from ..schedule import Schedule

# `k` below: a loader.ExportedKernel, `layout` its loader.CallLayout (not imported: the loader
# imports this module)


def forms(schedule: Schedule) -> dict[str, Any]:
    """The metal_kernel form of every kernel instance of the schedule, by host name, as JSON;
    {"unavailable": why} where the MLX backend cannot bind one (an index report)."""
    try:
        return {i.host_name: asdict(mfx.translate(k, i.host_name))
                for k in schedule.kernels for i in k.instances}
    except UnsupportedOnBackend as e:
        return {"unavailable": str(e)}


def write(out: Path, stem: str, got: dict[str, Any]) -> dict[str, Any]:
    """Write `<stem>.mlx.json` (the `forms` of a schedule); the manifest entry's "mlx"
    field."""
    if "unavailable" in got:
        return got
    (out / f"{stem}.mlx.json").write_text(json.dumps(got, indent=1) + "\n")
    return {"source": f"{stem}.mlx.json"}


def _kernel(k: Any, host: str) -> tuple[mfx.MetalKernel, Any]:
    """The translation and the metal_kernel object of `host` (made once per loaded entry)."""
    key = f"mlx:{host}"
    if key not in k._libs:
        where = k.entry.get("mlx", {})
        if "source" not in where:
            raise UnsupportedOnBackend(f"{k.where}: no MLX form was exported "
                                       f"({where.get('unavailable', 'an older export')})")
        form = json.loads((k.folder / where["source"]).read_text())[host]
        mk = mfx.MetalKernel(**{f: tuple(tuple(x) if isinstance(x, list) else x for x in v)
                                if isinstance(v, list) else v for f, v in form.items()})
        obj = mfx.mx().fast.metal_kernel(
            name=mk.name, input_names=list(mk.input_names), output_names=list(mk.output_names),
            source=mk.source, header=mk.header, ensure_row_contiguous=True)
        k._libs[key] = (mk, obj)
    got: tuple[mfx.MetalKernel, Any] = k._libs[key]
    return got


def launch(k: Any, values: dict[str, Any], layout: Any) -> mfx.MLXLaunch:
    """The metal_kernel call of one exported call: kernel, inputs and keyword arguments."""
    core = mfx.mx()
    if len(layout.launches) != 1:
        raise UnsupportedOnBackend(f"{k.where}: at these sizes the kernel makes "
                                   f"{len(layout.launches)} launches, and the MLX loader runs "
                                   f"one a call (as the mlx backend does): call it with torch "
                                   f"tensors")
    kinds = {a["kind"] for a in k.entry["arguments"]}
    if kinds & {"report", "sorted"}:
        raise UnsupportedOnBackend(f"{k.where}: the kernel binds an index report or a device "
                                   f"sort, which the MLX loader does not: call it with torch "
                                   f"tensors")
    host, threads, group = layout.launches[0]
    mk, obj = _kernel(k, host)
    args = {a["index"]: a for a in k.entry["arguments"]}
    inputs = [_input(args[i], typ, values, layout) for i, typ in mk.inputs]
    outs = k.entry["outputs"]
    scratch = max(layout.scratch.values(), default=1)
    kwargs = dict(template=[(n, mfx.mlx_dtype(t)) for n, t in mk.template],
                  output_shapes=[(scratch,) if i is None else tuple(layout.outputs[i])
                                 for i in mk.outputs],
                  output_dtypes=[core.float32 if i is None else
                                 getattr(core, mfx.TO_MLX[outs[i]["dtype"]])
                                 for i in mk.outputs],
                  grid=(threads, 1, 1), threadgroup=(group, 1, 1))
    return mfx.MLXLaunch(mk, obj, inputs, kwargs)


def _input(a: dict[str, Any], typ: str, values: dict[str, Any], layout: Any) -> Any:
    """The MLX input of argument `a`: its array (padded out of MLX's constant address space
    where small, as the MLX backend does), or a value as a 0-d array of its MSL type."""
    if a["kind"] == "input":
        return mfx.device_input(values[a["name"]])
    value: Optional[Any] = values[a["name"]] if a["kind"] == "scalar" else \
        layout.constants[a["index"]]
    return mfx.mx().array(value, dtype=mfx.mlx_dtype(typ))


def mlx_run(k: Any, values: dict[str, Any], backend: str, layout: Any) -> Any:
    """Run an exported call on MLX arrays: backend "mlx" through metal_kernel (Metal), "sim"
    through the simulator running the source MLX generates. Returns MLX arrays."""
    call = launch(k, values, layout)
    if backend == "mlx":
        if not mfx.mx().metal.is_available():
            raise BackendUnavailable(f"{k.where}: MLX has no Metal back-end on this machine; "
                                     f"to run the kernel MLX would build in metalforge's "
                                     f"simulator, load it with backend='sim' (or call it "
                                     f"inside `with mf.backend('sim'):`)")
        got = call.obj(inputs=call.inputs, **call.kwargs)
        outs: list[Any] = [None] * sum(i is not None for i in call.kernel.outputs)
        for i, o in zip(call.kernel.outputs, got):
            if i is not None:
                outs[i] = o
    else:
        outs = mfx.simulate(call)
    return outs[0] if len(outs) == 1 else tuple(outs)
