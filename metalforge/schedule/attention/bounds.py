"""The keys a query row can see, read from the scores' mask: bounds on index(L) that let the
kernels skip masked keys and the schedule count only the keys it reads."""
from __future__ import annotations

from typing import Optional

from ...graph import BinaryOp, Node, Op, strip_casts, topo_order
from .match import Form

_BOUND = {BinaryOp.LT: ("hi", 0), BinaryOp.LE: ("hi", 1), BinaryOp.GT: ("lo", 1),
          BinaryOp.GE: ("lo", 0)}
_MIRROR = {BinaryOp.LT: BinaryOp.GT, BinaryOp.LE: BinaryOp.GE, BinaryOp.GT: BinaryOp.LT,
           BinaryOp.GE: BinaryOp.LE}
_INT_ARITH = (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.FLOORDIV, BinaryOp.MAXIMUM,
              BinaryOp.MINIMUM)


def _conjuncts(n: Node) -> list[Node]:
    n = strip_casts(n)
    if n.op == Op.BINARY and n.attr == BinaryOp.AND:
        return _conjuncts(n.args[0]) + _conjuncts(n.args[1])
    return [n]


def _is_index(n: Node, axis: str) -> bool:
    return n.op == Op.INDEX and n.attr == axis


def _key_free_int(n: Node, key: str) -> bool:
    """An integer expression of indices other than `key`, sizes, integer scalars and
    constants (the same for every key of a row)."""
    n = strip_casts(n)
    if not n.dtype.is_int:
        return False
    if n.op in (Op.SIZE, Op.SCALAR) or (n.op == Op.INDEX and n.attr != key):
        return True
    if n.op == Op.CONST:
        return isinstance(n.attr, int) and not isinstance(n.attr, bool)
    return n.op == Op.BINARY and n.attr in _INT_ARITH and all(
        _key_free_int(a, key) for a in n.args)


def _where(form: Form) -> Optional[tuple[Node, Node]]:
    """(c, s) when the scores' last step is `where(c, s, -inf)`, else None."""
    sc = strip_casts(form.scores)
    if sc.op != Op.WHERE:
        return None
    cond, kept, other = sc.args[0], sc.args[1], sc.args[2]
    other = strip_casts(other)
    if other.op != Op.CONST or other.attr != float("-inf"):
        return None
    return cond, kept


def _bound(c: Node, key: str, rows: tuple[str, ...]) -> Optional[tuple[str, Node, int]]:
    """The bound conjunct `c` puts on index(`key`), or None when it is none."""
    if c.op != Op.BINARY or c.attr not in _BOUND or not all(
            a.dtype.is_int for a in c.args):     # compared as integers, not floats
        return None
    x, y = (strip_casts(a) for a in c.args)
    op = c.attr
    if _is_index(y, key) and _key_free_int(x, key):     # f op L  ==  L op' f
        x, y, op = y, x, _MIRROR[op]
    if _is_index(x, key) and _key_free_int(y, key) and all(
            m.attr in rows for m in topo_order([y]) if m.op == Op.INDEX):
        return _BOUND[op][0], y, _BOUND[op][1]
    return None


def key_bounds(form: Form, rows: tuple[str, ...]) -> list[tuple[str, Node, int]]:
    """The keys a query row can see, from the scores' mask: when the scores' last step is
    `where(c, s, -inf)`, each conjunct of c comparing index(L) with an integer expression
    f of the other indices, sizes and integer scalars is a bound, ('lo', f, a): keys
    >= f + a, or ('hi', f, a): keys < f + a (causal: hi = pos + 1; a sliding window also
    lo = pos - window + 1). Keys outside them are masked whatever their values."""
    found = _where(form)
    if found is None:
        return []
    bounds = (_bound(c, form.key, rows) for c in _conjuncts(found[0]))
    return [b for b in bounds if b is not None]


def unmasked(form: Form, rows: tuple[str, ...]) -> Optional[Node]:
    """The scores without their mask (s of `where(c, s, -inf)`) where every conjunct of c is
    a bound (`key_bounds`): the scores of a key inside every bound of a row, else None."""
    found = _where(form)
    if found is None:
        return None
    conds = _conjuncts(found[0])
    if any(_bound(c, form.key, rows) is None for c in conds):
        return None
    return found[1]
