"""The kernel-signature model: what a host-visible MSL kernel looks like from the host.

`Signature` (one kernel: host name, C++ function, template arguments, parameters, limits) and
`SignatureParam` (one parameter: its buffer index or thread-position attribute, its type and
address space), plus the other facts the parser records for the backends (`TgDecl`,
`FunctionConstant`, `ParsedSource`).  `parse_params` reads a parameter list into
`SignatureParam`s, rejecting what torch.mps.compile_shader cannot bind; `assign_buffer_indices`
gives implicit ``[[buffer(n)]]`` indices.  The simulator and the cuda backend both bind calls by
these records.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .tokens import ParseError, Token, attr_list, split_commas

# Thread-position attributes a kernel parameter may carry (MSL spec, "Kernel function input
# attributes").  thread_execution_width is the older spelling of threads_per_simdgroup.
POSITION_ATTRS = frozenset({
    "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
    "threads_per_threadgroup", "threadgroups_per_grid", "threads_per_grid",
    "dispatch_threads_per_threadgroup", "grid_origin", "grid_size", "thread_index_in_threadgroup",
    "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup", "threads_per_simdgroup",
    "simdgroups_per_threadgroup", "dispatch_simdgroups_per_threadgroup", "thread_execution_width",
    "thread_index_in_quadgroup", "quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup",
    "dispatch_quadgroups_per_threadgroup",
})

# C++ attributes that stay in the text; every other [[...]] is Metal's and is blanked.
STANDARD_ATTRS = frozenset({"maybe_unused", "likely", "unlikely", "fallthrough", "nodiscard",
                            "noreturn", "deprecated", "carries_dependency", "no_unique_address"})

ADDRESS_SPACES = ("device", "constant", "threadgroup", "thread", "threadgroup_imageblock",
                  "ray_data", "object_data")


@dataclass
class SignatureParam:
    index: int                 # position in the parameter list
    text: str                  # the declaration, attributes removed
    name: str
    type_text: str             # declared type (may mention template parameters)
    role: str                  # 'buffer' or 'position'
    attr: str = ""             # position attribute name, e.g. 'thread_position_in_grid'
    buffer_index: int = -1
    address_space: str = ""    # device / constant / thread / '' (by value)
    is_pointer: bool = False
    is_reference: bool = False
    is_const: bool = False
    elem_type: str = ""        # pointee / referee / value type, qualifiers removed
    # [[function_constant(name)]]: the parameter exists only when that bool constant is true
    function_constant: str = ""
    function_constant_index: int = -1


@dataclass
class Signature:
    """One host-visible kernel: its name, C++ function, template arguments and parameters."""
    host_name: str
    func_name: str             # qualified C++ name of the function (template name for templates)
    template_args: str | None  # "float, 4" for explicit instantiations, None otherwise
    fn_params: str | None      # concrete parameter list for the deduced instantiation form
    params: list[SignatureParam]
    line: int                  # line of the definition in the user's source
    max_total_threads: int     # [[max_total_threads_per_threadgroup(N)]] or 1024
    threadgroup_bytes: int | None  # static threadgroup memory, None when not computable


@dataclass
class TgDecl:
    start: int                 # offset of the `threadgroup` keyword
    end: int
    type_text: str
    dims: list[str]
    names: list[str] = field(default_factory=list)   # the declared names (ParsedSource.tg_decls)
    stmt_end: int = 0          # offset just past the declaration's ';' (ParsedSource.tg_decls)


@dataclass
class FunctionConstant:
    """A program-scope ``constant T name [[function_constant(index)]];`` declaration."""
    name: str
    type_text: str
    index: int
    start: int                 # offsets of the declaration, through its ';'
    end: int
    line: int = 0


@dataclass
class ParsedSource:
    kernels: list[Signature]
    # attributes, instantiations
    blank_spans: list[tuple[int, int]] = field(default_factory=list)
    tg_decls: list[TgDecl] = field(default_factory=list)
    function_constants: list[FunctionConstant] = field(default_factory=list)
    # offsets of definitions blanked because they coincide on the CPU with an overload on
    # another address space that does something else (walker.Walker._drop_space_overloads)
    space_collisions: list[int] = field(default_factory=list)


def _parse_param(ptoks: list[Token], text: str, index: int, where: str) -> SignatureParam:
    attrs = [t for t in ptoks if t.kind == "attr"]
    body = [t for t in ptoks if t.kind != "attr"]
    name, type_toks = _param_name(body)
    p = SignatureParam(index=index, text=" ".join(t.text for t in body),
                       name=name or f"arg{index}",
                       type_text=_type_text([t.text for t in type_toks]), role="buffer")
    _describe_type(p, [t.text for t in type_toks])
    for an, arg in (x for a in attrs for x in attr_list(a.text)):
        _apply_param_attr(p, an, arg, where)
    return p


def _param_name(body: list[Token]) -> tuple[str, list[Token]]:
    """The declared name (the last identifier outside array brackets; "" when the declaration
    has none) and the tokens of the type without it."""
    name_i = None
    depth = 0
    for k in range(len(body) - 1, -1, -1):
        t = body[k]
        if t.text == "]":
            depth += 1
        elif t.text == "[":
            depth -= 1
        elif depth == 0 and t.kind == "id":
            name_i = k
            break
    if name_i is not None and name_i > 0 and body[name_i - 1].text not in ("::",) and \
            body[name_i].text not in ("int", "uint", "float", "half", "bool"):
        return body[name_i].text, body[:name_i] + body[name_i + 1:]
    return "", body


def _type_text(words: list[str]) -> str:
    return " ".join(words).replace(" :: ", "::").replace(" < ", "<").replace(" >", ">") \
        .replace(" ,", ",")


def _describe_type(p: SignatureParam, words: list[str]) -> None:
    """Pointer, reference, const, address space and element type of `p` from its type's words."""
    p.is_pointer = "*" in words
    p.is_reference = "&" in words or "&&" in words
    p.is_const = "const" in words
    for a in ADDRESS_SPACES:
        if a in words:
            p.address_space = a
            break
    p.elem_type = _type_text([w for w in words if w not in ADDRESS_SPACES and w not in
                              ("const", "volatile", "*", "&", "&&", "restrict", "__restrict",
                               "__restrict__")])


def _apply_param_attr(p: SignatureParam, an: str, arg: str, where: str) -> None:
    """Record attribute `an`(`arg`) of parameter `p`, or reject one the simulator cannot bind."""
    if an == "function_constant":
        p.function_constant = arg
    elif an in POSITION_ATTRS:
        p.role = "position"
        p.attr = "threads_per_grid" if an == "grid_size" else an
    elif an == "buffer":
        try:
            p.buffer_index = int(arg, 0)
        except ValueError:
            raise ParseError(f"{where}: parameter '{p.name}': [[buffer({arg})]] must be an "
                             f"integer literal") from None
    elif an == "threadgroup":
        raise ParseError(
            f"{where}: parameter '{p.name}' uses [[threadgroup({arg})]] (dynamic threadgroup "
            f"memory); torch.mps.compile_shader cannot bind it either. Declare a "
            f"`threadgroup T name[N];` array inside the kernel instead")
    elif an in ("texture", "sampler", "stage_in", "visible_function_table",
                "intersection_function_table", "instance_acceleration_structure"):
        raise ParseError(f"{where}: parameter '{p.name}' uses [[{an}]], which the simulator "
                         f"(and torch.mps.compile_shader) cannot bind")


def parse_params(toks: list[Token], text: str, where: str) -> list[SignatureParam]:
    parts = split_commas(toks)
    if len(parts) == 1 and len(parts[0]) == 1 and parts[0][0].text == "void":
        return []
    return [_parse_param(pt, text, i, where) for i, pt in enumerate(parts)]


def assign_buffer_indices(params: list[SignatureParam], where: str) -> None:
    """Implicit [[buffer(n)]] indices: the lowest unused index, in declaration order."""
    used = {p.buffer_index for p in params if p.role == "buffer" and p.buffer_index >= 0}
    nxt = 0
    for p in params:
        if p.role != "buffer" or p.buffer_index >= 0:
            continue
        while nxt in used:
            nxt += 1
        p.buffer_index = nxt
        used.add(nxt)
    seen: dict[int, str] = {}
    for p in params:
        if p.role == "buffer":
            if p.buffer_index in seen:
                raise ParseError(f"{where}: parameters '{seen[p.buffer_index]}' and '{p.name}' "
                                 f"both use buffer({p.buffer_index})")
            seen[p.buffer_index] = p.name

