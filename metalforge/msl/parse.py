"""Kernel signatures from MSL text, as plain Python data (`parse`).

The parser reads the *preprocessed* source (macros expanded, ``#include <c10/...>``
inlined, line markers kept) and finds:

- kernel definitions: ``kernel void f(...) {...}`` and ``[[kernel]] void f(...)``, plain or
  templated (``template <typename T, int N> kernel void f(...)``);
- host-visible instantiations of templated kernels, in the three forms MSL code uses::

      template [[host_name("f_float")]] kernel void f<float>(device float* x, uint i);
      template [[host_name("f_float")]] kernel void f(device float* x, uint i);   // deduced
      template [[host_name("f_float")]] [[kernel]] decltype(f<float>) f<float>;   // MLX

- each parameter's role: a buffer (``[[buffer(n)]]`` or the implicit index), a thread-position
  attribute, or something the simulator cannot bind (textures, samplers, ``[[threadgroup(n)]]``).

It reads real-world top-level C++ (``static_assert`` and brace initialisers inside parentheses,
``constexpr`` functions, nested templates, default template arguments, ``<`` comparisons in
template arguments) and records what the rewrite pass needs: attribute spans, ``threadgroup``
declarations, the instantiation statements, function constants (`FunctionConstant`), and the
definitions that differ only in an address space and so coincide on the CPU (blanked, see
`Walker._drop_space_overloads`).  Errors carry the user's ``file:line``. Nothing here knows
about the CPU: the same data drives the simulator's trampolines (metalforge/sim/trampoline.py)
and the CUDA entry points (metalforge/cuda/translate.py).  The pieces: tokens.py (tokenizer),
walker.py (the structure walk), signature.py (the model), scalars.py (type sizes).
"""
from __future__ import annotations

import re

from .scalars import eval_int, type_size
from .signature import (
    FunctionConstant,
    ParsedSource,
    Signature,
    SignatureParam,
    TgDecl,
    assign_buffer_indices,
    parse_params,
)
from .tokens import LineMap, ParseError, attr_list, split_commas, tokenize
from .walker import FuncDef, Walker


def _subst(text: str, mapping: dict[str, str]) -> str:
    for k, v in mapping.items():
        text = re.sub(rf"(?<![\w:]){re.escape(k)}(?!\w)", v, text)
    return text


def parse(text: str) -> ParsedSource:
    """Parse preprocessed MSL text into kernels plus the spans the rewrite pass needs."""
    lines = LineMap(text)

    def where(off: int) -> str:
        f, ln = lines.locate(off)
        return f"{f or 'program_source'}:{ln}"

    try:
        return _parse(text, lines, where)
    except ParseError as e:
        if e.offset is None:
            raise
        raise ParseError(f"{where(e.offset)}: {e}") from None


def _parse(text: str, lines: LineMap, where) -> ParsedSource:
    w = Walker(text)
    w.run()
    sigs = _Signatures(text, lines, where, w.consts)
    kernels = [sigs.finish(fd, fd.name, None, None, {}, None)
               for fd in w.funcs if fd.is_kernel and not fd.tparams]
    kernels += [sigs.instantiate(inst, w.funcs) for inst in w.insts]
    seen: set[str] = set()
    for k in kernels:
        if k.host_name in seen:
            raise ParseError(f"two kernels are named '{k.host_name}'")
        seen.add(k.host_name)
    _bind_function_constants(kernels, w.fcs, lines)
    return ParsedSource(kernels=kernels, blank_spans=w.blank, tg_decls=w.tg,
                        function_constants=w.fcs, space_collisions=w.collisions)


class _Signatures:
    """Signatures of the kernels a walked source defines or instantiates."""

    def __init__(self, text: str, lines: LineMap, where, consts: dict[str, str]):
        self.text = text
        self.lines = lines
        self.where = where
        self.consts = consts

    def instantiate(self, inst: dict, funcs: list[FuncDef]) -> Signature:
        """The kernel of an explicit instantiation of a template among `funcs`."""
        where = self.where
        base = inst["name"].split("::")[-1]
        cands = [fd for fd in funcs if fd.name == base and fd.tparams]
        if not cands:
            raise ParseError(f"{where(inst['offset'])}: instantiation '{inst['host']}' names "
                             f"'{inst['name']}', which is not a template function in this source")
        if inst["targs"] is not None:
            fd = cands[0]
            args = [" ".join(t.text for t in part) for part in
                    split_commas(tokenize(inst["targs"]))]
            subst = {}
            for k, (pn, dflt) in enumerate(fd.tparams):
                if k < len(args):
                    subst[pn] = args[k]
                elif dflt is not None:
                    subst[pn] = _subst(dflt, subst)
            sig = self.finish(fd, inst["host"], inst["targs"], None, subst, None)
        else:
            concrete = parse_params(inst["param_toks"], self.text, where(inst["offset"]))
            fd = next((c for c in cands if len(split_commas(c.param_toks)) == len(concrete)),
                      cands[0])
            sig = self.finish(fd, inst["host"], None, inst["params"], {}, concrete)
        sig.func_name = fd.qual
        return sig

    def finish(self, fd: FuncDef, host: str, targs: str | None, fn_params: str | None,
               subst: dict[str, str], concrete: list[SignatureParam] | None) -> Signature:
        """The signature of `fd` as kernel `host`: template parameters replaced by `subst`, or
        parameter types taken from the `concrete` list of a deduced instantiation."""
        where = f"{self.where(fd.offset)}: kernel '{host}'"
        params = parse_params(fd.param_toks, self.text, where)
        if concrete is not None:
            _take_concrete_types(params, concrete, f"{self.where(fd.offset)}: instantiation "
                                                   f"'{host}'")
        elif subst:
            for p in params:
                p.type_text = _subst(p.type_text, subst)
                p.elem_type = _subst(p.elem_type, subst)
        assign_buffer_indices(params, where)
        names = dict(self.consts)
        names.update(subst)
        _, line = self.lines.locate(fd.offset)
        return Signature(host_name=host, func_name=fd.qual, template_args=targs,
                         fn_params=fn_params, params=params, line=line,
                         max_total_threads=_max_total_threads(fd, names, where),
                         threadgroup_bytes=_threadgroup_bytes(fd.tg, names))


def _take_concrete_types(params: list[SignatureParam], concrete: list[SignatureParam],
                         where: str) -> None:
    if len(concrete) != len(params):
        raise ParseError(f"{where} has {len(concrete)} parameters, the template {len(params)}")
    for p, c in zip(params, concrete):
        p.type_text, p.elem_type = c.type_text, c.elem_type
        p.is_pointer, p.is_reference, p.is_const = c.is_pointer, c.is_reference, c.is_const
        p.address_space = c.address_space or p.address_space


def _max_total_threads(fd: FuncDef, names: dict[str, str], where: str) -> int:
    """[[max_total_threads_per_threadgroup(N)]] (at most 1024), else 1024."""
    mtt = 1024
    for an, arg in (x for a in fd.attrs for x in attr_list(a)):  # [[kernel, max_total...(N)]]
        if an == "max_total_threads_per_threadgroup":
            v = eval_int(arg, names)
            if v is None:
                raise ParseError(f"{where}: cannot evaluate "
                                 f"[[max_total_threads_per_threadgroup({arg})]]")
            mtt = min(v, 1024)
    return mtt


def _threadgroup_bytes(decls: list[TgDecl], names: dict[str, str]) -> int | None:
    """Bytes of the kernel-scope threadgroup arrays, rounded up to 16; None if not static."""
    total: int | None = 0
    for d in decls:
        sz = type_size(d.type_text, names)
        for dim in d.dims:
            n = eval_int(dim, names)
            sz = None if (sz is None or n is None) else sz * n
        total = None if (total is None or sz is None) else total + sz
    return None if total is None else (total + 15) // 16 * 16


def _bind_function_constants(kernels: list[Signature], fcs: list[FunctionConstant],
                             lines: LineMap) -> None:
    """Lines of the function constants, and the index of each [[function_constant(name)]]
    parameter's constant."""
    for fc in fcs:
        fc.line = lines.locate(fc.start)[1]
    fc_index = {fc.name: fc.index for fc in fcs}
    for k in kernels:
        for p in k.params:
            if p.function_constant:
                if p.function_constant not in fc_index:
                    raise ParseError(f"program_source:{k.line}: kernel '{k.host_name}': "
                                     f"parameter '{p.name}' names "
                                     f"[[function_constant({p.function_constant})]], which is "
                                     f"not a declared function constant")
                p.function_constant_index = fc_index[p.function_constant]
