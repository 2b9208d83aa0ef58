"""Symbolic sizes: the schedules' launch rules (Python code) run on `SymInt` integers, so that an
export can write them down as formulas of the sizes instead of stating them a second time.

A `SymInt` records `+ - * // % << >> & |`, unary minus and `bit_length()` (`maximum` is one
formula). A comparison is a `SymBool`; where the rule branches on one (`if`, `and`, Python's
`min` and `max`), `trace` runs the rule again for each outcome, so the result is
a decision tree whose leaves are the rule's results on that path. Anything else a rule does with
a size (`int()`, `range()`, a float, a dict key) raises `NotSymbolic`: the rule is then not
expressible this way, and the caller keeps its per-shape table instead of a wrong formula.

Expressions are JSON-able: an int, a name (a size, or another symbol such as
`max_threads(host)`), or `[op, arg, ...]` with op one of
`+ - * // % << >> & | neg max cdiv bit_length` (`//` and `%` floor, as Python's; `cdiv` is
ceil(a / b) for b > 0; `bit_length` of a non-negative value) and, in conditions, `<= == not`.
`evaluate(expr, env)` computes one; `text(expr)` writes it for a reader.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Union

Expr = Union[int, str, tuple]       # tuple: (op, *args)
MAX_PATHS = 1024                    # more paths than this: not expressible (a tree too large)


class NotSymbolic(Exception):
    """The rule did something with a size that has no formula here (`int()`, a float, ...)."""


# --------------------------------------------------------------------------- construction

def _fold(op: str, a: Expr, b: Expr) -> Expr:
    """(op a b), constants folded and identities dropped (x + 0, x * 1, x // 1, ...)."""
    if isinstance(a, int) and isinstance(b, int):
        return int(_BINARY[op](a, b))
    if op in ("+", "-", "<<", ">>", "|") and b == 0:
        return a
    if op in ("+", "|") and a == 0:
        return b
    if op == "*" and (a == 0 or b == 0):
        return 0
    if op == "*" and b == 1 or op == "//" and b == 1:
        return a
    if op == "*" and a == 1:
        return b
    if op == "//" and isinstance(a, tuple) and a[0] == "neg":       # -(-x // y): ceil
        return ("neg", ("cdiv", a[1], b))
    return (op, a, b)


def _neg(a: Expr) -> Expr:
    if isinstance(a, int):
        return -a
    if isinstance(a, tuple) and a[0] == "neg":
        return a[1]
    return ("neg", a)


def _expr(v: Any) -> Expr:
    if isinstance(v, SymInt):
        return v.e
    if isinstance(v, bool) or not isinstance(v, int):
        raise NotSymbolic(f"a size combined with {type(v).__name__} {v!r}")
    return int(v)


def wrap(e: Expr) -> Any:
    """A SymInt for an expression, or the int itself when it is a constant."""
    return e if isinstance(e, int) else SymInt(e)


class SymInt:
    """A symbolic non-negative integer (a size, or a formula of sizes)."""
    __slots__ = ("e",)
    __hash__ = None                 # type: ignore[assignment]   # no dict keys

    def __init__(self, e: Expr) -> None:
        self.e = e

    def _bin(self, op: str, other: Any, swap: bool = False) -> Any:
        a, b = _expr(self), _expr(other)
        return wrap(_fold(op, b, a) if swap else _fold(op, a, b))

    def __add__(self, o: Any) -> Any: return self._bin("+", o)
    def __radd__(self, o: Any) -> Any: return self._bin("+", o, True)
    def __sub__(self, o: Any) -> Any: return self._bin("-", o)
    def __rsub__(self, o: Any) -> Any: return self._bin("-", o, True)
    def __mul__(self, o: Any) -> Any: return self._bin("*", o)
    def __rmul__(self, o: Any) -> Any: return self._bin("*", o, True)
    def __floordiv__(self, o: Any) -> Any: return self._bin("//", o)
    def __rfloordiv__(self, o: Any) -> Any: return self._bin("//", o, True)
    def __mod__(self, o: Any) -> Any: return self._bin("%", o)
    def __rmod__(self, o: Any) -> Any: return self._bin("%", o, True)
    def __lshift__(self, o: Any) -> Any: return self._bin("<<", o)
    def __rlshift__(self, o: Any) -> Any: return self._bin("<<", o, True)
    def __rshift__(self, o: Any) -> Any: return self._bin(">>", o)
    def __rrshift__(self, o: Any) -> Any: return self._bin(">>", o, True)
    def __and__(self, o: Any) -> Any: return self._bin("&", o)
    def __rand__(self, o: Any) -> Any: return self._bin("&", o, True)
    def __or__(self, o: Any) -> Any: return self._bin("|", o)
    def __ror__(self, o: Any) -> Any: return self._bin("|", o, True)
    def __neg__(self) -> Any: return wrap(_neg(self.e))
    def __pos__(self) -> Any: return self

    def bit_length(self) -> Any:
        return SymInt(("bit_length", self.e))

    def __le__(self, o: Any) -> "SymBool": return _cmp("<=", self, o)
    def __ge__(self, o: Any) -> "SymBool": return _cmp("<=", o, self)
    def __lt__(self, o: Any) -> "SymBool": return SymBool(("not", _cmp("<=", o, self).e))
    def __gt__(self, o: Any) -> "SymBool": return SymBool(("not", _cmp("<=", self, o).e))
    def __eq__(self, o: Any) -> "SymBool": return _cmp("==", self, o)   # type: ignore[override]
    def __ne__(self, o: Any) -> "SymBool": return SymBool(("not", _cmp("==", self, o).e))  # type: ignore[override]

    def __bool__(self) -> bool:
        return bool(self != 0)

    def _refuse(self, *_: Any) -> Any:
        raise NotSymbolic(f"the size formula {text(self.e)} used as a Python int")
    __int__ = __index__ = __float__ = __truediv__ = __rtruediv__ = __pow__ = _refuse
    __abs__ = __round__ = __trunc__ = __floor__ = __ceil__ = _refuse

    def __str__(self) -> str:
        return text(self.e)

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return text(self.e)


def _cmp(op: str, a: Any, b: Any) -> "SymBool":
    ea, eb = _expr(a), _expr(b)
    if isinstance(ea, int) and isinstance(eb, int):
        return SymBool(int(_BINARY[op](ea, eb)))
    return SymBool((op, ea, eb))


class SymBool:
    """A condition on sizes; `bool()` of it is a branch of the rule (see `trace`)."""
    __slots__ = ("e",)
    __hash__ = None                 # type: ignore[assignment]

    def __init__(self, e: Expr) -> None:
        self.e = e

    def __bool__(self) -> bool:
        if isinstance(self.e, int):
            return bool(self.e)
        path = _PATH.current
        if path is None:
            raise NotSymbolic(f"a branch on {text(self.e)} outside a trace")
        return path.decide(self.e)

    def __invert__(self) -> "SymBool":
        return SymBool(("not", self.e))


# --------------------------------------------------------------------------- tracing

class _Local(threading.local):
    current: Optional["_Path"] = None


_PATH = _Local()


class _Path:
    """One run of the rule: the outcome of each branch, forced for a prefix, True after it;
    conditions that the path's earlier ones decide (`Bounds.implied`) are not branches."""

    def __init__(self, forced: list[bool], bounds: "Bounds") -> None:
        self.forced = forced
        self.bounds = bounds
        self.taken: list[tuple[Expr, bool]] = []     # (condition without "not", outcome)

    def decide(self, cond: Expr) -> bool:
        flip = False
        while isinstance(cond, tuple) and cond[0] == "not":
            cond, flip = cond[1], not flip
        for c, v in self.taken:                      # the same condition again: its outcome
            if c == cond:
                return v != flip
        known = self.bounds.implied(cond)
        if known is not None:
            return known != flip
        i = len(self.taken)
        v = self.forced[i] if i < len(self.forced) else True
        self.taken.append((cond, v))
        self.bounds.learn(cond, v)
        return v != flip


class Bounds:
    """What a path knows of each symbol: an interval, narrowed by the single-symbol conditions
    it took. A condition whose two sides are monotone in their symbols is decided where the
    sides' ranges over those intervals do not overlap (it then holds on the whole path)."""

    def __init__(self, initial: Mapping[str, tuple[int, int]],
                 memo: dict[Any, Any]) -> None:
        self.initial = initial
        self.range = dict(initial)
        self.memo = memo           # shared by the paths of one trace: (what, args) -> result

    def _cached(self, key: Any, f: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = f()
        return self.memo[key]

    def _direction(self, e: Expr) -> Optional[int]:
        """`_direction` over the initial ranges: monotone there, so on any narrower ones."""
        return self._cached(("dir", e), lambda: _direction(e, self.initial))  # type: ignore

    def _box(self, cond: Expr) -> tuple[Any, ...]:
        return tuple(sorted((n, self.range[n]) for n in _symbols(cond)))

    def _span(self, e: Expr) -> Optional[tuple[int, int]]:
        d = self._direction(e)
        if d is None:
            return None
        lo = {k: v[0] for k, v in self.range.items()}
        hi = {k: v[1] for k, v in self.range.items()}
        a, b = evaluate(e, lo), evaluate(e, hi)
        return (a, b) if d >= 0 else (b, a)

    def implied(self, cond: Expr) -> Optional[bool]:
        if not isinstance(cond, tuple) or cond[0] not in ("<=", "=="):
            return None
        return self._cached(("implied", cond, self._box(cond)),   # type: ignore[no-any-return]
                            lambda: self._implied(cond))

    def _implied(self, cond: tuple) -> Optional[bool]:  # type: ignore[type-arg]
        if cond[1] == cond[2]:
            return True
        x, y = self._span(cond[1]), self._span(cond[2])
        if x is None or y is None:
            return None
        if cond[0] == "<=":
            return True if x[1] <= y[0] else False if x[0] > y[1] else None
        if x[1] < y[0] or y[1] < x[0]:
            return False
        return True if x[0] == x[1] == y[0] == y[1] else None

    def learn(self, cond: Expr, v: bool) -> None:
        """Narrow the interval of the one symbol of `cond` (monotone in it), given outcome v."""
        names = _symbols(cond)
        if len(names) != 1 or not isinstance(cond, tuple) or cond[0] != "<=":
            return
        (name,) = names
        self.range[name] = self._cached(("learn", cond, v, self.range[name]),
                                        lambda: self._narrowed(cond, v, name))

    def _narrowed(self, cond: tuple, v: bool, name: str) -> tuple[int, int]:  # type: ignore[type-arg]
        lo, hi = self.range[name]
        a, b = self._direction(cond[1]), self._direction(cond[2])
        if a is None or b is None or _agree(a, -b) is None:   # lhs - rhs not monotone
            return lo, hi

        def holds(n: int) -> bool:
            return evaluate(cond, {name: n}) == 1
        up = holds(hi) and not holds(lo)            # false below some point, true above
        if holds(lo) == holds(hi):
            return lo, hi
        a, b = lo, hi                                # holds(a) != holds(b): find the switch
        while b - a > 1:
            m = (a + b) // 2
            a, b = (m, b) if holds(m) == holds(lo) else (a, m)
        return (b, hi) if v == up else (lo, a)


@functools.lru_cache(maxsize=4096)
def _symbols(e: Any) -> frozenset[str]:
    if isinstance(e, str):
        return frozenset((e,))
    if isinstance(e, tuple):
        return frozenset().union(*(_symbols(a) for a in e[1:]))
    return frozenset()


def _direction(e: Expr, ranges: Mapping[str, tuple[int, int]]) -> Optional[int]:
    """1 where `e` is non-decreasing in every symbol over `ranges`, -1 non-increasing, 0
    constant, None unknown."""
    if isinstance(e, int):
        return 0
    if isinstance(e, str):
        return 1
    op, *args = e
    ds = [_direction(a, ranges) for a in args]
    if None in ds:
        return None
    if op == "neg":
        return -ds[0]
    if op == "-":
        return _agree(ds[0], -ds[1])
    if op == "+":
        return _agree(*ds)
    lo = [_least(a, ranges) for a in args]
    if op == "*" and all(v is not None and v >= 0 for v in lo):
        return _agree(*ds)
    if op in ("//", "cdiv", ">>") and ds[1] == 0 and isinstance(args[1], int) and \
            (args[1] > 0 or op == ">>"):
        return ds[0]
    if op in ("//", "cdiv") and ds[0] == 0 and lo[1] is not None and lo[1] > 0:
        return ds[1] if int(args[0]) < 0 else -ds[1]
    if op == "<<" and ds[1] == 0 and lo[0] is not None and lo[0] >= 0:
        return ds[0]
    if op == "<<" and ds[0] == 0 and int(args[0]) >= 0:
        return ds[1]
    if op == "bit_length" and lo[0] is not None and lo[0] >= 0:
        return ds[0]
    return None


def _agree(*ds: int) -> Optional[int]:
    nonzero = {d for d in ds if d}
    return None if len(nonzero) > 1 else (nonzero.pop() if nonzero else 0)


def _least(e: Expr, ranges: Mapping[str, tuple[int, int]]) -> Optional[int]:
    """The least value of a monotone `e` over `ranges` (None where not monotone)."""
    d = _direction(e, ranges)
    if d is None:
        return None
    lo = {k: v[0] for k, v in ranges.items()}
    hi = {k: v[1] for k, v in ranges.items()}
    return evaluate(e, lo if d >= 0 else hi)


@dataclass(frozen=True)
class Leaf:
    """The rule's result on one path (`value`), or the error it raised there (`error`)."""
    value: Any = None
    error: Optional[str] = None


Tree = Union[Leaf, tuple]           # ("if", cond, then_tree, else_tree)


def trace(rule: Callable[[], Any], refusals: tuple[type, ...],
          ranges: Mapping[str, tuple[int, int]], most: int = MAX_PATHS) -> Tree:
    """The decision tree of `rule()` (a function of SymInt sizes): every path through its branches
    on conditions of sizes, each ending in its result or in one of the `refusals` it raised;
    `ranges`: each symbol's least and greatest value. Raises NotSymbolic where the rule leaves
    the symbolic world or has too many paths."""
    paths: list[tuple[list[tuple[Expr, bool]], Leaf]] = []
    todo: list[list[bool]] = [[]]
    memo: dict[Any, Any] = {}
    while todo:
        if len(paths) >= most:
            raise NotSymbolic(f"more than {most} cases")
        forced = todo.pop()
        path = _Path(forced, Bounds(ranges, memo))
        _PATH.current = path
        try:
            leaf = Leaf(value=rule())
        except refusals as e:
            leaf = Leaf(error=str(e))
        finally:
            _PATH.current = None
        paths.append((path.taken, leaf))
        for i in range(len(path.taken) - 1, len(forced) - 1, -1):
            todo.append([v for _, v in path.taken[:i]] + [not path.taken[i][1]])
    return _tree(paths, 0)


def _tree(paths: list[tuple[list[tuple[Expr, bool]], Leaf]], depth: int) -> Tree:
    taken, leaf = paths[0]
    if len(taken) == depth:
        return leaf
    cond = taken[depth][0]
    yes = [p for p in paths if p[0][depth][1]]
    no = [p for p in paths if not p[0][depth][1]]
    return ("if", cond, _tree(yes, depth + 1), _tree(no, depth + 1))


def maximum(a: Any, b: Any) -> Any:
    """max(a, b) as one formula (no branch) where either is a SymInt."""
    if isinstance(a, SymInt) or isinstance(b, SymInt):
        return SymInt(("max", _expr(a), _expr(b)))
    return max(a, b)


def project(t: Tree, f: Callable[[Any], Any]) -> Any:
    """The tree of one quantity, `f` of each result, as JSON: {"if", "then", "else"} nodes
    and {"value"} leaves. A path that refuses has no value (it matches any), and a node whose
    branches agree is its branch: so only the conditions that quantity depends on remain.
    None where every path refuses."""
    if isinstance(t, Leaf):
        return None if t.error is not None else {"value": f(t.value)}
    yes, no = project(t[2], f), project(t[3], f)
    if yes is None or yes == no:
        return no
    if no is None:
        return yes
    return {"if": to_json(t[1]), "then": yes, "else": no}


def refusals(t: Tree) -> Any:
    """The tree of the refusals: {"refuse": message} leaves where a call is refused, {}
    where not (nodes whose branches agree merged)."""
    if isinstance(t, Leaf):
        return {"refuse": t.error} if t.error is not None else {}
    yes, no = refusals(t[2]), refusals(t[3])
    return yes if yes == no else {"if": to_json(t[1]), "then": yes, "else": no}


def value(e: Any) -> Expr:
    """The expression of an int or a SymInt."""
    return _expr(e)


# --------------------------------------------------------------------------- evaluation

_BINARY: dict[str, Callable[[int, int], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "//": lambda a, b: a // b, "%": lambda a, b: a % b, "<<": lambda a, b: a << b,
    ">>": lambda a, b: a >> b, "&": lambda a, b: a & b, "|": lambda a, b: a | b,
    "min": min, "max": max, "cdiv": lambda a, b: -(-a // b),
    "<=": lambda a, b: a <= b, "==": lambda a, b: a == b,
}


def evaluate(e: Any, env: Mapping[str, int]) -> int:
    """The value of expression `e` (as JSON gives it: lists for tuples) with symbols `env`."""
    if isinstance(e, bool):
        return int(e)
    if isinstance(e, int):
        return e
    if isinstance(e, str):
        return int(env[e])
    op, *args = e
    vals = [evaluate(a, env) for a in args]
    if op == "neg":
        return -vals[0]
    if op == "not":
        return int(not vals[0])
    if op == "bit_length":
        return vals[0].bit_length()
    return int(_BINARY[op](*vals))


_INFIX = {"+": 1, "-": 1, "*": 2, "//": 2, "%": 2, "<<": 0, ">>": 0, "&": 0, "|": 0,
          "<=": -1, "==": -1}


def text(e: Any, outer: int = -2) -> str:
    """Expression `e` for a reader (Python's precedence and operators, ceil(a / b))."""
    if isinstance(e, (int, str)):
        return str(e)
    op, *args = e
    if op == "neg":
        return f"-{text(args[0], 3)}"
    if op == "not":
        inner = args[0]
        if isinstance(inner, (tuple, list)) and inner[0] in ("<=", "=="):
            a, b = (text(x, 0) for x in inner[1:])
            return f"{b} < {a}" if inner[0] == "<=" else f"{a} != {b}"
        return f"not {text(inner, 3)}"
    if op == "cdiv":
        return f"ceil({text(args[0], 2)} / {text(args[1], 3)})"
    if op in ("min", "max", "bit_length"):
        return f"{op}({', '.join(text(a) for a in args)})"
    prec = _INFIX[op]
    s = f"{text(args[0], prec)} {op} {text(args[1], prec + 1)}"
    return f"({s})" if prec < outer else s


def to_json(e: Expr) -> Any:
    """An expression as JSON (tuples as lists)."""
    return [e[0], *map(to_json, e[1:])] if isinstance(e, tuple) else e


def leaves(t: Tree) -> Iterator[Leaf]:
    if isinstance(t, Leaf):
        yield t
    else:
        yield from leaves(t[2])
        yield from leaves(t[3])
