"""Library and LibraryFunction (kernel) objects: torch.mps.compile_shader's call model on CPU
tensors.

Binding rules (as torch.mps.compile_shader): positional argument i binds buffer i; a tensor binds
its storage from its storage offset on; a 0-dim tensor binds its one value; Python float ->
float32, int (and bool, an int) -> int64, lists of ints/floats -> packed int64/float32 arrays;
``arg_casts`` (str for every non-tensor argument, or {index: str}) converts scalars and lists to
"fp16" "bf16" "int32" "int16" "int8" "uint8"; ``threads`` defaults to the first tensor's numel;
``threads``/``group_size`` are ints or 1-3 element lists; dispatch is dispatchThreads, so edge
threadgroups are partial; the default group size is min(threads, max) in 1-D and (max, 1, 1) in
2-D/3-D.

Stricter than Metal: the arguments must match the kernel's parameters in number and kind
(TypeError naming kernel, argument index and parameter); every buffer is staged into its own
mapping with inaccessible guard pages on both sides and canary bytes in the alignment gap, so
out-of-bounds writes and faulting reads are reported with the buffer's name and the byte offset;
a float buffer's canary is a NaN of its type, so a read inside the gap (no fault) turns what it
feeds into NaN.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import mmap
import os
import threading
from dataclasses import dataclass
from typing import ContextManager, Iterator

import numpy as np
import torch

from ..errors import KernelError
from ..msl.callmodel import CAST_SCALAR, DTYPE_SCALAR, cast_dtypes, grid_of, group_of
from ..msl.scalars import is_float_scalar, scalar_of
from ..msl.signature import Signature, SignatureParam
from .compiler import DEFAULT_GPU_FAMILY, DEFAULT_METAL_VERSION, build, engine_library
from .trampoline import entry_symbol

MAX_THREADS = 1024
SIMD_WIDTH = 32

_PAGE = mmap.PAGESIZE
_CANARY = bytes([0xA5])
# A float buffer's canary is a NaN of its type (little-endian units), one no arithmetic makes
# (signalling, payload 0xA5...): a read past the data but inside the alignment gap, which no
# guard page catches, then turns what it feeds into NaN and the reference comparison fails.
_FLOAT_CANARY = {torch.float32: bytes([0xA5, 0xA5, 0xA5, 0x7F]),
                 torch.float16: bytes([0xA5, 0x7D]),
                 torch.bfloat16: bytes([0xA5, 0x7F])}
_GUARD_MIN = 1 << 20
_GUARD_MAX = 1 << 30
_EXITED_LEAVE_BARRIERS = 1    # launch flag, kExitedLeaveBarriers in include/mf_sim/engine.cpp
_REVERSE_ORDER = 2            # launch flag, kReverseOrder: a group's fibers run last first
_RACE_CHECK = 4               # launch flag, kRaceCheck: check threadgroup memory for races
_FILL_SHIFT = 3               # launch flags 8, 16: kFillShift, the first group's fill
# What every threadgroup array holds when its group starts (on Metal: whatever an earlier group
# left): every byte 0xFF ("nan": NaN in float types, -1 in signed integers), or every 16-bit
# unit 0x7BFF ("high": 65504 as half, 2.7e36 as float and bfloat) or 0xFBFF ("low": the same,
# negative), the groups (linearised) taking them in turn from the first group's. A read before
# any thread wrote shows as a NaN in a sum, a large value in a max or a min.
# `threadgroup_fill` sets the first group's for a block (testing.check draws it per example).
TG_FILLS = ("nan", "high", "low")
TG_FILL: contextvars.ContextVar[str] = contextvars.ContextVar("metalforge_sim_threadgroup_fill",
                                                              default="nan")
# The order the fibers of a threadgroup run in between barriers and collectives: "forward"
# (thread order) or "reverse". Both are orders a GPU may take; a kernel missing a barrier shows
# in one of them. `thread_order` sets it for a block (testing.check draws it per example).
THREAD_ORDER: contextvars.ContextVar[str] = contextvars.ContextVar("metalforge_sim_thread_order",
                                                                   default="forward")


# Whether launches check threadgroup memory for races and for reads of what no thread wrote
# (include/mf_sim/race.h): on by default;
# `race_detection(False)` turns it off for a block.
RACE_DETECTION: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "metalforge_sim_race_detection", default=True)


# Whether a launch's grid is rounded up to whole threadgroups, as the cuda backend launches
# (threads past the grid run too, and each kernel must guard them); Metal's dispatchThreads
# launches exactly the grid. `whole_groups` sets it for a block (testing.check draws it).
WHOLE_GROUPS: contextvars.ContextVar[bool] = contextvars.ContextVar("metalforge_sim_whole_groups",
                                                                    default=False)


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar, value) -> Iterator[None]:
    """`var` set to `value` for a block (the launch models and race detection below)."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def whole_groups(on: bool = True) -> ContextManager[None]:
    """Run the simulator's launches in this block on grids rounded up to whole threadgroups.

    Example: ``with sim.whole_groups(): lib.k(y, threads=40, group_size=32)`` runs 64 threads."""
    return _setting(WHOLE_GROUPS, bool(on))


def race_detection(on: bool = True) -> ContextManager[None]:
    """Check (the default) or do not check the simulator's launches in this block for
    threadgroup-memory races: two threads of a group touching one element of a threadgroup
    array, at least one writing, with no barrier between them, fail the launch with a
    KernelError naming the array, the element, both threads and the hazard; so does a read of
    an element no thread of the group has written since it started.

    Example: ``with sim.race_detection(False): lib.k(x, threads=64, group_size=64)``."""
    return _setting(RACE_DETECTION, bool(on))


def threadgroup_fill(fill: str) -> ContextManager[None]:
    """Start the threadgroup arrays of the first group of each of the simulator's launches in
    this block as `fill`: "nan" (the default; every byte 0xFF), "high" (65504 in half, 2.7e36
    in float and bfloat) or "low" (the same, negative); group g (linearised) takes the fill g
    places further in that cycle. A kernel reading threadgroup memory before any thread of its
    group wrote it gets NaNs and outsized values, not the zeros or another group's values it
    might find on a GPU.

    Example: ``with sim.threadgroup_fill("high"): lib.k(x, y, threads=64, group_size=64)``."""
    if fill not in TG_FILLS:
        raise ValueError(f"threadgroup fill must be one of {', '.join(TG_FILLS)}, got {fill!r}")
    return _setting(TG_FILL, fill)


def thread_order(order: str) -> ContextManager[None]:
    """Run the simulator's launches in this block with their threads in `order`.

    Example: ``with sim.thread_order("reverse"): lib.k(x, y, threads=64, group_size=64)``."""
    if order not in ("forward", "reverse"):
        raise ValueError(f"thread order must be 'forward' or 'reverse', got {order!r}")
    return _setting(THREAD_ORDER, order)


class _Result(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int32), ("signo", ctypes.c_int32),
                ("is_write", ctypes.c_int32), ("pad", ctypes.c_int32),
                ("fault_addr", ctypes.c_uint64), ("group", ctypes.c_uint32 * 3),
                ("thread", ctypes.c_uint32 * 3), ("message", ctypes.c_char * 8192)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

_engine = None
_engine_lock = threading.Lock()


def _load_engine():
    global _engine
    with _engine_lock:
        if _engine is not None:
            return _engine
        _engine = ctypes.CDLL(str(engine_library()), mode=os.RTLD_NOW | ctypes.RTLD_GLOBAL)
        _engine.mf_rt_launch.restype = ctypes.c_int
        _engine.mf_rt_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.POINTER(ctypes.c_uint32),
                                         ctypes.POINTER(ctypes.c_uint32), ctypes.c_int,
                                         ctypes.c_int, ctypes.POINTER(_Result)]
        if _engine.mf_rt_result_size() != ctypes.sizeof(_Result):
            raise RuntimeError("metalforge.sim: engine and Python disagree on the result layout")
        return _engine


# ---------------------------------------------------------------------------- staging
class _Region:
    """One guarded staging mapping: [guard][canary..data..canary][guard]."""

    def __init__(self, nbytes: int, names: list[str], canary: bytes = _CANARY):
        self.nbytes = nbytes
        self.names = names
        self.canary = canary
        body = max(16, (nbytes + 15) // 16 * 16)
        self.inner = (body + _PAGE - 1) // _PAGE * _PAGE
        # Guards as large as the buffer (at least 1 MiB, at most 1 GiB) on each side: address
        # space only, so that even indices far off the end land in them and fault.
        self.guard = min(max(_GUARD_MIN, self.inner), _GUARD_MAX)
        self.total = self.inner + 2 * self.guard
        base = _libc.mmap(None, self.total, 0, 0x4022, -1, 0)  # PROT_NONE, PRIVATE|ANON|NORESERVE
        if base in (None, ctypes.c_void_p(-1).value):
            raise MemoryError("metalforge.sim: cannot map a staging buffer")
        self.base = base
        _libc.mprotect(base + self.guard, self.inner, 3)      # the usable middle: RW
        self.front = self.inner - body                         # canary before the data
        self.gap = body - nbytes                               # canary after it (< 16 bytes)
        self.data = base + self.guard + self.front
        # only the canaries are written here: the caller copies the data over the rest
        ctypes.memmove(base + self.guard, self.pattern(self.front), self.front)
        ctypes.memmove(self.data + nbytes, self.pattern(self.gap, self.front + nbytes), self.gap)

    def classify(self, addr: int) -> int | None:
        """Byte offset of `addr` relative to the data if it lies in this region's guards."""
        if self.base <= addr < self.base + self.total:
            return addr - self.data
        return None

    def pattern(self, n: int, start: int = 0) -> bytes:
        """The canary bytes at offsets [start, start + n) from the usable middle's start."""
        u = len(self.canary)
        k = start % u
        return (self.canary * ((k + n) // u + 1))[k:k + n]

    def canary_damage(self) -> int | None:
        front, gap = self.front, self.gap
        if front:
            got, want = ctypes.string_at(self.base + self.guard, front), self.pattern(front)
            if got != want:
                return max(i for i in range(front) if got[i] != want[i]) - front
        if gap:
            got = ctypes.string_at(self.data + self.nbytes, gap)
            want = self.pattern(gap, front + self.nbytes)
            if got != want:
                return self.nbytes + next(i for i in range(gap) if got[i] != want[i])
        return None

    def free(self) -> None:
        _libc.munmap(self.base, self.total)


def _to_bytes(values, dtype: torch.dtype) -> bytes:
    if dtype.is_floating_point:
        t = torch.tensor(values, dtype=torch.float64).to(dtype)
    else:
        t = torch.tensor(values, dtype=torch.int64).to(dtype)   # wraps, like a C cast
    return bytes(t.contiguous().view(torch.uint8).numpy())


@dataclass
class _Bound:
    kind: str            # 'tensor', 'bytes'
    scalar: str          # Metal scalar name of the data ('' unknown)
    count: int           # number of elements (lists/scalars)
    desc: str            # for messages
    tensor: torch.Tensor | None = None
    data: bytes = b""


def _describe_param(p: SignatureParam) -> str:
    return f"'{p.name}' ({p.type_text.strip()})"


def _check(kname: str, i: int, p: SignatureParam, b: _Bound) -> None:
    where = f"kernel '{kname}' argument {i} {_describe_param(p)}"
    sc = scalar_of(p.elem_type)
    if b.kind == "tensor" and b.tensor.dim() > 0:
        if not p.is_pointer and sc is not None:
            raise TypeError(f"{where}: expects a single value, got a tensor of shape "
                            f"{tuple(b.tensor.shape)}; pass a Python number (with arg_casts) "
                            f"or declare the parameter as a pointer")
    if sc is None or not b.scalar:
        return
    want, ncomp, _ = sc
    got = b.scalar
    gsc = scalar_of(got)
    ok = False
    if is_float_scalar(want) or is_float_scalar(got):
        ok = want == got
    else:
        ok = gsc is not None and scalar_of(want)[2] == gsc[2]
    if not ok:
        hint = ""
        if b.kind == "bytes":
            cast = {"half": "fp16", "bfloat": "bf16", "int": "int32", "uint": "int32",
                    "short": "int16", "ushort": "int16", "char": "int8", "uchar": "uint8",
                    "bool": "uint8"}.get(want)
            hint = (f"; pass arg_casts={{{i}: '{cast}'}}" if cast else
                    "; pass a value of the parameter's type")
        raise TypeError(f"{where}: got {b.desc}, whose elements are {got}, but the parameter's "
                        f"elements are {want}{hint}")
    if b.kind == "bytes" and not p.is_pointer and ncomp > 1 and b.count not in (ncomp,) and \
            not (ncomp == 3 and b.count == 3):
        raise TypeError(f"{where}: expects {ncomp} values, got {b.count}")
    if b.kind == "bytes" and not p.is_pointer and ncomp == 1 and b.count != 1:
        raise TypeError(f"{where}: expects a single value, got a list of {b.count}")


class _Staging:
    """The guarded copies of a launch's arguments: one region per tensor storage (covering
    every bound view of it through the storage's end) and one per bytes argument.

    After the launch only what the kernel changed goes back: a storage bound to a writable
    parameter keeps a snapshot of what was staged, and the bytes that differ from it are
    written to the storage, no others. A storage bound only to `const` parameters is never
    written back. So a launch leaves every other byte of a storage as it finds it then,
    including bytes another thread wrote while the kernel ran."""

    def __init__(self):
        self.regions: list[_Region] = []
        # storage ptr -> (region, low offset, snapshot of the staged bytes or None: read-only)
        self.storages: dict[int, tuple[int, int, np.ndarray | None]] = {}

    def stage(self, bound: list[_Bound], bufs: dict[int, SignatureParam]):
        """Copy the arguments into regions; the table of buffer pointers, by buffer index."""
        lo_of = self._low_offsets(bound)
        written = self._written_storages(bound, bufs)
        ptr_table = (ctypes.c_void_p * max(1, len(bound)))()
        for i, b in enumerate(bound):
            if b.kind == "none":
                ptr_table[bufs[i].buffer_index] = None
                continue
            ri, ptr = (self._stage_tensor(b.tensor, lo_of, written) if b.kind == "tensor" else
                       self._stage_bytes(b.data))
            self.regions[ri].names.append(f"'{bufs[i].name}' (argument {i})")
            ptr_table[bufs[i].buffer_index] = ptr
        return ptr_table

    @staticmethod
    def _low_offsets(bound: list[_Bound]) -> dict[int, int]:
        """Storage pointer -> the lowest byte offset any bound view of it starts at."""
        lo_of: dict[int, int] = {}
        for b in bound:
            if b.kind == "tensor":
                key = b.tensor.untyped_storage().data_ptr()
                off = b.tensor.storage_offset() * b.tensor.element_size()
                lo_of[key] = min(lo_of.get(key, off), off)
        return lo_of

    @staticmethod
    def _written_storages(bound: list[_Bound], bufs: dict[int, SignatureParam]) -> set[int]:
        """The storage pointers bound to at least one parameter the kernel may write."""
        return {b.tensor.untyped_storage().data_ptr() for i, b in enumerate(bound)
                if b.kind == "tensor" and not _read_only(bufs[i])}

    def _stage_tensor(self, t: torch.Tensor, lo_of: dict[int, int],
                      written: set[int]) -> tuple[int, int]:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key not in self.storages:
            lo = lo_of[key]
            r = _Region(st.nbytes() - lo, [], _FLOAT_CANARY.get(t.dtype, _CANARY))
            ctypes.memmove(r.data, key + lo, r.nbytes)
            snapshot = _view(r.data, r.nbytes).copy() if key in written else None
            self.regions.append(r)
            self.storages[key] = (len(self.regions) - 1, lo, snapshot)
        ri, lo, _ = self.storages[key]
        off = t.storage_offset() * t.element_size()
        return ri, self.regions[ri].data + (off - lo)

    def _stage_bytes(self, data: bytes) -> tuple[int, int]:
        r = _Region(len(data), [])
        ctypes.memmove(r.data, data, len(data))
        self.regions.append(r)
        return len(self.regions) - 1, r.data

    def copy_back(self) -> None:
        """Write the bytes the kernel changed back to their storages (and no others)."""
        for key, (ri, lo, snapshot) in self.storages.items():
            if snapshot is None:
                continue
            got = _view(self.regions[ri].data, self.regions[ri].nbytes)
            changed = got != snapshot
            if changed.any():
                np.copyto(_view(key + lo, len(snapshot)), got, where=changed)

    def free(self) -> None:
        for r in self.regions:
            r.free()


def _read_only(p: SignatureParam) -> bool:
    """Whether the kernel cannot write through buffer parameter `p`: `constant`, or `const`
    on what it points to (`const device float*`, `device const T&`; not `device T* const`)."""
    pointee = p.type_text.replace("&", "*").split("*")[0].split()
    return p.address_space == "constant" or "const" in pointee


def _view(addr: int, nbytes: int) -> np.ndarray:
    """The `nbytes` bytes at `addr` as a writable numpy array (no copy)."""
    if nbytes == 0:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))


class LibraryFunction:
    """One kernel of a Library (what ``lib.<name>`` returns)."""

    def __init__(self, lib: "_Dll", index: int, sig: Signature, fc: dict | None = None,
                 exited_leave_barriers: bool = False):
        self._fc = fc or {}
        self._exited_leave_barriers = exited_leave_barriers
        self._lib = lib
        self._index = index
        self._sig = sig
        self._entry = ctypes.cast(getattr(lib._dll, entry_symbol(index)), ctypes.c_void_p).value

    def _buffers(self) -> dict[int, SignatureParam]:
        """Buffer index -> parameter, for every index up to the highest: positional argument i
        binds buffer(i), and an index no parameter uses (MLX's rope_single binds 0-4 and 10)
        takes None."""
        bufs = {p.buffer_index: p for p in self._sig.params if p.role == "buffer"}
        for k in range(max(bufs, default=-1) + 1):
            if k not in bufs:
                bufs[k] = SignatureParam(index=-1, text="", name=f"buffer({k})", type_text="unused",
                                role="unused", buffer_index=k)
        return bufs

    def _present(self, p: SignatureParam) -> bool:
        """Whether a parameter exists in this specialisation (its function constant, if any,
        is true; an undefined one counts as false)."""
        if p.role == "unused":
            return False
        return p.function_constant_index < 0 or bool(self._fc.get(p.function_constant_index))

    @property
    def max_threads_per_threadgroup(self) -> int:
        return self._sig.max_total_threads

    @property
    def thread_execution_width(self) -> int:
        return SIMD_WIDTH

    @property
    def static_thread_group_memory_length(self) -> int:
        """Bytes of kernel-scope ``threadgroup`` arrays: the sum of their sizes, rounded up to a
        multiple of 16 (threadgroup memory is allocated in 16-byte units)."""
        if self._sig.threadgroup_bytes is None:
            raise RuntimeError(
                f"kernel '{self._sig.host_name}': the simulator cannot size its threadgroup "
                f"declarations statically (an element type or array length it cannot evaluate)")
        return self._sig.threadgroup_bytes

    def __repr__(self) -> str:
        return f"<metalforge.sim kernel '{self._sig.host_name}'>"

    # -------------------------------------------------------------------- call
    def __call__(self, *args, threads=None, group_size=None, arg_casts=None):
        name = self._sig.host_name
        bufs = self._buffers()
        if len(args) != len(bufs):
            plist = ", ".join(f"{k}: {_describe_param(bufs[k])}" for k in sorted(bufs))
            raise TypeError(f"kernel '{name}' takes {len(bufs)} arguments ({plist}), "
                            f"got {len(args)}")
        casts = cast_dtypes(arg_casts, len(args))
        bound = [self._bind(i, a, bufs[i], casts.get(i)) for i, a in enumerate(args)]
        for i, b in enumerate(bound):
            _check(name, i, bufs[i], b)
        first_numel = next((a.numel() for a in args if isinstance(a, torch.Tensor)), None)
        grid3, group3 = self._geometry(threads, group_size, first_numel)
        if any(t == 0 for t in grid3):
            return
        if WHOLE_GROUPS.get():
            grid3 = [-(-t // g) * g for t, g in zip(grid3, group3)]
        self._launch(bound, grid3, group3)

    def _bind(self, i: int, a, p: SignatureParam, cast: torch.dtype | None) -> _Bound:
        """Argument `a` (index i) for parameter `p`, as the bytes or tensor it binds."""
        absent = not self._present(p)
        if absent or a is None:
            return self._bind_none(i, a, p, absent)
        if isinstance(a, torch.Tensor):
            return self._bind_tensor(i, a)
        if isinstance(a, (list, tuple)):
            return self._bind_list(i, a, cast)
        return self._bind_scalar(i, a, cast)

    def _bind_none(self, i: int, a, p: SignatureParam, absent: bool) -> _Bound:
        """Nothing bound: None where no parameter uses the index, and anything (ignored, as
        Metal ignores it: MLX's sdpa_vector binds such buffers) for a parameter whose
        [[function_constant(...)]] is false."""
        unused = p.role == "unused"
        if (a is not None) if unused else not absent:       # (a present parameter got None)
            raise TypeError(
                f"kernel '{self._sig.host_name}' argument {i} {_describe_param(p)}: pass None "
                f"exactly for buffer indices no parameter uses (and a value for a parameter "
                f"whose [[function_constant(...)]] is true); "
                + ("no parameter uses it" if unused else
                   f"{p.function_constant} is true" if p.function_constant else
                   "the kernel uses this parameter"))
        return _Bound("none", "", 0, "None")

    def _bind_tensor(self, i: int, a: torch.Tensor) -> _Bound:
        if a.device.type != "cpu":
            raise TypeError(f"kernel '{self._sig.host_name}' argument {i}: the simulator runs "
                            f"on CPU tensors, got one on {a.device}")
        if a.dim() == 0:
            t = a.to(torch.float32) if a.dtype == torch.float64 else a
            return _Bound("bytes", DTYPE_SCALAR.get(t.dtype, ""), 1, f"a 0-dim {t.dtype} tensor",
                          data=bytes(t.reshape(1).view(torch.uint8).numpy()))
        return _Bound("tensor", DTYPE_SCALAR.get(a.dtype, ""), a.numel(), f"a {a.dtype} tensor",
                      tensor=a)

    def _bind_list(self, i: int, a, cast: torch.dtype | None) -> _Bound:
        if len(a) == 0:
            raise RuntimeError("Empty list/tuple can not be an argument to metal kernel")
        if isinstance(a[0], torch.Tensor):
            raise TypeError(f"kernel '{self._sig.host_name}' argument {i}: lists of tensors "
                            f"(argument buffers) are not supported by the simulator")
        if isinstance(a[0], float):
            dt = cast or torch.float32
        elif isinstance(a[0], int):
            dt = cast or torch.int64
        else:
            raise RuntimeError("Unexpected argument types")
        vals = list(a)
        if not all(isinstance(v, (int, float)) for v in vals):
            raise RuntimeError("Unexpected argument types")
        return _Bound("bytes", CAST_SCALAR[dt], len(vals),
                      f"a list of {len(vals)} values as {CAST_SCALAR[dt]}",
                      data=_to_bytes(vals, dt))

    def _bind_scalar(self, i: int, a, cast: torch.dtype | None) -> _Bound:
        if isinstance(a, float):
            dt = cast or torch.float32
        elif isinstance(a, int):
            dt = cast or torch.int64
        else:
            raise RuntimeError(f"Unsupported argument type {type(a).__name__} "
                               f"(argument {i} of kernel '{self._sig.host_name}')")
        kind = "Python float" if isinstance(a, float) else (
            "Python bool" if isinstance(a, bool) else "Python int")
        return _Bound("bytes", CAST_SCALAR[dt], 1, f"a {kind} (bound as {CAST_SCALAR[dt]})",
                      data=_to_bytes([a], dt))

    def _geometry(self, threads, group_size, first_numel: int | None
                  ) -> tuple[list[int], list[int]]:
        """The dispatch's grid and threadgroup size, each as 3 dimensions."""
        grid = grid_of(threads, first_numel)
        group = group_of(group_size, grid, threads, self._sig.max_total_threads)
        if any(g == 0 for g in group) and not any(t == 0 for t in grid):
            raise ValueError(f"group_size {group_size!r} has a zero dimension")
        return (grid + [1, 1])[:3], (group + [1, 1])[:3]

    # -------------------------------------------------------------------- launch
    def _launch(self, bound: list[_Bound], grid: list[int], group: list[int]) -> None:
        staged = _Staging()
        try:
            ptr_table = staged.stage(bound, self._buffers())
            res = _Result()
            workers = int(os.environ.get("METALFORGE_SIM_WORKERS", "2"))
            flags = _EXITED_LEAVE_BARRIERS if self._exited_leave_barriers else 0
            if THREAD_ORDER.get() == "reverse":
                flags |= _REVERSE_ORDER
            if RACE_DETECTION.get():
                flags |= _RACE_CHECK
            flags |= TG_FILLS.index(TG_FILL.get()) << _FILL_SHIFT
            _load_engine().mf_rt_launch(self._entry, ptr_table, (ctypes.c_uint32 * 3)(*grid),
                                        (ctypes.c_uint32 * 3)(*group), workers, flags,
                                        ctypes.byref(res))
            if res.code != 0:
                raise KernelError(self._explain(res, staged.regions))
            self._check_canaries(staged.regions)
            staged.copy_back()
        finally:
            staged.free()

    def _check_canaries(self, regions: list[_Region]) -> None:
        for r in regions:
            off = r.canary_damage()
            if off is not None:
                raise KernelError(
                    f"kernel '{self._sig.host_name}' wrote out of bounds of buffer "
                    f"{' / '.join(r.names)} at byte offset {off} (the buffer has {r.nbytes} "
                    f"bytes from its binding offset)")

    def _explain(self, res: _Result, regions: list[_Region]) -> str:
        name = self._sig.host_name
        msg = res.message.decode(errors="replace")
        if res.code == 2:
            addr = res.fault_addr
            for r in regions:
                off = r.classify(addr)
                if off is not None:
                    rw = {1: "write", 0: "read"}.get(res.is_write, "access")
                    return (f"kernel '{name}': out-of-bounds {rw} of buffer "
                            f"{' / '.join(r.names)} at byte offset {off} (the buffer has "
                            f"{r.nbytes} bytes from its binding offset), by "
                            f"thread_position_in_grid ({res.thread[0]},{res.thread[1]},"
                            f"{res.thread[2]})")
            return f"kernel '{name}' faulted: {msg}"
        if res.code in (1, 4, 5):  # barrier divergence, threadgroup-memory race, stray lane
            return f"kernel '{name}': {msg}"
        return f"kernel '{name}': simulator error: {msg}"


def _fc_literal(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}ll"
    if isinstance(v, float):
        return f"{float(v).hex()}"
    raise TypeError(f"function_constants: values are bool, int or float, got {v!r}")


def function_constant_preamble(values: dict[int, bool | int | float]) -> str:
    """C++ text that defines function constants `values` (index -> value) for the source that
    follows it (see include/mf_sim/constants.h); line 1 of that source stays line 1."""
    if not values:
        return ""
    specs = []
    for k in sorted(values):
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < 65536:
            raise TypeError(f"function_constants: keys are the [[function_constant(index)]] "
                            f"indices (ints 0..65535), got {k!r}")
        specs.append(f"template <> struct fc_value<{k}> {{ static constexpr bool defined = true; "
                     f"static constexpr auto value = {_fc_literal(values[k])}; }};")
    return f"namespace mf {{ {' '.join(specs)} }}\n#line 1\n"


# Sources with more host-visible kernels than this (MLX's binary.metal has thousands) are
# compiled lazily: each kernel on first lookup, as its own small library, so time and memory
# are bounded by what is used.  Smaller sources compile whole, in one compiler run.
LAZY_KERNELS = 64


class _Dll:
    """One compiled shared library (a whole source, or one kernel of a lazily built one)."""

    def __init__(self, path):
        self._dll = ctypes.CDLL(str(path), mode=os.RTLD_NOW | ctypes.RTLD_LOCAL)


class Library:
    """What `compile_shader` returns: one attribute per host-visible kernel."""

    def __init__(self, source: str, function_constants: dict | None = None,
                 exited_leave_barriers: bool = False, *,
                 metal_version: int = DEFAULT_METAL_VERSION,
                 gpu_family: int = DEFAULT_GPU_FAMILY):
        self._fc = dict(function_constants or {})
        self._exited = exited_leave_barriers
        self._source = function_constant_preamble(self._fc) + source
        self._target = {"metal_version": metal_version, "gpu_family": gpu_family}
        path, kernels = build(self._source, max_kernels=LAZY_KERNELS, **self._target)
        _load_engine()
        self._sigs = {k.host_name: (i, k) for i, k in enumerate(kernels)}
        self._kernels: dict[str, LibraryFunction] = {}
        if path is not None:
            dll = _Dll(path)
            for name, (i, sig) in self._sigs.items():
                self._kernels[name] = LibraryFunction(dll, i, sig, self._fc, self._exited)

    def __getattr__(self, name: str) -> LibraryFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._sigs:
            raise RuntimeError(f"Failed to create function state object for: {name}")
        if name not in self._kernels:
            path, kernels = build(self._source, kernels=[name], **self._target)
            self._kernels.setdefault(name, LibraryFunction(_Dll(path), 0, kernels[0], self._fc,
                                                           self._exited))   # first one wins
        return self._kernels[name]

    def __dir__(self):
        return sorted(self._sigs)

    def __repr__(self) -> str:
        return f"<metalforge.sim library: {', '.join(sorted(self._sigs))}>"


def compile_shader(source: str, *, function_constants: dict | None = None,
                   exited_leave_barriers: bool = False,
                   metal_version: int = DEFAULT_METAL_VERSION,
                   gpu_family: int = DEFAULT_GPU_FAMILY) -> Library:
    """Compile MSL `source` for the CPU simulator (drop-in for torch.mps.compile_shader).

    ``function_constants`` (a simulator extension; torch.mps.compile_shader has no such
    argument) gives values to ``[[function_constant(index)]]`` declarations, as
    ``{index: value}`` with bool/int/float values, as an MTLFunctionConstantValues would.  A
    constant without a value is undefined: ``is_function_constant_defined`` is false for it and
    it reads as zero.

    ``exited_leave_barriers`` (a simulator extension): by default a barrier that some threads
    reach after others returned is reported as divergence (``KernelError``).  With True, a
    thread that has returned no longer takes part in barriers, as on Apple GPUs, and a barrier
    resolves once every thread that has not returned waits at it (MLX's gemv relies on this:
    one lane per simdgroup meets a ``threadgroup_barrier`` after the others returned).

    ``metal_version`` and ``gpu_family`` (simulator extensions) say which Metal the source is
    compiled for: ``__METAL_VERSION__`` (320 = Metal 3.2, the default; 400 = Metal 4.0, needed
    by ``<MetalPerformancePrimitives/MetalPerformancePrimitives.h>``) and the Apple GPU family
    (9 = M3/M4, the default; 10 = M5), which fixes the element layout of Metal 4 cooperative
    tensors.  Both are part of the compile cache's key.

    Example::

        lib = compile_shader('''
        #include <metal_stdlib>
        kernel void twice(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {
            x[i] *= 2.0f;
        }''')
        lib.twice(x)                      # x: a CPU float32 tensor; threads = x.numel()
    """
    if not isinstance(source, str):
        raise TypeError("compile_shader expects the Metal source as a str")
    return Library(source, function_constants, exited_leave_barriers,
                   metal_version=metal_version, gpu_family=gpu_family)
