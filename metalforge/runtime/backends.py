"""Backends: where a generated kernel runs, how one is chosen, and the compiled-library cache.

Both backends expose one call model, `torch.mps.compile_shader`'s: `compile(source)` returns a
library; `getattr(lib, host_name)` a kernel object called as
`kernel(*args, threads=, group_size=, arg_casts=)` (positional buffer binding, dispatchThreads).

- "mps": `torch.mps.compile_shader` on MPS tensors (Metal on Apple GPUs).
- "sim": `metalforge.sim.compile_shader` on CPU tensors (the MSL compiled as C++ and run on the
  CPU with real threadgroup/simdgroup semantics).
- "cuda": `metalforge.cuda.compile_shader` on CUDA tensors (the same MSL translated to CUDA C++
  and compiled with NVRTC, launched on torch's current stream).

- "mlx": `mx.fast.metal_kernel` on `mlx.core.array` inputs (metalforge.runtime.mlx has its own
  call path; under "sim", MLX arrays run the source MLX builds in the simulator).

Precedence: an explicit `backend=` (from `@mf.kernel(backend=...)`) > the innermost
`with mf.backend(...)` block > the tensors' device (mps → "mps", cuda → "cuda", cpu → "sim";
MLX arrays → "mlx").
"""
from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any, Iterable, Optional

import torch

from ..cache import key_lock
from ..cuda import compile_shader as cuda_compile_shader
from ..errors import BackendUnavailable, DeviceError
from ..sim import compile_shader as sim_compile_shader
from .counters import COUNTERS

BACKENDS = ("mps", "sim", "cuda", "mlx")
DEVICE_OF = {"mps": "mps", "sim": "cpu", "cuda": "cuda", "mlx": "mlx"}  # each backend's device
_override: ContextVar[Optional[str]] = ContextVar("metalforge_backend", default=None)


def check_name(name: Any) -> str:
    if not isinstance(name, str) or name not in BACKENDS:
        raise DeviceError(f"unknown metalforge backend {name!r}; choose one of: "
                          f"{', '.join(BACKENDS)}")
    return name


class backend:
    """Select the backend ("mps", "sim", "cuda" or "mlx") for kernel calls in a `with` block.

    Example::

        with mf.backend("sim"):
            y = silu(x)          # the simulator, whatever the tensors' device allows
    """

    def __init__(self, name: str) -> None:
        self.name = check_name(name)
        self._tokens: list[Token[Optional[str]]] = []

    def __enter__(self) -> "backend":
        self._tokens.append(_override.set(self.name))
        return self

    def __exit__(self, *exc: object) -> None:
        _override.reset(self._tokens.pop())

    def __repr__(self) -> str:
        return f"metalforge.backend({self.name!r})"


def device_backend(device_type: str) -> str:
    """The backend that runs on a torch device type: "mps", "cuda", else the simulator."""
    return {"mps": "mps", "cuda": "cuda"}.get(device_type, "sim")


def current_backend(tensors: Iterable[torch.Tensor] = ()) -> str:
    """The backend a call with these tensors uses: the `with` override, else their device."""
    name = _override.get()
    if name is not None:
        return name
    for t in tensors:
        if type(t).__module__ == "mlx.core":
            return "mlx"
        return device_backend(t.device.type)
    return "mps" if torch.backends.mps.is_available() else "sim"


# --------------------------------------------------------------------------- compilation

Options = tuple[tuple[str, int], ...]   # compile keywords (a target's Metal version, family)
_libraries: dict[tuple[str, str, Options], Any] = {}  # (backend, source, options) → library
_kernels: dict[tuple[str, str, str, Options], Any] = {}   # (..., host name) → kernel object


def _compile(backend_name: str, source: str, options: Options = ()) -> Any:
    if backend_name == "mps":
        if not torch.backends.mps.is_available():
            raise BackendUnavailable(
                "backend 'mps' needs an Apple-silicon Mac with MPS available; on "
                "other machines use CPU tensors (the 'sim' backend)")
        return torch.mps.compile_shader(source)
    if backend_name == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailable(
                "backend 'cuda' needs an NVIDIA GPU with torch's CUDA build; on "
                "other machines use CPU tensors (the 'sim' backend)")
        return cuda_compile_shader(source, **_keywords(options))
    return sim_compile_shader(source, **_keywords(options))


def _keywords(options: Options) -> dict[str, Any]:
    """A target's compile keywords (none for code that assumes nothing: the call as always)."""
    return dict(options)


def library(backend_name: str, source: str, options: Options = ()) -> Any:
    """The compiled library of `source` on a backend (cached; compile errors raise as the
    backend's compiler raises them: compile_shader's SyntaxError or RuntimeError). `options`:
    the compile keywords of the code's target (`metalforge.target.compile_options`)."""
    key = (backend_name, source, options)
    lib = _libraries.get(key)
    if lib is None:
        with key_lock(f"{backend_name}\0{source}\0{options}"):
            lib = _libraries.get(key)
            if lib is None:
                # (code that assumes no target compiles as always: _compile(backend, source))
                lib = _libraries[key] = _compile(backend_name, source, options) if options \
                    else _compile(backend_name, source)
    return lib


def kernel_object(backend_name: str, source: str, host_name: str,
                  options: Options = ()) -> Any:
    """The compiled kernel (cached: one library per source and options, one kernel object per
    name).

    Thread-safe: one compile per source (`library`); other threads calling it meanwhile wait
    for it."""
    key = (backend_name, source, host_name, options)
    k = _kernels.get(key)
    if k is None:
        k = _kernels.setdefault(key, getattr(library(backend_name, source, options), host_name))
    return k


def clear_caches() -> None:
    """Forget compiled libraries (the simulator's on-disk cache is separate)."""
    COUNTERS.clear()                  # one-launch ticket counters: zeroed ones made anew
    _libraries.clear()
    _kernels.clear()
