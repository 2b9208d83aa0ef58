"""The warm-call fast path of calls that write into given tensors (`out=`, declared in-place
outputs): a checked call's closure (`fastpath.Warm`, replayed with the caller's outs), plus
the checks that depend on the out tensors' memory rather than on the warm key: where they start
(the alignment vector stores need) and what they overlap (`outputs.check_aliasing`). The key
(`CallPath`) holds the outs' dtypes, shapes, strides and devices, so those checks hold."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

from ..graph import Graph
from . import outputs
from .fastpath import Warm
from .launcher import CheckedCall


@dataclass(frozen=True)
class Into:
    """A warm call writing into given outs (`replay`)."""
    warm: Warm
    where: str
    graph: Graph
    family: str
    read: tuple[tuple[str, int], ...]         # inputs the kernel reads: (name, position)
    widths: Mapping[int, int]                 # output -> elements per vector store

    @classmethod
    def of(cls, call: CheckedCall, warm: Warm) -> Into:
        g = call.spec.graph
        position = {p.name: i for i, p in enumerate(g.params)}
        read = outputs.reads(g)
        widths = outputs.widths(call.spec.schedule(call.index64)) if call.numel else {}
        return cls(warm, call.spec.where, g, call.spec.family,
                   tuple((n, position[n]) for n in read), widths)

    def current(self) -> bool:
        return self.warm.current()

    def replay(self, values: Sequence[Any], out: Any,
               inplace: Sequence[tuple[int, int]]) -> Any:
        """The call again, on `values` (parameter order), `out` (the call's out= argument) and
        the declared in-place outputs (output, position of its argument in `values`)."""
        n = len(self.graph.outputs)
        outs: list[Optional[torch.Tensor]] = \
            list(outputs.split(self.where, out, n)) if out is not None else [None] * n
        labels = list(outputs.Outs(outs).labels)
        for i, pos in inplace:
            outs[i] = values[pos]
            labels[i] = f"argument '{self.graph.params[pos].name}' (written in place)"
        given = outputs.Outs(outs, labels)
        outputs.check_alignment(self.where, self.graph, given, self.widths)
        outputs.check_aliasing(self.where, self.graph, self.family, given,
                               {name: values[pos] for name, pos in self.read},
                               [name for name, _ in self.read])
        return self.warm.replay(values, given)


def out_key(out: Any) -> Optional[tuple[Any, ...]]:
    """The part of a warm key an `out=` argument adds (each out's dtype, shape, strides,
    device), or None when the call must take the full path (not tensors, or one that requires
    grad while grad mode is on: refused there)."""
    if out is None:
        return ()
    items = (out,) if type(out) is torch.Tensor else out if isinstance(out, tuple) else None
    if items is None:
        return None
    key: list[Any] = [type(out)]
    grad = torch.is_grad_enabled()
    for t in items:
        if t is None:
            key.append(None)
        elif type(t) is not torch.Tensor or (grad and t.requires_grad):
            return None
        else:
            key += [t.dtype, t.shape, t.stride(), t.device]
    return tuple(key)
