"""MSL text → CUDA C++ for NVRTC, and the __global__ entry points.

The kernels' signatures come from metalforge.msl's parser (`metalforge.msl.parse.parse`, used
read-only through its result's attributes). The text itself changes only where C++ needs it;
line numbers never change (removed text becomes spaces), so NVRTC's messages point at the
user's lines:

1. Metal attributes (``[[buffer(0)]]``, ``[[thread_position_in_grid]]``, ``[[kernel]]``, ...)
   and the ``template [[host_name("...")]] ...;`` instantiations are blanked (the parser's
   ``blank_spans``); the entry points instantiate the kernels instead.
2. A kernel-scope ``threadgroup T name[N];`` declaration becomes ``__align__(16) __shared__
   T name[N];`` (16-byte aligned, as Metal's threadgroup allocations: 16-byte vector accesses
   and ldmatrix rows in it are aligned wherever their offsets are).
3. ``constant`` next to ``const`` is blanked (``constant`` is the macro ``const``).
4. Swizzles other than ``.x .y .z .w`` become member calls (swizzle.py), only in sources
   that use one.

Everything else is the shim header's job (include/metal_stdlib: types, math, collectives,
barriers, address-space keywords as empty macros).

Entry points: for each host-visible kernel i, ``extern "C" __global__ void mf_entry_<i>(...)``
takes the buffer parameters in buffer-index order (pointers as pointers, ``constant T&`` and
by-value parameters by value, references to device memory as pointers) and then the Metal grid
size (three unsigned ints). It computes the Metal thread position (include/mf_cuda/entry.h;
the unit compiled with MF_ONE_D=1 serves 1-D dispatches only, with less arithmetic), returns at
once for the threads that the rounded-up CUDA grid adds past the Metal grid's edge, and calls
the kernel with the thread-position parameters converted to their declared types.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..msl.blanks import blanked, single_const
from ..msl.parse import parse
from ..msl.tokens import ParseError
from .swizzle import SwizzleError, rewrite_swizzles

SOURCE_NAME = "program_source"
_ATTR = re.compile(r"\[\[.*?\]\]", re.S)


@dataclass(frozen=True)
class Arg:
    """One parameter of an entry point, in buffer-index order."""
    buffer_index: int
    name: str
    type_text: str         # as declared in the kernel
    elem_type: str         # pointee / referee / value type, qualifiers removed
    by_pointer: bool       # the host passes a device pointer (a tensor); else a value


@dataclass(frozen=True)
class Entry:
    host_name: str
    symbol: str
    args: tuple[Arg, ...]
    max_total_threads: int         # compiled under cap(symbol): launch_bounds of it


@dataclass(frozen=True)
class Translation:
    text: str                      # the CUDA C++ translation unit
    entries: tuple[Entry, ...]


def rewrite(text: str, parsed) -> str:
    out = blanked(text, parsed)
    for start, end in sorted({(d.start, d.end) for d in parsed.tg_decls}, reverse=True):
        if out[start:end] == "threadgroup":
            out = out[:start] + "__align__(16) __shared__ " + out[end:]
    return single_const(out)


def _by_pointer(p) -> bool:
    return bool(p.is_pointer) or (bool(p.is_reference) and
                                  p.address_space in ("device", "threadgroup"))


def _function(k) -> tuple[str, str]:
    """(function pointer type, callee expression) of a parsed kernel."""
    fn = k.func_name if k.func_name.startswith("::") else "::" + k.func_name
    if k.template_args is not None:
        return f"decltype(&{fn}<{k.template_args}>)", f"{fn}<{k.template_args}>"
    if k.fn_params is not None:           # template [[host_name]] kernel void f(params);
        return f"void (*)({_ATTR.sub(' ', k.fn_params)})", fn
    return f"decltype(&{fn})", fn


def launch_bounds(threads: int, capped: bool = True) -> str:
    """The register cap of a kernel of at most `threads` threads a group.

    A kernel declaring [[max_total_threads_per_threadgroup(N)]] (N < 1024) gets
    __launch_bounds__(N, 1024 / N): at least 1024 of its threads resident per multiprocessor,
    so at most 64 registers a thread. Without it NVRTC may take more registers than a schedule
    sized its grid for: the staged attention decode took 72 (7 groups of 128 per H100 core, its
    1024 groups in two waves: 177 us at L = 65536, 131 us capped). A kernel without a limit
    below 1024 gets __launch_bounds__(1024, 2), at most 32 registers, so that two groups of
    1024 fit a core where one would with 33. H100, 2026-11-26: f32 layer_norm (40 registers
    uncapped, 32 without a spill) 4096x8192 137.5 -> 108.6 us, 2048x16384 147.2 -> 110.7; f16
    rms_norm (44) capped spills 48 bytes a thread and ran up to 18% slower.

    `capped=False`: what the library compiles a kernel under where the cap makes it spill
    (local memory): only the group size. H200, 2026-11-29: the 128 x 128 matrix tile spilled
    1192 bytes a thread under 64 registers (8.7 TFLOP/s), uncapped it takes 168 (73.5)."""
    n = min(threads, 1024)
    if not capped:
        return "" if n == 1024 else f"__launch_bounds__({n})"
    return f"__launch_bounds__({n}, {_groups(n)})"


MID_REGISTERS = 128              # the fewest registers a middle cap leaves a thread
MID_TRIAL_EXCESS = 64            # uncapped registers over the middle cap past which it is
                                 # not tried (256 bytes a thread or so to spill)


def mid_bounds(threads: int, registers: int) -> Optional[str]:
    """The middle cap the library tries for a kernel uncapped at `registers` registers a
    thread: one group a core more than those registers allow (168 registers, 3 groups of 128
    threads: 4 under 128; 199, 2 groups: 3 under 170), None where that cap would leave fewer
    than MID_REGISTERS registers (groups of 512 threads and more) or take away more than
    MID_TRIAL_EXCESS.

    H200, 2026-11-29: attention prefill uncapped takes 168 registers (3 groups of 128 a
    core); under 128 it spills 80 bytes a thread (16 its narrow twin) and runs 8-16% faster
    (4096:128 2507 -> 2307 us, 1024:64 142 -> 119). The backward's wide kernels (252-255
    registers) spill 640-688 bytes under 128 and run 2.1x slower (under 168: 440-504 bytes,
    1.5x); they are not tried (82-85 registers over 170)."""
    n = min(threads, 1024)
    groups = REGISTERS_PER_CORE // (n * registers) + 1
    limit = REGISTERS_PER_CORE // (n * groups)
    if limit < MID_REGISTERS or registers - limit > MID_TRIAL_EXCESS:
        return None
    return f"__launch_bounds__({n}, {groups})"


def _groups(threads: int) -> int:
    """The groups of `threads` threads (at most 1024) the cap keeps resident per core."""
    return 2 if threads >= 1024 else 1024 // threads


REGISTERS_PER_CORE = 65536


def cap_registers(threads: int) -> int:
    """The registers a thread gets under `launch_bounds(threads)` (32 without a declared
    limit below 1024, else 64)."""
    n = min(threads, 1024)
    return REGISTERS_PER_CORE // (n * _groups(n))


def cap(symbol: str) -> str:
    """The macro a kernel is compiled under: `launch_bounds(N)` by default; the library
    defines it as `launch_bounds(N, capped=False)` for a kernel the cap makes spill."""
    return f"MF_BOUNDS_{symbol}"


def entry_symbol(i: int, host_name: str) -> str:
    """Entry point i's symbol: mf_entry_<i>_<its host name> (characters outside C
    identifiers as _, at most 96 of the name), so that a profiler (torch.profiler, Nsight)
    names the kernel it times."""
    return f"mf_entry_{i}_" + re.sub(r"\W", "_", host_name, flags=re.ASCII)[:96]


def entry_points(kernels) -> tuple[str, tuple[Entry, ...]]:
    out = ["", "// ---- metalforge.cuda: entry points (one per host-visible kernel) ----"]
    entries = []
    for i, k in enumerate(kernels):
        ftype, callee = _function(k)
        fty = f"mf_F_{i}"
        buffers = sorted((p for p in k.params if p.role == "buffer"), key=lambda p: p.buffer_index)
        decls, args = [], {}
        for p in buffers:
            ptr = _by_pointer(p)
            kind = ("param_t" if p.is_pointer else "pointer_t") if ptr else "value_t"
            decls.append(f"::mf_cuda::{kind}<{fty}, {p.index}> mf_a{p.index}")
            args[p.index] = f"*mf_a{p.index}" if ptr and not p.is_pointer else f"mf_a{p.index}"
        for p in k.params:
            if p.role == "position":
                args[p.index] = (f"::mf_cuda::pos_cast<::mf_cuda::param_t<{fty}, {p.index}>>"
                                 f"(mf_p.{p.attr}())")
        sym = entry_symbol(i, k.host_name)
        out += [f"// {k.host_name}",
                f"#ifndef {cap(sym)}",
                f"#define {cap(sym)} {launch_bounds(k.max_total_threads)}",
                "#endif"]
        out += [f"using {fty} = {ftype};",
                f'extern "C" __global__ void {cap(sym)} {sym}(' +
                ", ".join(decls + ["unsigned mf_gx", "unsigned mf_gy", "unsigned mf_gz"]) + ") {",
                "  ::mf_cuda::Pos mf_p;",
                "  if (!mf_p.init<MF_ONE_D>(mf_gx, mf_gy, mf_gz)) return;",
                f"  {callee}(" + ", ".join(args[j] for j in range(len(k.params))) + ");",
                "}"]
        entries.append(Entry(k.host_name, sym, tuple(
            Arg(p.buffer_index, p.name, p.type_text, p.elem_type, _by_pointer(p))
            for p in buffers), k.max_total_threads))
    return "\n".join(out) + "\n", tuple(entries)


def translate(source: str) -> Translation:
    """The CUDA translation unit of an MSL source (SyntaxError when it cannot be read)."""
    try:
        parsed = parse(source)
    except ParseError as e:
        err = SyntaxError(f"metalforge.cuda cannot read this Metal source: {e}")
        err.filename = SOURCE_NAME
        raise err from None
    if not parsed.kernels:
        raise SyntaxError("metalforge.cuda: the Metal source defines no host-visible kernel")
    try:
        body = rewrite_swizzles(rewrite(source, parsed))
    except SwizzleError as e:
        err = SyntaxError(f"metalforge.cuda: {e}")
        err.filename, err.lineno = SOURCE_NAME, source.count("\n", 0, e.offset) + 1
        raise err from None
    tramp, entries = entry_points(parsed.kernels)
    text = f'#line 1 "{SOURCE_NAME}"\n{body}\n#line 1 "metalforge_cuda_entries"\n{tramp}'
    return Translation(text, entries)
