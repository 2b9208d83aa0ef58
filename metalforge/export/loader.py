"""Running exported kernels without tracing (`load_exported`): the manifest says what each
launch binds; the library is the exported Metal source compiled by the backend (or, on a Mac
whose torch has `torch.mps.load_metallib`, the .metallib the build script made)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from ..dtypes import ALL as DTYPES
from ..errors import BindingError, GatherIndexError
from ..runtime import backends
from .manifest import SCHEMA


def _library(folder: Path, entry: dict[str, Any], backend: str) -> Any:
    metallib = folder / Path(entry["source"]).with_suffix(".metallib").name
    loader = getattr(torch.mps, "load_metallib", None) if backend == "mps" else None
    if loader is not None and metallib.exists():
        return loader(str(metallib))
    return backends.library(backend, (folder / entry["source"]).read_text())


@dataclass
class ExportedKernel:
    """One exported specialisation, callable like the kernel at its exported shapes: tensors
    and scalars positionally or by name; returns the output (a tuple for several)."""
    entry: dict[str, Any]
    folder: Path
    backend: Optional[str] = None
    _lib: Any = None

    @property
    def name(self) -> str:
        return str(self.entry["kernel"])

    def _values(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        params = self.entry["inputs"]
        values = dict(zip((p["name"] for p in params), args))
        values.update(kwargs)
        for p in params:
            if p["name"] not in values:
                if "default" not in p:
                    raise BindingError(f"{self.entry['where']}: missing argument '{p['name']}'")
                values[p["name"]] = p["default"]
            elif p["kind"] == "tensor":
                self._check(p, values[p["name"]])
        return values

    def _check(self, p: dict[str, Any], t: Any) -> None:
        want = (tuple(p["shape"]), DTYPES[p["dtype"]].torch)
        if not isinstance(t, torch.Tensor) or (tuple(t.shape), t.dtype) != want:
            got = (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__
            raise BindingError(f"{self.entry['where']} (exported): argument '{p['name']}' must "
                               f"be a tensor of shape {want[0]} and dtype {want[1]} (the "
                               f"exported sizes {self.entry['sizes']}), got {got}; export "
                               f"these sizes too")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values = self._values(args, kwargs)
        tensors = [v for v in values.values() if isinstance(v, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")
        backend = self.backend or backends.current_backend(tensors)
        outs = [torch.empty(o["shape"], dtype=DTYPES[o["dtype"]].torch, device=device)
                for o in self.entry["outputs"]]
        bound, report = self._bind(values, outs, device)
        if self._lib is None:
            self._lib = _library(self.folder, self.entry, backend)
        casts = {int(k): v for k, v in self.entry["arg_casts"].items()} or None
        for launch in self.entry["launches"]:
            getattr(self._lib, launch["host_name"])(
                *bound, threads=launch["threads"], group_size=launch["group_size"],
                arg_casts=casts)
        if report is not None:
            flag, site, lo, hi = (int(v) for v in report.cpu())
            if flag:
                raise GatherIndexError(f"{self.entry['where']}: "
                                       f"{self.entry['index_errors'][site]}: index "
                                       f"{(hi << 32) | (lo & 0xFFFFFFFF)} is out of range")
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _bind(self, values: dict[str, Any], outs: list[torch.Tensor], device: torch.device
              ) -> tuple[list[Any], Optional[torch.Tensor]]:
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
                args[i] = a["value"]
            elif kind == "scratch":
                args[i] = torch.zeros(a["floats"], dtype=torch.float32, device=device)
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
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            for k in specs:
                want = [tuple(p["shape"]) for p in k.entry["inputs"] if p["kind"] == "tensor"]
                if want[:len(shapes)] == shapes:
                    return k(*args, **kwargs)
            return specs[0](*args, **kwargs)        # its error names the exported shapes
        return call


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
