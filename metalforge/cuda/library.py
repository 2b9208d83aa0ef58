"""CudaLibrary and CudaFunction (kernel) objects: torch.mps.compile_shader's call model on
CUDA tensors.

`compile_shader(source)` translates the MSL text (translate.py) at once (a SyntaxError for text
it cannot read), runs the simulator's Metal front-end check on it (`front_check`: a SyntaxError
for what Apple's compiler rejects, once per source and machine) and compiles it with NVRTC,
through `torch.cuda._compile_kernel`, on first use on each CUDA device: one module per (source,
device), kept for the process. A kernel call
launches on torch's current stream of the tensors' device and does not synchronise.

Binding (as torch.mps.compile_shader and metalforge.sim): positional argument i binds
buffer(i); a pointer parameter takes a CUDA tensor (its data from the storage offset on) or a
list of numbers (copied to the device); a `constant T&` or by-value parameter takes a Python
number or list (float → float32, int → int64, converted by `arg_casts` — "fp16" "bf16" "int32"
"int16" "int8" "uint8" — which must then match the parameter's type) or a CPU 0-dim tensor.
`threads` / `group_size` are dispatchThreads sizes (ints or 1-3 element lists); edge
threadgroups are partial, as on Metal: the CUDA grid is rounded up to whole blocks and the
entry point returns before user code in the threads past the Metal grid.

A call is checked in full the first time a kernel sees its key (the arguments' kinds, not their
values; see call.py), which makes a `Plan` of the launch; later calls with that key run the
plan: their argument values packed into a parameter buffer and one cuLaunchKernel.
"""
from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Mapping, Optional

import torch

from ..bounded import Bounded
from ..errors import KernelError
from ..once import OnceMap
from .call import Driver, Plan, call_key, plan_call
from .translate import (
    SOURCE_NAME,
    Entry,
    cap,
    cap_registers,
    launch_bounds,
    mid_bounds,
    translate,
)

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
NVRTC_OPTIONS = ["-default-device", "-D__METAL__=1"]
# The Metal a source may assume (metalforge/target.py): below 400 it compiles as Metal 3.1
# C++17; at 400 (Metal 4: <MetalPerformancePrimitives/MetalPerformancePrimitives.h>, whose
# matmul2d runs on tensor cores here) as C++20, which matmul2d's descriptor argument needs.
DEFAULT_METAL_VERSION = 310


def version_options(metal_version: int) -> list[str]:
    """NVRTC's language options for a source compiled for `metal_version`."""
    std = "--std=c++20" if metal_version >= 400 else "--std=c++17"
    return [std, f"-D__METAL_VERSION__={metal_version}"]
SIMD_WIDTH = 32
_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
_CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
_CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
_CU_FUNC_ATTRIBUTE_NUM_REGS = 4
PLANS_PER_KERNEL = 64
SMALL_SPILL = 128                # local bytes a thread the middle cap may cost (`_mid`)


_lib = None
_calls: Optional[Driver] = None


def _libcuda():
    """The CUDA driver library, as torch loads it (once: torch's helper reopens it per call)."""
    global _lib
    if _lib is None:
        _lib = torch.cuda._utils._get_gpu_runtime_library()
    return _lib


def driver() -> Driver:
    """What a plan calls (made once): cuLaunchKernel as ctypes loads it (no argtypes: the
    plan passes handles as c_void_p, sizes as ints; ctypes converts those fastest), torch's
    current stream on a device as an int, `_check`, and cuLaunchKernelEx where the driver has
    it (CUDA 12: four arguments for ctypes instead of eleven, the launch configuration packed
    into the parameter buffer with the arguments) unless METALFORGE_CUDA_LAUNCH=classic."""
    global _calls
    if _calls is None:
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)     # torch >= 1.10
        lib = _libcuda()
        ex = None if os.environ.get("METALFORGE_CUDA_LAUNCH") == "classic" else \
            getattr(lib, "cuLaunchKernelEx", None)
        _calls = Driver(lib.cuLaunchKernel,
                        raw or (lambda device: torch.cuda.current_stream(device).cuda_stream),
                        _check, make_context_current, ex)
    return _calls


def make_context_current(device: int) -> None:
    """Make `device`'s primary context (torch's) current in this thread where none is: a
    thread that has made no CUDA runtime call yet (torch's autograd engine runs a backward in
    its own device thread) has no current context, and the driver calls metalforge makes
    (module loads, launches) fail there with CUDA_ERROR_INVALID_CONTEXT."""
    lib = _libcuda()
    ctx = ctypes.c_void_p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if ctx.value:
        return
    dev = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def _check(res: int, what: str) -> None:
    if res != 0:
        msg = ctypes.c_char_p()
        _libcuda().cuGetErrorString(res, ctypes.byref(msg))
        raise KernelError(f"metalforge.cuda: {what} failed: "
                          f"{msg.value.decode() if msg.value else f'CUDA error {res}'}")


def front_check(source: str, metal_version: int = DEFAULT_METAL_VERSION) -> str:
    """The simulator's Metal front-end check (metalforge/sim/metalcheck.py): MSL that Apple's
    compiler rejects (address spaces, program-scope variables, types and C++ Metal forbids,
    kernel signatures) is the simulator's SyntaxError here too, though NVRTC would compile it.
    Checked once per source and machine (a marker in the cache), so warm calls pay nothing.
    Returns the source to compile: helpers overloaded only on address spaces renamed apart,
    as the simulator builds them (one C++ function each otherwise)."""
    from ..sim.metalcheck import check_source
    return check_source(source, header="failed to compile Metal source for CUDA (Metal front-end "
                                "check):", metal_version=max(metal_version, 320))


def _nvrtc_error(e: Exception) -> SyntaxError:
    msg = str(e)
    for prefix in ("Kernel compilation failed:\n",):
        msg = msg.replace(prefix, "")
    msg = re.sub(r"mf_entry_\d+\w*\.cu", "", msg)
    lines = msg.splitlines()
    if len(lines) > 80:
        lines = lines[:80] + [f"... ({len(lines) - 80} more lines)"]
    err = SyntaxError("failed to compile Metal source for CUDA (NVRTC):\n" + "\n".join(lines))
    err.filename = SOURCE_NAME
    m = re.search(rf'{SOURCE_NAME}\((\d+)\)', msg)
    if m:
        err.lineno = int(m.group(1))
    return err


def _defines(free: list[Entry], mid: Mapping[str, str] | None = None) -> list[str]:
    """The cap macros of a compile with the kernels of `free` uncapped, those named in `mid`
    (some of `free`) under their middle caps (`translate.mid_bounds`; the others keep the
    cap: `translate.cap`)."""
    def bounds(e: Entry) -> str:
        if mid and e.symbol in mid:
            return mid[e.symbol]
        return launch_bounds(e.max_total_threads, capped=False)
    return [f"-D{cap(e.symbol)}={bounds(e)}" for e in free]


class _Module:
    """The compiled translation unit on one device: function handles by entry symbol.

    Kernels are compiled under a register cap (`translate.launch_bounds`: 32 registers
    without a declared thread limit, 64 with one below 1024); where the cap makes one spill
    (local memory), the unit is compiled again with that kernel uncapped (`_uncap`), and an
    uncapped kernel of 129 to 192 registers under a middle cap where that spills little
    (`_mid`). `one_d`: the unit for 1-D dispatches only (MF_ONE_D=1: the entry points'
    thread numbering without y and z, include/mf_cuda/entry.h); the other serves any grid."""

    def __init__(self, text: str, entries: tuple[Entry, ...], device: int, one_d: bool = True,
                 metal_version: int = DEFAULT_METAL_VERSION):
        self.metal_version = metal_version
        self.device = device
        self.one_d = one_d
        self._compile(text, entries, [])
        self.uncapped = self._uncap(text, entries)
        self.mid = self._mid(text, entries, self.uncapped)

    def _mid(self, text: str, entries: tuple[Entry, ...], uncapped: frozenset[str]
             ) -> frozenset[str]:
        """Compile again with the uncapped kernels under their middle caps (one group a core
        more: `translate.mid_bounds`), keeping one for those that spill at most SMALL_SPILL
        bytes a thread there (more groups a core outweigh a few spilled registers; more spill
        does not: translate.mid_bounds' numbers). The uncapped unit stays loaded until a trial
        keeps one: a library whose kernels all spill there (the matrix tiles' accumulators)
        costs one compile more, not two."""
        free = [e for e in entries if e.symbol in uncapped]
        caps = {e.symbol: b for e in free if (b := mid_bounds(
            e.max_total_threads, self.attribute(e.symbol, _CU_FUNC_ATTRIBUTE_NUM_REGS)))}
        wide = [e for e in free if e.symbol in caps]
        while wide:
            before = self.module, self.funcs
            self._compile(text, entries, _defines(free, {e.symbol: caps[e.symbol]
                                                         for e in wide}))
            kept = [e for e in wide if self.attribute(
                e.symbol, _CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES) <= SMALL_SPILL]
            if not kept:
                _check(_libcuda().cuModuleUnload(self.module), "cuModuleUnload")
                self.module, self.funcs = before
                return frozenset()
            _check(_libcuda().cuModuleUnload(before[0]), "cuModuleUnload")
            if len(kept) == len(wide):
                return frozenset(e.symbol for e in wide)
            wide = kept
        return frozenset()

    def _uncap(self, text: str, entries: tuple[Entry, ...]) -> frozenset[str]:
        """Compile again with the kernels uncapped whose cap made them spill (at the cap's
        registers, with local memory), keeping those where uncapping removed local memory
        (a kernel's own run-time indexed arrays live there whatever its registers)."""
        def spilled(e: Entry) -> int:
            return self.attribute(e.symbol, _CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)

        local = {e.symbol: spilled(e) for e in entries}
        capped = {e.symbol: local[e.symbol] for e in entries if local[e.symbol] and self.attribute(
            e.symbol, _CU_FUNC_ATTRIBUTE_NUM_REGS) >= cap_registers(e.max_total_threads)}
        free = [e for e in entries if e.symbol in capped]
        while free:
            self._recompile(text, entries, free)
            kept = [e for e in free if spilled(e) < capped[e.symbol]]
            if len(kept) == len(free):
                return frozenset(e.symbol for e in free)
            free = kept
            if not free:        # none gained: back to every kernel capped
                self._recompile(text, entries, [])
        return frozenset()

    def _recompile(self, text: str, entries: tuple[Entry, ...], free: list[Entry]) -> None:
        _check(_libcuda().cuModuleUnload(self.module), "cuModuleUnload")
        self._compile(text, entries, _defines(free))

    def _compile(self, text: str, entries: tuple[Entry, ...], defines: list[str]) -> None:
        with torch.cuda.device(self.device):
            make_context_current(self.device)
            try:
                first = torch.cuda._compile_kernel(text, entries[0].symbol,
                                                   cuda_include_dirs=[str(INCLUDE_DIR)],
                                                   nvcc_options=list(NVRTC_OPTIONS)
                                                   + version_options(self.metal_version)
                                                   + defines
                                                   + [f"-DMF_ONE_D={int(self.one_d)}"])
            except RuntimeError as e:
                if "compilation failed" in str(e):
                    raise _nvrtc_error(e) from None
                raise
        self.module = first.module
        self.funcs = {entries[0].symbol: first.func}

    def function(self, symbol: str) -> ctypes.c_void_p:
        f = self.funcs.get(symbol)
        if f is None:
            f = ctypes.c_void_p()
            _check(_libcuda().cuModuleGetFunction(ctypes.byref(f), self.module,
                                                  symbol.encode()), f"loading {symbol}")
            f = self.funcs.setdefault(symbol, f)      # the same handle, whichever thread got it
        return f

    def groups_per_core(self, symbol: str, threads: int) -> int:
        """Blocks of `threads` threads of this kernel that fit one multiprocessor at once."""
        n = ctypes.c_int()
        _check(_libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), self.function(symbol), ctypes.c_int(threads), ctypes.c_size_t(0)),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return n.value

    def attribute(self, symbol: str, attr: int) -> int:
        v = ctypes.c_int()
        _check(_libcuda().cuFuncGetAttribute(ctypes.byref(v), attr, self.function(symbol)),
               "cuFuncGetAttribute")
        return v.value


class PlanCache(Bounded[Plan]):
    """A kernel's plans by call key (None: a call not to be kept), at most `size` of them."""

    def __init__(self, size: int = PLANS_PER_KERNEL) -> None:
        super().__init__(size)


class CudaLibrary:
    """A compiled MSL source; `lib.<host_name>` is a CudaFunction (one per name, and one
    module per device and grid kind, each made once: threads asking meanwhile wait)."""

    def __init__(self, source: str, metal_version: int = DEFAULT_METAL_VERSION):
        self.metal_version = metal_version
        tr = translate(source)             # its SyntaxError first: text it cannot read
        checked = front_check(source, metal_version)
        if checked != source:              # address-space overloads renamed apart
            tr = translate(checked)
        self.text = tr.text
        self._entries = {e.host_name: e for e in tr.entries}
        self._order = tr.entries
        self._modules: OnceMap[tuple[int, bool], _Module] = OnceMap()
        self._kernels: OnceMap[str, CudaFunction] = OnceMap()

    def module(self, device: int, one_d: bool = True) -> _Module:
        """The unit compiled for a device: for 1-D dispatches (every metalforge launch), or,
        compiled on first need, for any grid."""
        return self._modules.get_or_build(
            (device, one_d), lambda: _Module(self.text, self._order, device, one_d,
                                             self.metal_version))

    def __getattr__(self, name: str) -> CudaFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        e = self._entries.get(name)
        if e is None:
            raise AttributeError(f"no kernel named '{name}' in this library (kernels: "
                                 f"{', '.join(self._entries)})")
        return self._kernels.get_or_build(name, lambda: CudaFunction(self, e))

    def __dir__(self):
        return list(self._entries)


class CudaFunction:
    """One kernel of a CudaLibrary (what ``lib.<name>`` returns)."""

    def __init__(self, lib: CudaLibrary, entry: Entry):
        self._lib = lib
        self._entry = entry
        self._plans = PlanCache()
        # (device, 1-D dispatch) → (function handle, max threads per group)
        self._on: dict[tuple[int, bool], tuple] = {}

    def __repr__(self) -> str:
        return f"<metalforge.cuda kernel '{self._entry.host_name}'>"

    def _module(self, one_d: bool = True) -> _Module:
        return self._lib.module(torch.cuda.current_device(), one_d)

    def _compiled(self, device: int, one_d: bool = True) -> tuple:
        """(function handle, max threads per group) on a device, for 1-D dispatches or any,
        compiled on first use."""
        got = self._on.get((device, one_d))
        if got is None:
            with torch.cuda.device(device):
                m = self._module(one_d)
                got = self._on.setdefault((device, one_d), (m.function(self._entry.symbol),
                                                            self._max_threads(m)))
        return got

    def _max_threads(self, m: _Module) -> int:
        return min(self._entry.max_total_threads,
                   m.attribute(self._entry.symbol, _CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK))

    @property
    def max_threads_per_threadgroup(self) -> int:
        """The declared limit (1024, or [[max_total_threads_per_threadgroup(N)]]) and what the
        compiled function allows on the current device (its registers), whichever is lower
        (for 1-D dispatches, as metalforge launches)."""
        return self._max_threads(self._module())

    def groups_per_core(self, group_size: int) -> int:
        """Threadgroups of `group_size` threads that share one multiprocessor of the current
        device (its registers, threadgroup memory and thread slots): how the launcher chooses
        between kernels computing the same (`Schedule.alternatives`)."""
        return self._module().groups_per_core(self._entry.symbol, group_size)

    @property
    def thread_execution_width(self) -> int:
        return SIMD_WIDTH

    @property
    def static_thread_group_memory_length(self) -> int:
        return self._module().attribute(self._entry.symbol, _CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)

    # -------------------------------------------------------------------- call
    def __call__(self, *args, threads=None, group_size=None, arg_casts=None):
        """Bind `args` by buffer index and launch on the current stream of their device: the
        plan of the first call with this call's key (call.py), checked then, replayed now."""
        self._plan(args, threads, group_size, arg_casts).run(*args)

    def _plan(self, args: tuple, threads, group_size, arg_casts) -> Plan:
        key = call_key(args, threads, group_size, arg_casts, torch.cuda.current_device)
        plan = self._plans.get(key)
        if plan is None:
            plan = plan_call(self._entry, args, threads, group_size, arg_casts,
                             compiled=self._compiled, current_device=torch.cuda.current_device,
                             driver=driver())
            self._plans.put(key, plan)
        return plan

    def planned(self, *args, threads=None, group_size=None, arg_casts=None):
        """The launch a call with these arguments makes, checked as that call is, without
        launching: a function of the next call's arguments (positional, one per parameter)
        that launches them. It serves only calls with this call's key (`call.call_key`: the
        arguments' kinds, `threads`, `group_size`, `arg_casts`), where it skips the key and
        the plan lookup (metalforge's warm path, whose own key implies this one)."""
        return self._plan(args, threads, group_size, arg_casts).run

    def launch_plan(self, *args, threads=None, group_size=None, arg_casts=None) -> Plan:
        """The `Plan` a call with these arguments launches through (checked as that call is,
        without launching): what `planned` runs, with the lines of its launch
        (`Plan.lines`) for metalforge's warm call to inline. Same contract as `planned`."""
        return self._plan(args, threads, group_size, arg_casts)


def compile_shader(source: str, *, metal_version: int = DEFAULT_METAL_VERSION) -> CudaLibrary:
    """Translate an MSL source for CUDA (compiled per device on first use), for Metal
    `metal_version` (``__METAL_VERSION__``; 400 for Metal 4 tensor ops, which run on tensor
    cores)."""
    return CudaLibrary(source, metal_version)
