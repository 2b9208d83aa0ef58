"""The binding of a kernel's differentiable calls, kept per warm key (#53).

A call whose tensors require grad (grad mode on) never replays a closure (`fastpath`): it runs
through autograd (`autograd.call_differentiable`). What it binds first, though, the frontend's
checks and the traced graph (`Kernel._bound`), depends only on what the warm key holds (every
tensor's type, dtype, shape, strides and device, every scalar's type, every Const's value) and
on the scalars' values (their range: `dtypes.check_int64`, `check_float`). `GradBinding` keeps
the graph a call's first binding traced under its key (`fastpath.key_function(kinds,
grad=True)`), and a later call with the key takes its values as they are: tensors, and scalars
the frontend would pass unchanged (a float for a float parameter, a bool for a bool, an int in
the int64 range for an int); any other value binds again, with the frontend's checks and errors.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from ..bounded import Bounded
from ..dtypes import INT64_MAX, INT64_MIN
from ..graph import ConstParam, Graph, ScalarParam
from .fastpath import key_function

Bind = Callable[[tuple[Any, ...], Mapping[str, Any]], tuple[Graph, Mapping[str, Any]]]
# per runtime value of the graph: (name, position among the call's arguments, scalar type or
# None for a tensor)
Plan = tuple[tuple[str, int, Optional[type]], ...]


class GradBinding:
    """The traced graphs of one kernel's differentiable calls, by warm key.

    kinds: each parameter's kind ("tensor", "scalar", "const"); names: their names, in
    order."""

    def __init__(self, kinds: Sequence[str], names: Sequence[str], backend: Optional[str]):
        self._key = key_function(kinds, grad=True)
        self._position = {n: i for i, n in enumerate(names)}
        self._backend = backend
        self._graphs: Bounded[tuple[Graph, Optional[Plan]]] = Bounded(64)

    def bound(self, bind: Bind, args: tuple[Any, ...], kwargs: Mapping[str, Any],
              values: Optional[Sequence[Any]]) -> tuple[Graph, Mapping[str, Any]]:
        """`bind(args, kwargs)`: (the traced graph, the runtime values) of a call whose
        arguments in parameter order are `values` (None: the call binds)."""
        key = None if values is None or not torch.is_grad_enabled() else \
            self._key(values, self._backend)
        got = self._graphs.get(key)
        if got is not None and got[1] is not None and values is not None:
            taken = _values(got[1], values)
            if taken is not None:
                return got[0], taken
        graph, vals = bind(args, kwargs)
        if got is None:
            self._graphs.put(key, (graph, self._plan(graph)))
        return graph, vals

    def _plan(self, graph: Graph) -> Optional[Plan]:
        """Where each runtime value of `graph` is among the call's arguments (None where a
        parameter is not one of them)."""
        params = [p for p in graph.params if not isinstance(p, ConstParam)]
        if any(p.name not in self._position for p in params):
            return None
        return tuple((p.name, self._position[p.name],
                      p.pytype if isinstance(p, ScalarParam) else None) for p in params)


def _values(plan: Plan, values: Sequence[Any]) -> Optional[dict[str, Any]]:
    """The runtime values by name, as the frontend's binding makes them, or None where a
    scalar is not one it passes unchanged."""
    out = {}
    for name, i, pytype in plan:
        v = values[i]
        if pytype is not None and type(v) is not pytype:
            return None
        if pytype is int and not INT64_MIN <= values[i] <= INT64_MAX:
            return None
        out[name] = v
    return out
