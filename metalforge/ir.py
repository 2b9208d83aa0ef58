"""The lowered kernel: small plain dataclasses between a schedule and a code generator.

A schedule builds a `LoweredKernel` (named apart from the user's `mf.Kernel`): its `Argument`s
(each with its buffer index, MSL type and what the runtime binds there), the thread-position
inputs it reads, and a body of statements over expressions. Types are MSL spellings ("float",
"T", "vec<T, 4>", "uint"): the IR exists to be printed as Metal. `dump(kernel)` renders a
readable, language-neutral view for `kernel.ir()`; `metalforge.codegen.msl` renders the Metal
source; both are `Printer`s.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union, cast

# --------------------------------------------------------------------------- expressions


class ExprOps:
    """Python operators on IR expressions build IR: `(j * tpg + t) * Lit(R, "uint")` is
    `Binary("*", Binary("+", Binary("*", j, tpg), t), Lit(R, "uint"))`. Operands must be IR
    expressions (a literal needs its MSL type: `Lit(4, "uint")`). `==` and `!=` stay the
    dataclasses' structural equality, so C's `==`, `!=`, `&&` and `||` are the methods `eq`,
    `ne`, `and_` and `or_`."""
    __slots__ = ()

    def _e(self) -> Expr:
        return cast(Expr, self)          # every subclass is one of the Expr types

    def __add__(self, other: Expr) -> Binary:
        return Binary("+", self._e(), other)

    def __sub__(self, other: Expr) -> Binary:
        return Binary("-", self._e(), other)

    def __mul__(self, other: Expr) -> Binary:
        return Binary("*", self._e(), other)

    def __truediv__(self, other: Expr) -> Binary:
        """C division (integer division for integer types)."""
        return Binary("/", self._e(), other)

    def __mod__(self, other: Expr) -> Binary:
        return Binary("%", self._e(), other)

    def __lshift__(self, other: Expr) -> Binary:
        return Binary("<<", self._e(), other)

    def __rshift__(self, other: Expr) -> Binary:
        return Binary(">>", self._e(), other)

    def __and__(self, other: Expr) -> Binary:
        return Binary("&", self._e(), other)

    def __or__(self, other: Expr) -> Binary:
        return Binary("|", self._e(), other)

    def __xor__(self, other: Expr) -> Binary:
        return Binary("^", self._e(), other)

    def __lt__(self, other: Expr) -> Binary:
        return Binary("<", self._e(), other)

    def __le__(self, other: Expr) -> Binary:
        return Binary("<=", self._e(), other)

    def __gt__(self, other: Expr) -> Binary:
        return Binary(">", self._e(), other)

    def __ge__(self, other: Expr) -> Binary:
        return Binary(">=", self._e(), other)

    def __neg__(self) -> Unary:
        return Unary("-", self._e())

    def eq(self, other: Expr) -> Binary:
        return Binary("==", self._e(), other)

    def ne(self, other: Expr) -> Binary:
        return Binary("!=", self._e(), other)

    def and_(self, other: Expr) -> Binary:
        return Binary("&&", self._e(), other)

    def or_(self, other: Expr) -> Binary:
        return Binary("||", self._e(), other)


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
    """buffer[index]; width > 1 reads `width` consecutive elements as one vector (from
    `space`: device memory, or a threadgroup array through a `threadgroup T*`)."""
    buffer: str
    index: "Expr"
    width: int = 1
    elem_type: str = ""        # storage type of one element (for the vector type)
    space: str = "device"


def vector_type(elem_type: str, width: int) -> str:
    """The type of `width` consecutive elements moved as one access: a Metal vector up to 4
    components; 8 (16 bytes of a 2-byte type) as the helper struct `mf_pack8` (read its
    elements with the helper `mf_lane8`, build one with `mf_pack8_of`)."""
    return f"mf_pack8<{elem_type}>" if width == 8 else f"vec<{elem_type}, {width}>"


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
    """buffer[index] = value; width > 1 writes a vector of `width` consecutive elements (to
    `space`: device or threadgroup memory)."""
    buffer: str
    index: Expr
    value: Expr
    width: int = 1
    elem_type: str = ""
    space: str = "device"


@dataclass
class If:
    cond: Expr
    then: list["Stmt"]
    orelse: list["Stmt"] = field(default_factory=list)


@dataclass
class For:
    """for (type var = start; var < stop; var += step) body (step None: ++var). unroll: a
    compile-time trip count. pragma_unroll: the compiler is asked to unroll it (MSL
    `_Pragma("unroll")`: a trip count known only to the compiler, such as a cooperative
    tensor's capacity, over an array that must stay in registers)."""
    var: str
    type: str
    start: Expr
    stop: Expr
    body: list["Stmt"]
    unroll: bool = False
    step: Optional[Expr] = None
    pragma_unroll: bool = False


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
    """Every thread of the threadgroup (scope "simdgroup": of the simdgroup) waits here;
    threadgroup memory writes become visible to them."""
    scope: str = "threadgroup"


@dataclass
class Return:
    """Leave the kernel (only where no later barrier needs this thread)."""
    pass


@dataclass
class Block:
    """A nested scope (what `inline_single_trip` makes of a loop that runs once)."""
    body: list["Stmt"]


@dataclass
class Eval:
    """`call;`: a function called for its effect (a scatter's atomic add)."""
    call: Call


Stmt = Union[Comment, Decl, Assign, Store, If, For, Break, ArrayDecl, Barrier, Return, Block,
             Eval]

# --------------------------------------------------------------------------- kernel


# What the runtime can pass for a kernel argument (`Argument.binds[0]`), as `dump` names it;
# `runtime.binding` turns each into a typed source.
BIND_KINDS: dict[str, str] = {
    "input": "input", "output": "output", "scalar": "scalar", "size": "size of",
    "numel": "element count", "error": "index-error report", "scratch": "partial results",
    "launch": "launch value", "sorted": "the index sorted on the device:",
    "counter": "ticket counters"}


@dataclass(frozen=True)
class Argument:
    """One kernel argument, bound positionally at buffer `index`.

    kind: "buffer" (a tensor: `device T*`) or "scalar" (`constant T&`).
    binds: what the runtime passes: ("input", name) | ("output", k) | ("scalar", name)
           | ("size", axis) | ("numel",) | ("error",) (a gather's 4-int report, zeroed)
           | ("scratch",) (fp32 partial results passed between a call's launches)
           | ("launch", name) (a per-call launch parameter, `Schedule.launch_value`)
           | ("counter",) (uint words zero between launches: runtime/counters.py).
    cast: the compile_shader `arg_casts` string that makes the bound width equal `type`
          (None: the default width — 4-byte float, 8-byte int — already matches).
    """
    name: str
    index: int
    kind: str
    type: str                  # element type (buffers) or scalar type
    binds: tuple[str | int, ...]
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


@dataclass(frozen=True)
class LoweredKernel:
    name: str                           # template function name: "mf_silu"
    op: str                             # the user's op name
    template: tuple[str, ...]           # template type parameters: ("T", "mf_index_t")
    instances: tuple["Instance", ...]   # one kernel per binding of the template parameters
    params: tuple[Argument, ...]
    threads: tuple[ThreadInput, ...]
    body: tuple[Stmt, ...]
    helpers: tuple[str, ...] = ()       # helper functions the body calls ("mf_erf", ...)
    summary: str = ""                   # one line: what the kernel does and how it is laid out
    # the threadgroup size it is always launched with, declared to the compiler as
    # [[max_total_threads_per_threadgroup(N)]] (0: not declared); see cuda/translate.py
    max_threads: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "body", tuple(self.body))    # a list given: frozen as well

    @property
    def host_name(self) -> str:
        return self.instances[0].host_name

    def param_for(self, binds: tuple[str | int, ...]) -> Argument:
        for p in self.params:
            if p.binds == binds:
                return p
        raise KeyError(binds)


# --------------------------------------------------------------------------- passes

def mentions(stmts: Sequence[Stmt], name: str) -> bool:
    """Whether any of these statements reads the variable `name`."""
    def walk(x: object) -> bool:
        if isinstance(x, Var):
            return x.name == name
        if isinstance(x, (list, tuple)):
            return any(walk(y) for y in x)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return any(walk(getattr(x, f.name)) for f in dataclasses.fields(x))
        return False
    return walk(stmts)


def _breaks(body: Sequence[Stmt]) -> bool:
    """Whether a `break` in these statements would leave the loop around them."""
    for s in body:
        if isinstance(s, Break):
            return True
        if isinstance(s, If) and (_breaks(s.then) or _breaks(s.orelse)):
            return True
        if isinstance(s, Block) and _breaks(s.body):
            return True
    return False


def _single_trip(s: For) -> bool:
    """A loop that runs exactly once (literal bounds one apart) and does not break."""
    return (isinstance(s.start, Lit) and isinstance(s.stop, Lit)
            and type(s.start.value) is int and type(s.stop.value) is int
            and s.stop.value - s.start.value == 1 and s.step is None and not _breaks(s.body))


def inline_single_trip(body: Sequence[Stmt]) -> list[Stmt]:
    """Every loop that runs exactly once becomes a `Block` of its body, the loop variable
    declared as a constant where the body reads it (straight-line code for the compiler and
    the reader)."""
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, If):
            s = If(s.cond, inline_single_trip(s.then), inline_single_trip(s.orelse))
        elif isinstance(s, Block):
            s = Block(inline_single_trip(s.body))
        elif isinstance(s, For):
            inner = inline_single_trip(s.body)
            if _single_trip(s):
                first: list[Stmt] = ([Decl(s.var, s.type, s.start)] if mentions(inner, s.var)
                                     else [])
                s = Block(first + inner)
            else:
                s = dataclasses.replace(s, body=inner)
        out.append(s)
    return out


# --------------------------------------------------------------------------- printing

_PREC = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, "<=": 7, ">": 7,
         ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10}


class Printer:
    """The walk every text view of the IR shares: expressions with C precedence and minimal
    parentheses; statements one per line, nested bodies one indent deeper. Subclasses spell
    the pieces: `IRPrinter` (the readable dump) and `metalforge.codegen.msl.MSLPrinter`."""
    indent = "    "

    # -- expressions ---------------------------------------------------------------------
    def expr(self, e: Expr, prec: int = 0) -> str:
        if isinstance(e, Var):
            return e.name
        if isinstance(e, Lit):
            return self.lit(e)
        if isinstance(e, Unary):
            return f"{e.op}{self.expr(e.x, 11)}"
        if isinstance(e, Binary):
            p = _PREC[e.op]
            s = f"{self.operand(e.a, e.op, p)} {e.op} {self.operand(e.b, e.op, p + 1)}"
            return f"({s})" if p < prec else s
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Cast):
            return self.cast(e)
        if isinstance(e, Select):
            s = f"{self.expr(e.cond, 1)} ? {self.expr(e.a, 1)} : {self.expr(e.b, 1)}"
            return f"({s})" if prec > 0 else s
        if isinstance(e, Load):              # a vector load is a dereference: (*p)[i]
            return f"({self.load(e)})" if e.width > 1 and prec > 11 else self.load(e)
        if isinstance(e, Lane):
            return f"{self.expr(e.vec, 12)}[{self.expr(e.lane)}]"
        raise TypeError(f"not an IR expression: {e!r}")

    def operand(self, e: Expr, op: str, prec: int) -> str:
        """An operand of a binary `op`: a bitwise operator's binary operands of another
        operator keep their parentheses (`(w >> 4u) & 15u`, not `w >> 4u & 15u`)."""
        if op in ("&", "|", "^") and isinstance(e, Binary) and e.op != op:
            prec = 12
        return self.expr(e, prec)

    def lit(self, e: Lit) -> str:
        return repr(e.value)

    def call(self, e: Call) -> str:
        return f"{e.fn}({', '.join(self.expr(a) for a in e.args)})"

    def cast(self, e: Cast) -> str:
        return f"{e.type}({self.expr(e.x)})"

    def load(self, e: Load) -> str:
        if e.width == 1:
            return f"{e.buffer}[{self.expr(e.index)}]"
        return f"{e.buffer}[{self.expr(e.index)} : +{e.width}]"

    # -- statements ----------------------------------------------------------------------
    def body(self, stmts: Sequence[Stmt], ind: str, out: list[str]) -> None:
        for s in stmts:
            if isinstance(s, If):
                out.append(ind + self.if_head(s))
                self.body(s.then, ind + self.indent, out)
                while len(s.orelse) == 1 and isinstance(s.orelse[0], If):    # else if
                    s = s.orelse[0]
                    out.append(ind + self.elif_head(s))
                    self.body(s.then, ind + self.indent, out)
                if s.orelse:
                    out.append(ind + self.else_line())
                    self.body(s.orelse, ind + self.indent, out)
                self.close(ind, out)
            elif isinstance(s, For):
                out.append(ind + self.for_head(s))
                self.body(s.body, ind + self.indent, out)
                self.close(ind, out)
            elif isinstance(s, Block):
                out.append(ind + self.block_head())
                self.body(s.body, ind + self.indent, out)
                self.close(ind, out)
            else:
                out.append(ind + self.line(s))

    def line(self, s: Stmt) -> str:
        """One statement without a body."""
        raise NotImplementedError

    def if_head(self, s: If) -> str:
        raise NotImplementedError

    def elif_head(self, s: If) -> str:
        raise NotImplementedError

    def else_line(self) -> str:
        raise NotImplementedError

    def for_head(self, s: For) -> str:
        raise NotImplementedError

    def block_head(self) -> str:
        raise NotImplementedError

    def close(self, ind: str, out: list[str]) -> None:
        """After a body (C's closing brace; nothing where indentation says it)."""


class IRPrinter(Printer):
    """The readable, language-neutral view of `kernel.ir()`."""

    def line(self, s: Stmt) -> str:
        if isinstance(s, Comment):
            return f"# {s.text}"
        if isinstance(s, Decl):
            val = "" if s.value is None else f" = {self.expr(s.value)}"
            return f"{'let' if s.const else 'var'} {s.name}: {s.type}{val}"
        if isinstance(s, Assign):
            return f"{self.expr(s.target)} = {self.expr(s.value)}"
        if isinstance(s, Store):
            return f"store {self.load(Load(s.buffer, s.index, s.width))} = {self.expr(s.value)}"
        if isinstance(s, Break):
            return "break"
        if isinstance(s, ArrayDecl):
            sp = "threadgroup " if s.space == "threadgroup" else ""
            return f"{sp}array {s.name}: {s.type}[{s.length}]"
        if isinstance(s, Barrier):
            return f"barrier ({s.scope})"
        if isinstance(s, Return):
            return "return"
        if isinstance(s, Eval):
            return self.expr(s.call)
        raise TypeError(f"not an IR statement: {s!r}")

    def if_head(self, s: If) -> str:
        return f"if {self.expr(s.cond)}:"

    def elif_head(self, s: If) -> str:
        return f"elif {self.expr(s.cond)}:"

    def else_line(self) -> str:
        return "else:"

    def for_head(self, s: For) -> str:
        un = "  (unrolled)" if s.unroll else "  (unroll hint)" if s.pragma_unroll else ""
        step = f" step {self.expr(s.step)}" if s.step is not None else ""
        return f"for {s.var}: {s.type} in [{self.expr(s.start)}, {self.expr(s.stop)}){step}:{un}"

    def block_head(self) -> str:
        return "block:"

    def kernel(self, k: LoweredKernel) -> str:
        out = [f"kernel {k.name}<{', '.join(k.template)}>"]
        for inst in k.instances:
            out.append(f"  instance {inst.host_name}: " +
                       ", ".join(f"{n}={t}" for n, t in zip(k.template, inst.types)))
        if k.summary:
            out.append(f"  # {k.summary}")
        out.append("  params:")
        for p in k.params:
            out.append(f"    {self.param(p)}")
        for t in k.threads:
            out.append(f"    {t.name}: {t.type} [{t.attribute}]")
        if k.helpers:
            out.append(f"  helpers: {', '.join(k.helpers)}")
        out.append("  body:")
        self.body(k.body, "    ", out)
        return "\n".join(out) + "\n"

    @staticmethod
    def param(p: Argument) -> str:
        what = BIND_KINDS[str(p.binds[0])]
        src = " ".join(str(b) for b in p.binds[1:])
        acc = ("buffer rw" if p.writable else "buffer ro") if p.kind == "buffer" else "scalar"
        arg_cast = f", arg_cast {p.cast}" if p.cast else ""
        return f"[{p.index}] {p.name}: {p.type} ({acc}; {what} {src}".rstrip() + f"{arg_cast})"


def expr_text(e: Expr) -> str:
    """An expression as the IR dump spells it."""
    return IRPrinter().expr(e)


def dump(k: LoweredKernel) -> str:
    """A readable text view of the lowered kernel."""
    return IRPrinter().kernel(k)
