"""IR → Metal Shading Language text.

`MSLPrinter` spells the IR as Metal (one statement per line, four-space indents, `precise::`
math, explicit casts; loops that run once as plain blocks, see `ir.inline_single_trip`).
`render(kernel)` is one kernel's source, `render_library(kernels)` several kernels compiled as
one library (a reduction's row-length variants): the header, each helper the kernels call once
(their text is `helpers.metal`, shipped with the package), then each kernel as a template with
one `template [[host_name("...")]]` instantiation per binding of its template parameters.
"""
from __future__ import annotations

import math
import re
from importlib import resources
from typing import Iterable

from .. import ir

HEADER = ["#include <metal_stdlib>", "using namespace metal;", ""]
_HELPER_MARK = "// helper: "


def _load_helpers() -> dict[str, str]:
    """{name: text} of the helper functions in helpers.metal (each from its `// helper: NAME`
    line to the next, trailing blank lines dropped)."""
    text = resources.files(__package__).joinpath("helpers.metal").read_text()
    helpers: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(_HELPER_MARK):
            current = helpers[line[len(_HELPER_MARK):].strip()] = []
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).rstrip("\n") for name, lines in helpers.items()}


HELPERS: dict[str, str] = _load_helpers()     # emitted only where a kernel calls them
_SIMPLE_TYPE = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*$")


def literal(e: ir.Lit) -> str:
    v, t = e.value, e.type
    if t == "bool":
        return "true" if v else "false"
    if t in ("float", "half", "bfloat"):
        v = float(v)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "-INFINITY"
        s = repr(v)
        if "e" not in s and "." not in s:
            s += ".0"
        return s + "f"
    v = int(v)
    if t in ("uint", "ulong", "mf_index_t") and v >= 0:
        return f"{v}u" if t == "uint" or v < 2 ** 31 else f"{v}ul"
    if -2 ** 31 <= v < 2 ** 31:
        return str(v)
    return f"{v}l"


class MSLPrinter(ir.Printer):
    def lit(self, e: ir.Lit) -> str:
        return literal(e)

    def call(self, e: ir.Call) -> str:
        fn = f"precise::{e.fn}" if e.precise else e.fn
        return f"{fn}({', '.join(self.expr(a) for a in e.args)})"

    def cast(self, e: ir.Cast) -> str:
        inner = self.expr(e.x)
        return f"{e.type}({inner})" if _SIMPLE_TYPE.match(e.type) else \
            f"static_cast<{e.type}>({inner})"

    def load(self, e: ir.Load) -> str:
        if e.width == 1:
            return f"{e.buffer}[{self.expr(e.index)}]"
        return (f"*reinterpret_cast<{e.space} const {ir.vector_type(e.elem_type, e.width)}*>"
                f"({e.buffer} + {self.expr(e.index, 9)})")

    def line(self, s: ir.Stmt) -> str:
        if isinstance(s, ir.Comment):
            return f"// {s.text}"
        if isinstance(s, ir.Decl):
            const = "const " if s.const else ""
            val = "" if s.value is None else f" = {self.expr(s.value)}"
            return f"{const}{s.type} {s.name}{val};"
        if isinstance(s, ir.Assign):
            return f"{self.expr(s.target)} = {self.expr(s.value)};"
        if isinstance(s, ir.Store):
            if s.width == 1:
                return f"{s.buffer}[{self.expr(s.index)}] = {self.expr(s.value)};"
            return (f"*reinterpret_cast<{s.space} {ir.vector_type(s.elem_type, s.width)}*>"
                    f"({s.buffer} + {self.expr(s.index, 9)}) = {self.expr(s.value)};")
        if isinstance(s, ir.Break):
            return "break;"
        if isinstance(s, ir.ArrayDecl):
            sp = "threadgroup " if s.space == "threadgroup" else ""
            return f"{sp}{s.type} {s.name}[{s.length}];"
        if isinstance(s, ir.Barrier):
            return f"{s.scope}_barrier(mem_flags::mem_threadgroup);"
        if isinstance(s, ir.Return):
            return "return;"
        if isinstance(s, ir.Eval):
            return f"{self.expr(s.call)};"
        raise TypeError(f"not an IR statement: {s!r}")

    def if_head(self, s: ir.If) -> str:
        return f"if ({self.expr(s.cond)}) {{"

    def elif_head(self, s: ir.If) -> str:
        return f"}} else if ({self.expr(s.cond)}) {{"

    def else_line(self) -> str:
        return "} else {"

    def for_head(self, s: ir.For) -> str:
        step = f"++{s.var}" if s.step is None else f"{s.var} += {self.expr(s.step)}"
        pragma = '_Pragma("unroll") ' if s.pragma_unroll else ""
        return (f"{pragma}for ({s.type} {s.var} = {self.expr(s.start)}; {s.var} < "
                f"{self.expr(s.stop)}; {step}) {{")

    def block_head(self) -> str:
        return "{"

    def close(self, ind: str, out: list[str]) -> None:
        out.append(f"{ind}}}")

    # -- a kernel ------------------------------------------------------------------------
    def signature(self, k: ir.LoweredKernel, types: dict[str, str] | None = None) -> list[str]:
        def t(name: str) -> str:
            return types.get(name, name) if types else name

        lines = []
        for p in k.params:
            if p.kind == "buffer":
                q = "device " if p.writable else "device const "
                lines.append(f"    {q}{t(p.type)}* {p.name} [[buffer({p.index})]]")
            else:
                lines.append(f"    constant {t(p.type)}& {p.name} [[buffer({p.index})]]")
        for th in k.threads:
            lines.append(f"    {th.type} {th.name} [[{th.attribute}]]")
        return [ln + ("," if i < len(lines) - 1 else "") for i, ln in enumerate(lines)]

    def kernel(self, k: ir.LoweredKernel) -> list[str]:
        """The kernel template, its body and its instantiations."""
        out = []
        if k.template:
            out.append(f"template <{', '.join(f'typename {p}' for p in k.template)}>")
        bound = f"[[max_total_threads_per_threadgroup({k.max_threads})]] " if k.max_threads else ""
        out.append(f"{bound}kernel void {k.name}(")
        out += self.signature(k)
        out[-1] += ")"
        out.append("{")
        self.body(ir.inline_single_trip(k.body), self.indent, out)
        out += ["}", ""]
        if k.template:
            out.append("// one kernel per dtype set and index width")
            for inst in k.instances:
                types = dict(zip(k.template, inst.types))
                out.append(f"template [[host_name(\"{inst.host_name}\")]] kernel void "
                           f"{k.name}<{', '.join(inst.types)}>(")
                out += self.signature(k, types)
                out[-1] += ");"
        return out


def expr(e: ir.Expr) -> str:
    return MSLPrinter().expr(e)


def _summary(k: ir.LoweredKernel) -> list[str]:
    return [f"// {k.summary}", "// generated by metalforge", ""] if k.summary else []


# a helper that is a header (Metal 4's tensor ops): included before `using namespace metal;`,
# as Apple's and MLX's sources include it (its names then resolve inside it as it expects)
_HEADER_HELPERS = ("mf_tensor_ops",)


def _header(names: Iterable[str]) -> list[str]:
    """The source's first lines: <metal_stdlib>, the header helpers among `names`, then
    `using namespace metal;`."""
    first = [line for h in _HEADER_HELPERS if h in names for line in HELPERS[h].splitlines()]
    return HEADER if not first else [HEADER[0], *first, *HEADER[1:]]


def _helpers(names: Iterable[str]) -> list[str]:
    out: list[str] = []
    for h in names:
        if h not in _HEADER_HELPERS:
            out += [HELPERS[h], ""]
    return out


def render(k: ir.LoweredKernel) -> str:
    """The complete MSL source of one kernel: header, what it does, its helpers, the kernel."""
    return "\n".join(_header(k.helpers) + _summary(k) + _helpers(k.helpers)
                     + MSLPrinter().kernel(k)) + "\n"


def render_library(kernels: Iterable[ir.LoweredKernel]) -> str:
    """Several kernels as one library: one header, each helper once, then each kernel with
    what it does."""
    kernels = list(kernels)
    helpers = dict.fromkeys(h for k in kernels for h in k.helpers)
    parts = ["\n".join(_header(helpers) + _helpers(helpers))]
    parts += ["\n".join(_summary(k) + MSLPrinter().kernel(k)) + "\n" for k in kernels]
    return "\n".join(parts).rstrip("\n") + "\n"
