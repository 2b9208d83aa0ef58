"""What an attention backward graph is made of (`Roles`), registered by the autodiff side
(`metalforge.adjoints_attention`) when it builds the graph: the family reads the roles instead
of searching the graph for them (the graph is the math for the reference; the kernel computes
its reductions in its own passes)."""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

from ...graph import Graph, Node
from ...once import OnceMap
from ..attention.match import Form


@dataclass(frozen=True)
class Roles:
    """kind "dq": over query rows (output dq); kind "dkdv": over keys (outputs dk and/or
    dv); both read the rows' lse and delta from the earlier kernels' buffers."""
    kind: str
    key: str                    # L
    e: str                      # E
    rows: tuple[str, ...]       # the query rows' axes (own + tile)
    tile: tuple[str, ...]       # the rows' axes the keys do not have (R, S)
    own: tuple[str, ...]        # the rows' axes the keys have (B, G)
    c: Node                     # the score contraction over E (its value: a dot)
    q: Node                     # the loads: q (rows + E), k and v (own + L + E), dO
    k: Node
    v: Node
    dy: Node
    p: Node                     # P = exp(s - lse) over rows + L
    dp: Node                    # dP = sum_E dO v (its value: a dot)
    dc: Node                    # dL/dc over rows + L
    lse: Node                   # the rows' lse and delta: loads of earlier kernels' buffers
    delta: Node
    outputs: tuple[str, ...]    # per graph output: "dq", or "dk" and/or "dv"
    form: Optional[Form] = None   # the forward's attention form (its scores' index bounds)


# graph id -> its roles, dropped when the graph is collected
_ROLES: OnceMap[int, Roles] = OnceMap()


def register(graph: Graph, roles: Roles) -> None:
    _ROLES[id(graph)] = roles
    weakref.finalize(graph, _ROLES.pop, id(graph), None)


def roles_of(graph: Graph) -> Optional[Roles]:
    """The roles of an attention backward graph, None for any other graph."""
    return _ROLES.get(id(graph))
