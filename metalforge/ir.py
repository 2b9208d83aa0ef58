"""The lowered kernel: small plain dataclasses between a schedule and a code generator.

A schedule builds a `Kernel`: its parameters (each with its buffer index, MSL type and what the
runtime binds there), the thread-position inputs it reads, and a body of statements over
expressions. Types are MSL spellings ("float", "T", "vec<T, 4>", "uint"): the IR exists to be
printed as Metal. `dump(kernel)` renders a readable, language-neutral view for `kernel.ir()`;
`metalforge.codegen.msl` renders the Metal source.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

# --------------------------------------------------------------------------- expressions


class ExprOps:
    """Python operators on IR expressions build IR: `(j * tpg + t) * Lit(R, "uint")` is
    `Binary("*", Binary("+", Binary("*", j, tpg), t), Lit(R, "uint"))`. Operands must be IR
    expressions (a literal needs its MSL type: `Lit(4, "uint")`). `==` and `!=` stay the
    dataclasses' structural equality, so C's `==`, `!=`, `&&` and `||` are the methods `eq`,
    `ne`, `and_` and `or_`."""
    __slots__ = ()

    def __add__(self, other: Expr) -> Binary:
        return Binary("+", self, other)

    def __sub__(self, other: Expr) -> Binary:
        return Binary("-", self, other)

    def __mul__(self, other: Expr) -> Binary:
        return Binary("*", self, other)

    def __truediv__(self, other: Expr) -> Binary:
        """C division (integer division for integer types)."""
        return Binary("/", self, other)

    def __mod__(self, other: Expr) -> Binary:
        return Binary("%", self, other)

    def __lshift__(self, other: Expr) -> Binary:
        return Binary("<<", self, other)

    def __rshift__(self, other: Expr) -> Binary:
        return Binary(">>", self, other)

    def __and__(self, other: Expr) -> Binary:
        return Binary("&", self, other)

    def __or__(self, other: Expr) -> Binary:
        return Binary("|", self, other)

    def __xor__(self, other: Expr) -> Binary:
        return Binary("^", self, other)

    def __lt__(self, other: Expr) -> Binary:
        return Binary("<", self, other)

    def __le__(self, other: Expr) -> Binary:
        return Binary("<=", self, other)

    def __gt__(self, other: Expr) -> Binary:
        return Binary(">", self, other)

    def __ge__(self, other: Expr) -> Binary:
        return Binary(">=", self, other)

    def __neg__(self) -> Unary:
        return Unary("-", self)

    def eq(self, other: Expr) -> Binary:
        return Binary("==", self, other)

    def ne(self, other: Expr) -> Binary:
        return Binary("!=", self, other)

    def and_(self, other: Expr) -> Binary:
        return Binary("&&", self, other)

    def or_(self, other: Expr) -> Binary:
        return Binary("||", self, other)


@dataclass(frozen=True)
class Var(ExprOps):
    name: str


@dataclass(frozen=True)
class Lit(ExprOps):
    """A literal of an MSL type. value: bool | int | float (inf/nan allowed)."""
    value: Any
    type: str


@dataclass(frozen=True)
class Unary(ExprOps):
    op: str            # "-" "!" "~"
    x: "Expr"


@dataclass(frozen=True)
class Binary(ExprOps):
    op: str            # C operators: + - * / % < <= > >= == != & | ^ << >> && ||
    a: "Expr"
    b: "Expr"


@dataclass(frozen=True)
class Call(ExprOps):
    """A math/library function by its neutral name ("exp", "rsqrt", "max", "mf_erf", ...).
    precise: use the accurate (`precise::`) form where the target has one."""
    fn: str
    args: tuple["Expr", ...]
    precise: bool = False


@dataclass(frozen=True)
class Cast(ExprOps):
    type: str
    x: "Expr"


@dataclass(frozen=True)
class Select(ExprOps):
    cond: "Expr"
    a: "Expr"
    b: "Expr"


@dataclass(frozen=True)
class Load(ExprOps):
    """buffer[index]; width > 1 reads `width` consecutive elements as one vector."""
    buffer: str
    index: "Expr"
    width: int = 1
    elem_type: str = ""        # storage type of one element (for the vector type)


@dataclass(frozen=True)
class Lane(ExprOps):
    """Element `lane` of a vector value (or of an `ArrayDecl` array)."""
    vec: "Expr"
    lane: "Expr"


Expr = Union[Var, Lit, Unary, Binary, Call, Cast, Select, Load, Lane]

# --------------------------------------------------------------------------- statements


@dataclass
class Comment:
    text: str


@dataclass
class Decl:
    """`type name = value;` (value None: declared, uninitialised). const: never reassigned."""
    name: str
    type: str
    value: Optional[Expr] = None
    const: bool = True


@dataclass
class Assign:
    target: Expr               # Var or Lane
    value: Expr


@dataclass
class Store:
    """buffer[index] = value; width > 1 writes a vector of `width` consecutive elements."""
    buffer: str
    index: Expr
    value: Expr
    width: int = 1
    elem_type: str = ""


@dataclass
class If:
    cond: Expr
    then: list["Stmt"]
    orelse: list["Stmt"] = field(default_factory=list)


@dataclass
class For:
    """for (type var = start; var < stop; ++var) body. unroll: a compile-time trip count."""
    var: str
    type: str
    start: Expr
    stop: Expr
    body: list["Stmt"]
    unroll: bool = False


@dataclass
class Break:
    pass


@dataclass
class ArrayDecl:
    """`[threadgroup] type name[length];` — a per-thread register array (space "thread") or a
    threadgroup-shared scratch array (space "threadgroup", declared at kernel scope).
    Elements are read and written with `Lane(Var(name), i)`."""
    name: str
    type: str
    length: int
    space: str = "thread"


@dataclass
class Barrier:
    """Every thread of the threadgroup waits here; threadgroup memory writes become visible."""
    pass


@dataclass
class Return:
    """Leave the kernel (only where no later barrier needs this thread)."""
    pass


Stmt = Union[Comment, Decl, Assign, Store, If, For, Break, ArrayDecl, Barrier, Return]

# --------------------------------------------------------------------------- kernel


@dataclass(frozen=True)
class Param:
    """One kernel argument, bound positionally at buffer `index`.

    kind: "buffer" (a tensor: `device T*`) or "scalar" (`constant T&`).
    binds: what the runtime passes: ("input", name) | ("output", k) | ("scalar", name)
           | ("size", axis) | ("numel",).
    cast: the compile_shader `arg_casts` string that makes the bound width equal `type`
          (None: the default width — 4-byte float, 8-byte int — already matches).
    """
    name: str
    index: int
    kind: str
    type: str                  # element type (buffers) or scalar type
    binds: tuple
    writable: bool = False
    cast: Optional[str] = None


@dataclass(frozen=True)
class ThreadInput:
    name: str                  # "mf_tid"
    type: str                  # "uint"
    attribute: str             # "thread_position_in_grid"


@dataclass(frozen=True)
class Instance:
    """One `template [[host_name(...)]]` instantiation: the name the runtime calls and the
    MSL types bound to the template parameters, in order."""
    host_name: str
    types: tuple[str, ...]


@dataclass
class Kernel:
    name: str                           # template function name: "mf_silu"
    op: str                             # the user's op name
    template: tuple[str, ...]           # template type parameters: ("T", "mf_index_t")
    instances: tuple["Instance", ...]   # one kernel per binding of the template parameters
    params: tuple[Param, ...]
    threads: tuple[ThreadInput, ...]
    body: list[Stmt]
    helpers: tuple[str, ...] = ()       # helper functions the body calls ("mf_erf", ...)
    summary: str = ""                   # one line: what the kernel does and how it is laid out

    @property
    def host_name(self) -> str:
        return self.instances[0].host_name

    def param_for(self, binds: tuple) -> Param:
        for p in self.params:
            if p.binds == binds:
                return p
        raise KeyError(binds)


# --------------------------------------------------------------------------- dump

_PREC = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, "<=": 7, ">": 7,
         ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10}


def expr_text(e: Expr, lit=None, call=None, cast=None, load=None, prec: int = 0) -> str:
    """Render an expression with minimal parentheses. The hooks let a code generator change
    how literals, calls, casts and loads are spelt; the defaults give the neutral IR view."""
    def r(x: Expr, p: int = 0) -> str:
        return expr_text(x, lit, call, cast, load, p)

    if isinstance(e, Var):
        return e.name
    if isinstance(e, Lit):
        return lit(e) if lit else repr(e.value)
    if isinstance(e, Unary):
        return f"{e.op}{r(e.x, 11)}"
    if isinstance(e, Binary):
        p = _PREC[e.op]
        s = f"{r(e.a, p)} {e.op} {r(e.b, p + 1)}"
        return f"({s})" if p < prec else s
    if isinstance(e, Call):
        return call(e, r) if call else f"{e.fn}({', '.join(r(a) for a in e.args)})"
    if isinstance(e, Cast):
        return cast(e, r) if cast else f"{e.type}({r(e.x)})"
    if isinstance(e, Select):
        s = f"{r(e.cond, 1)} ? {r(e.a, 1)} : {r(e.b, 1)}"
        return f"({s})" if prec > 0 else s
    if isinstance(e, Load):
        if load:
            return load(e, r)
        return f"{e.buffer}[{r(e.index)}]" if e.width == 1 else \
            f"{e.buffer}[{r(e.index)} : +{e.width}]"
    if isinstance(e, Lane):
        return f"{r(e.vec, 12)}[{r(e.lane)}]"
    raise TypeError(f"not an IR expression: {e!r}")


def _dump_body(body: list[Stmt], ind: str, out: list[str]) -> None:
    for s in body:
        if isinstance(s, Comment):
            out.append(f"{ind}# {s.text}")
        elif isinstance(s, Decl):
            kw = "let" if s.const else "var"
            val = "" if s.value is None else f" = {expr_text(s.value)}"
            out.append(f"{ind}{kw} {s.name}: {s.type}{val}")
        elif isinstance(s, Assign):
            out.append(f"{ind}{expr_text(s.target)} = {expr_text(s.value)}")
        elif isinstance(s, Store):
            tgt = f"{s.buffer}[{expr_text(s.index)}]" if s.width == 1 else \
                f"{s.buffer}[{expr_text(s.index)} : +{s.width}]"
            out.append(f"{ind}store {tgt} = {expr_text(s.value)}")
        elif isinstance(s, If):
            out.append(f"{ind}if {expr_text(s.cond)}:")
            _dump_body(s.then, ind + "    ", out)
            if s.orelse:
                out.append(f"{ind}else:")
                _dump_body(s.orelse, ind + "    ", out)
        elif isinstance(s, For):
            un = "  (unrolled)" if s.unroll else ""
            out.append(f"{ind}for {s.var}: {s.type} in [{expr_text(s.start)}, "
                       f"{expr_text(s.stop)}):{un}")
            _dump_body(s.body, ind + "    ", out)
        elif isinstance(s, Break):
            out.append(f"{ind}break")
        elif isinstance(s, ArrayDecl):
            sp = "threadgroup " if s.space == "threadgroup" else ""
            out.append(f"{ind}{sp}array {s.name}: {s.type}[{s.length}]")
        elif isinstance(s, Barrier):
            out.append(f"{ind}barrier (threadgroup)")
        elif isinstance(s, Return):
            out.append(f"{ind}return")
        else:
            raise TypeError(f"not an IR statement: {s!r}")


def dump(k: Kernel) -> str:
    """A readable text view of the lowered kernel."""
    out = [f"kernel {k.name}<{', '.join(k.template)}>"]
    for inst in k.instances:
        out.append(f"  instance {inst.host_name}: " +
                   ", ".join(f"{n}={t}" for n, t in zip(k.template, inst.types)))
    if k.summary:
        out.append(f"  # {k.summary}")
    out.append("  params:")
    for p in k.params:
        what = {"input": "input", "output": "output", "scalar": "scalar", "size": "size of",
                "numel": "element count"}[p.binds[0]]
        src = " ".join(str(b) for b in p.binds[1:])
        acc = ("buffer rw" if p.writable else "buffer ro") if p.kind == "buffer" else "scalar"
        cast = f", arg_cast {p.cast}" if p.cast else ""
        out.append(f"    [{p.index}] {p.name}: {p.type} ({acc}; {what} {src}".rstrip() +
                   f"{cast})")
    for t in k.threads:
        out.append(f"    {t.name}: {t.type} [{t.attribute}]")
    if k.helpers:
        out.append(f"  helpers: {', '.join(k.helpers)}")
    out.append("  body:")
    _dump_body(k.body, "    ", out)
    return "\n".join(out) + "\n"
