"""Per-kernel entry points generated from parsed signatures.

`cpu_trampolines` emits, for every host-visible kernel, an ``extern "C"`` function
``mf_entry_<i>(void* const* buffers, const mf::Pos* pos)`` that the engine calls once per GPU
thread: buffer parameters come from the bound buffer table (pointer, reference or by-value, by
their declared type), thread-position parameters from the engine's position record, converted to
the declared type (uint, ushort2, uint3, ...).  The target-specific part is only this text; a
CUDA target would emit a ``__global__`` wrapper from the same `Signature` data.
"""
from __future__ import annotations

from ..msl.signature import Signature


def function_pointer(k: Signature) -> tuple[str, str]:
    """(type of the kernel's function pointer, expression naming the function)."""
    fn = k.func_name if k.func_name.startswith("::") else "::" + k.func_name
    if k.template_args is not None:
        target = f"{fn}<{k.template_args}>"
        return f"decltype(&{target})", f"&{target}"
    if k.fn_params is not None:
        return f"void (*)({k.fn_params})", f"&{fn}"
    return f"decltype(&{fn})", f"&{fn}"


def entry_symbol(i: int) -> str:
    return f"mf_entry_{i}"


def cpu_trampolines(kernels: list[Signature]) -> str:
    out = ["", "// ---- metalforge.sim: generated entry points (one per host-visible kernel) ----"]
    for i, k in enumerate(kernels):
        ftype, fexpr = function_pointer(k)
        args = []
        for p in k.params:
            t = f"::mf::param_t<mf_F, {p.index}>"
            if p.role == "position":
                args.append(f"::mf::pos_cast<{t}>(mf_p->{p.attr})")
            else:
                args.append(f"::mf::arg_cast<{t}>(mf_b[{p.buffer_index}])")
        out.append(f"// {k.host_name}")
        out.append(f'extern "C" void {entry_symbol(i)}'
                   f'(void* const* mf_b, const ::mf::Pos* mf_p) {{')
        out.append(f"  using mf_F = {ftype};")
        out.append(f"  constexpr mf_F mf_fn = {fexpr};")
        out.append("  (void)mf_b; (void)mf_p;")
        out.append("  mf_fn(" + ", ".join(args) + ");")
        out.append("}")
    return "\n".join(out) + "\n"
