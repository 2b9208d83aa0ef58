"""Running one specialisation: MLX arrays through `mlx`, torch tensors through the launcher's
stages (check, bind, dispatch). `run` is what every caller uses (the kernel's call path,
autograd's forward and backward kernels, torch operators, the autotuner); `run_recorded` also
returns the warm closure (`fastpath.Warm`) that replays the call."""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ..errors import DeviceError
from ..graph import Graph
from ..reference import evaluate
from . import launcher, mlx
from .backends import check_name, current_backend
from .fastpath import Warm, record, tuning_state
from .into import Into
from .outputs import Outs


def run(graph: Graph, values: Mapping[str, Any], backend: Optional[str] = None,
        launch: Optional[Mapping[str, Any]] = None, outs: Optional[Outs] = None) -> Any:
    """Run one specialisation. values: every tensor and runtime scalar by name; outs: the
    tensors to write the outputs into (`outputs.given`), None to allocate them.
    Returns the output tensor, or a tuple of them for several outputs."""
    return _run(graph, values, backend, launch, False, outs)[0]


def run_recorded(graph: Graph, values: Mapping[str, Any], backend: Optional[str],
                 launch: Optional[Mapping[str, Any]]) -> tuple[Any, Optional[Warm]]:
    """`run`, also returning the closure that replays this call: (result, Warm), or
    (result, None) for a call the fast path does not replay (MLX arrays; outputs beside an
    empty grid, which no kernel computed)."""
    result, warm, _ = _run(graph, values, backend, launch, True)
    return result, warm


def run_into(graph: Graph, values: Mapping[str, Any], backend: Optional[str],
             launch: Optional[Mapping[str, Any]], outs: Outs) -> tuple[Any, Optional[Into]]:
    """`run_recorded` of a call writing into the caller's `outs`: the closure is an `Into`."""
    result, warm, call = _run(graph, values, backend, launch, True, outs)
    return result, None if warm is None or call is None else Into.of(call, warm)


def _run(graph: Graph, values: Mapping[str, Any], backend: Optional[str],
         launch: Optional[Mapping[str, Any]], recorded: bool, outs: Optional[Outs] = None
         ) -> tuple[Any, Optional[Warm], Optional[launcher.CheckedCall]]:
    if backend is not None:
        check_name(backend)
    if any(mlx.is_array(v) for v in values.values()):
        return mlx.run(graph, values, backend, launch), None, None
    if (backend or current_backend()) == "mlx":
        raise DeviceError(f"kernel '{graph.name}': backend 'mlx' runs on mlx.core.array "
                          "arguments, got torch tensors; convert them with mx.array(...) or "
                          "choose backend 'mps' or 'sim'")
    tuning = tuning_state() if recorded else None
    call = launcher.check_call(graph, values, backend, launch, outs)
    bound = launcher.bind(call) if call.numel else None
    result = call.outputs[0] if len(call.outputs) == 1 else tuple(call.outputs)
    if bound is not None:
        launcher.dispatch(bound)
    elif launcher.outputs_beside_an_empty_grid(call):
        return result, None, None               # not replayed: no kernel computed them
    given = tuple(i for i, t in enumerate(outs or ()) if t is not None)
    return result, None if tuning is None else record(call, bound, tuning, given), call


def reference(graph: Graph, values: Mapping[str, Any]) -> Any:
    """`graph` evaluated with torch eager ops (float64 math) on these values; MLX arrays are
    evaluated on copies as CPU tensors and the results returned as MLX arrays."""
    if not any(mlx.is_array(v) for v in values.values()):
        return evaluate(graph, values)
    out = evaluate(graph, {n: mlx.to_torch(v) if mlx.is_array(v) else v    # MLX in, MLX out
                           for n, v in values.items()})
    return tuple(map(mlx.to_mlx, out)) if isinstance(out, tuple) else mlx.to_mlx(out)
