"""Running exported kernels without tracing (`load_exported`): the manifest says what each
launch binds; the library is the exported Metal source compiled by the backend (or, on a Mac
whose torch has `torch.mps.load_metallib`, the .metallib the build script made)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ..dtypes import ALL as DTYPES
from ..errors import BindingError, DeviceError, GatherIndexError, MetalforgeError
from ..runtime import backends, launcher
from ..runtime.mlx import dtype_of, is_array
from ..schedule.base import Step
from ..schedule.hardware import MAX_THREADS_PER_GROUP
from . import rule as rule_mod
from .manifest import SCHEMA
from .mlx import mlx_run


def _library(folder: Path, entry: dict[str, Any], backend: str) -> Any:
    metallib = folder / Path(entry["source"]).with_suffix(".metallib").name
    loader = getattr(torch.mps, "load_metallib", None) if backend == "mps" else None
    if loader is not None and metallib.exists():
        return loader(str(metallib))
    return backends.library(backend, (folder / entry["source"]).read_text())


@dataclass(frozen=True)
class CallLayout:
    """What one call binds and launches besides its arguments: the output shapes, the
    constant and scratch arguments by index, the launches (host name, threads, group)."""
    outputs: list[list[int]]
    constants: dict[int, int]
    scratch: dict[int, int]
    launches: list[tuple[str, int, int]]

    @classmethod
    def exported(cls, entry: dict[str, Any]) -> "CallLayout":
        """The layout recorded for the exported sizes."""
        args = entry["arguments"]
        return cls([o["shape"] for o in entry["outputs"]],
                   {a["index"]: a["value"] for a in args if a["kind"] == "constant"},
                   {a["index"]: a["floats"] for a in args if a["kind"] == "scratch"},
                   [(n["host_name"], n["threads"], n["group_size"]) for n in entry["launches"]])


class _Env(dict):  # type: ignore[type-arg]
    """The rule's symbols: the sizes, and each pipeline's max_threads(host), asked lazily."""

    def __init__(self, sizes: dict[str, int], limit: Callable[[str], int]) -> None:
        super().__init__(sizes)
        self.limit = limit

    def __missing__(self, key: str) -> int:
        if not key.startswith("max_threads("):
            raise KeyError(key)
        self[key] = min(MAX_THREADS_PER_GROUP, self.limit(key[len("max_threads("):-1]))
        return int(self[key])


@dataclass
class ExportedKernel:
    """One exported specialisation, callable like the kernel: tensors and scalars positionally
    or by name; returns the output (a tuple for several). It runs at the exported shapes, and
    at any others its manifest's size rule covers (same dtypes and mf.Const values)."""
    entry: dict[str, Any]
    folder: Path
    backend: Optional[str] = None
    _libs: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.entry["kernel"])

    @property
    def where(self) -> str:
        return f"{self.entry['where']} (exported)"

    def values(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Every argument by name (defaults filled in), the tensors' dtypes checked."""
        params = self.entry["inputs"]
        values = dict(zip((p["name"] for p in params), args))
        values.update(kwargs)
        for p in params:
            if p["name"] not in values:
                if "default" not in p:
                    raise BindingError(f"{self.where}: missing argument '{p['name']}'")
                values[p["name"]] = p["default"]
            elif p["kind"] == "tensor":
                self._check(p, values[p["name"]])
        return values

    def _check(self, p: dict[str, Any], t: Any) -> None:
        if is_array(t):
            if dtype_of(t).name != p["dtype"]:
                raise BindingError(f"{self.where}: argument '{p['name']}' has dtype {t.dtype}, "
                                   f"exported for {p['dtype']}")
            return
        want = DTYPES[p["dtype"]].torch
        if not isinstance(t, torch.Tensor) or t.dtype != want:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise BindingError(f"{self.where}: argument '{p['name']}' must be a tensor of "
                               f"dtype {want} (or an MLX array of {p['dtype']}), got {got}")

    def exact(self, values: dict[str, Any]) -> bool:
        """Whether every tensor argument has its exported shape."""
        return all(tuple(values[p["name"]].shape) == tuple(p["shape"])
                   for p in self.entry["inputs"] if p["kind"] == "tensor")

    def library(self, backend: str) -> Any:
        if backend not in self._libs:
            self._libs[backend] = _library(self.folder, self.entry, backend)
        return self._libs[backend]

    def max_threads(self, backend: str, host: str) -> int:
        """The pipeline's max_threads_per_threadgroup (MLX: Metal's limit; it says no other)."""
        if backend == "mlx":
            return MAX_THREADS_PER_GROUP
        return int(getattr(self.library(backend), host).max_threads_per_threadgroup)

    def layout(self, values: dict[str, Any], backend: str) -> CallLayout:
        """What a call with these arguments launches: the exported layout at the exported
        shapes, else the manifest's rule at the sizes read off the arguments; every launch
        checked against its pipeline as the launcher checks it."""
        mlx = any(is_array(values[p["name"]]) for p in self.entry["inputs"]
                  if p["kind"] == "tensor")
        limits = "mlx" if mlx else backend          # whose pipelines' limits apply
        if self.exact(values):
            got = CallLayout.exported(self.entry)
        else:
            got = self._by_rule(values, limits)
        count = max((math.prod(o) for o in got.outputs), default=0)
        for host, threads, group in got.launches:
            launcher.check_step(self.where, Step(host, threads, group),
                                self.max_threads(limits, host), count, "exported")
        return got

    def _by_rule(self, values: dict[str, Any], backend: str) -> CallLayout:
        tensors = [p for p in self.entry["inputs"] if p["kind"] == "tensor"]
        shapes = {p["name"]: tuple(values[p["name"]].shape) for p in tensors}
        rule = self.entry.get("rule", {})
        if "checks" not in rule:
            want = ", ".join(f"{p['name']} {tuple(p['shape'])}" for p in tensors)
            raise BindingError(f"{self.where}: exported for the shapes {want} (the sizes "
                               f"{self.entry['sizes']}) only ({rule.get('unavailable')}); got "
                               f"{', '.join(f'{n} {s}' for n, s in shapes.items())}; export "
                               f"these sizes too")
        sizes = self._sizes(rule["sizes"], shapes)
        env = _Env(sizes, lambda h: self.max_threads(backend, h))
        got = rule_mod.resolve(rule, env)
        for p, want in zip(tensors, got["inputs"]):
            if shapes[p["name"]] != tuple(want):
                raise BindingError(f"{self.where}: argument '{p['name']}' (annotated "
                                   f"\"{p['annotation']}\") must have shape {tuple(want)} at "
                                   f"the sizes {sizes} read off the arguments, got "
                                   f"{shapes[p['name']]}")
        return CallLayout(got["outputs"], got["constants"], got["scratch"], got["launches"])

    def _sizes(self, sources: dict[str, list[Any]], shapes: dict[str, tuple[int, ...]]
               ) -> dict[str, int]:
        """The base sizes, read off the arguments' shapes as the rule's "sizes" says."""
        sizes: dict[str, int] = {}
        while len(sizes) < len(sources):
            ready = [(a, s) for a, s in sources.items()
                     if a not in sizes and all(d in sizes for d in s[2])]
            for axis, (name, dim, divisors, *derived) in ready:
                shape = shapes[name]
                by = math.prod(sizes[d] for d in divisors)
                if dim >= len(shape) or not by:
                    raise BindingError(f"{self.where}: cannot read size '{axis}' off argument "
                                       f"'{name}' of shape {shape}")
                if derived:                             # size = axis * mul // div + add
                    mul, div, add = derived[0]
                    sizes[axis] = (shape[dim] - add) * div // mul
                else:
                    sizes[axis] = shape[dim] // by
        return sizes

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values = self.values(args, kwargs)
        backend = self._backend(values)
        return self.run(values, backend, self.layout(values, backend))

    def _backend(self, values: dict[str, Any]) -> str:
        tensors = [values[p["name"]] for p in self.entry["inputs"] if p["kind"] == "tensor"]
        backend = self.backend or backends.current_backend(tensors)
        if any(is_array(t) for t in tensors) and backend not in ("mlx", "sim"):
            raise DeviceError(f"{self.where}: MLX arrays run on backend 'mlx' (or 'sim', the "
                              f"source MLX builds, in the simulator), not '{backend}'")
        return backend

    def run(self, values: dict[str, Any], backend: str, layout: CallLayout) -> Any:
        """One call at this layout (MLX arrays through export/mlx.py)."""
        if any(is_array(values[p["name"]]) for p in self.entry["inputs"]
               if p["kind"] == "tensor"):
            return mlx_run(self, values, backend, layout)
        tensors = [v for v in values.values() if isinstance(v, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")
        outs = [torch.empty(shape, dtype=DTYPES[o["dtype"]].torch, device=device)
                for shape, o in zip(layout.outputs, self.entry["outputs"])]
        bound, report = self._bind(values, outs, device, layout)
        lib = self.library(backend)
        casts = {int(k): v for k, v in self.entry["arg_casts"].items()} or None
        for host, threads, group in layout.launches:
            getattr(lib, host)(*bound, threads=threads, group_size=group, arg_casts=casts)
        if report is not None:
            flag, site, lo, hi = (int(v) for v in report.cpu())
            if flag:
                raise GatherIndexError(f"{self.entry['where']}: "
                                       f"{self.entry['index_errors'][site]}: index "
                                       f"{(hi << 32) | (lo & 0xFFFFFFFF)} is out of range")
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _bind(self, values: dict[str, Any], outs: list[torch.Tensor], device: torch.device,
              layout: CallLayout) -> tuple[list[Any], Optional[torch.Tensor]]:
        args: list[Any] = [None] * len(self.entry["arguments"])
        report, sorts = None, {}
        for a in self.entry["arguments"]:
            kind, i = a["kind"], a["index"]
            if kind == "input":
                args[i] = values[a["name"]].contiguous()
            elif kind == "output":
                args[i] = outs[a["output"]].view(-1) if outs[a["output"]].dim() == 0 \
                    else outs[a["output"]]
            elif kind == "scalar":
                args[i] = (float if a["type"] == "float" else int)(values[a["name"]])
            elif kind == "constant":
                args[i] = layout.constants[i]
            elif kind == "scratch":
                args[i] = torch.zeros(layout.scratch[i], dtype=torch.float32, device=device)
            elif kind == "report":
                args[i] = report = torch.zeros(4, dtype=torch.int32, device=device)
            else:                                                   # "sorted"
                if a["name"] not in sorts:
                    sorts[a["name"]] = torch.sort(values[a["name"]].reshape(-1).to(torch.int64),
                                                  stable=True)
                args[i] = sorts[a["name"]][0 if a["part"] == "keys" else 1]
        return args, report


class Exported:
    """The kernels of an export folder: `exported.rms_norm(...)` picks the specialisation
    whose shapes the arguments have (`exported["rms_norm"]` lists them all)."""

    def __init__(self, folder: Path, backend: Optional[str]) -> None:
        doc = json.loads((folder / "manifest.json").read_text())
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"{folder}/manifest.json has schema {doc.get('schema')!r}; this "
                             f"metalforge reads schema {SCHEMA}: export it again")
        self.kernels: dict[str, list[ExportedKernel]] = {}
        for e in doc["specialisations"]:
            self.kernels.setdefault(e["kernel"], []).append(ExportedKernel(e, folder, backend))

    def __getitem__(self, name: str) -> list[ExportedKernel]:
        return self.kernels[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self.__dict__.get("kernels", {}):
            raise AttributeError(f"no exported kernel {name!r}; exported: "
                                 f"{', '.join(self.__dict__.get('kernels', {}))}")
        specs = self.kernels[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            return choose(specs, args, kwargs)
        return call


def choose(specs: list[ExportedKernel], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call the specialisation that takes these arguments: one exported at their shapes, else
    the first whose rule covers them (its dtypes, sizes its checks admit); an error that
    says why each declined where none does."""
    found = []
    for k in specs:
        try:
            values = k.values(args, kwargs)
        except BindingError as e:
            found.append((k, None, e))
        else:
            found.append((k, values, None))
    order = sorted(found, key=lambda f: not (f[1] is not None and f[0].exact(f[1])))
    why = []
    for k, values, error in order:
        if values is None:
            why.append(str(error))
            continue
        try:
            backend = k._backend(values)
            layout = k.layout(values, backend)
        except MetalforgeError as e:
            why.append(str(e))
            continue
        return k.run(values, backend, layout)
    if len(why) == 1:
        raise BindingError(why[0])
    raise BindingError(f"no exported specialisation of '{specs[0].name}' takes these "
                       f"arguments:\n  " + "\n  ".join(why))


def load_exported(path: str | Path, backend: Optional[str] = None) -> Exported:
    """The kernels exported to `path` (`metalforge export`), callable without tracing: on MPS
    tensors through torch.mps.compile_shader on the exported source, or the built .metallib
    where torch has torch.mps.load_metallib; on CPU tensors through the simulator; on CUDA
    tensors through the cuda backend (`backend` overrides the tensors' device).

    Example (after `metalforge export k.py::rms_norm --dtype f16 --shape B=16 D=4096 -o out`)::

        lib = mf.load_exported("out")
        y = lib.rms_norm(x, w)          # x: f16 [16, 4096], w: f16 [4096]
    """
    return Exported(Path(path), backend)
