"""Runtime: run a graph specialisation on a backend; show its MSL or IR.

    CallPath / call(graph, values, backend, launch)   a kernel's calls: the one way in
    run(graph, values, backend=None, launch=None)   checks, allocates, compiles (cached), launches
    source(graph, values=None, sizes=None, launch=None) -> str     the MSL
    ir(graph, values=None, sizes=None, launch=None) -> str         the lowered kernel, as text
    schedule_of(graph, values=None, sizes=None, launch=None)       the Schedule (traffic, launch)
    launches(graph, values, backend, launch)        what a call would launch, without running
    reference(graph, values)                        torch's evaluation (MLX arrays too)
    backward_source(graph, values, sizes, launch)   the MSL of the derived backward kernels
    backend("sim") / current_backend(tensors)      selection and override
    mlx                 the MLX backend: the same kernels through mx.fast.metal_kernel
    outputs             out= and declared in-place outputs: checks, aliasing

The stages themselves (plan → render → compile → bind → dispatch) are in `launcher`; where
each argument comes from, in `binding`; the warm-call replay, in `fastpath`.
"""
from __future__ import annotations

from ..errors import DeviceError
from . import launcher, mlx, outputs
from .autograd import backward_source
from .backends import BACKENDS, backend, clear_caches, current_backend
from .calls import CallPath, call
from .launcher import compiled
from .layout import check_dense
from .mlx import dtype_of as array_dtype
from .mlx import is_array
from .runs import reference, run
from .show import ir, launches, schedule_of, source

__all__ = ["run", "call", "CallPath", "source", "ir", "schedule_of", "launches", "reference",
           "backward_source", "backend", "current_backend", "BACKENDS", "DeviceError",
           "clear_caches", "compiled", "check_dense", "is_array", "array_dtype", "launcher",
           "mlx", "outputs"]
