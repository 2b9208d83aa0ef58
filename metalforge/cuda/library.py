"""Library and LibraryFunction (kernel) objects: torch.mps.compile_shader's call model on
CUDA tensors.

`compile_shader(source)` translates the MSL text (translate.py) at once (a SyntaxError for text
it cannot read) and compiles it with NVRTC, through `torch.cuda._compile_kernel`, on first use
on each CUDA device: one module per (source, device), kept for the process. A kernel call
launches on torch's current stream of the tensors' device and does not synchronise.

Binding (as torch.mps.compile_shader and metalforge.sim): positional argument i binds
buffer(i); a pointer parameter takes a CUDA tensor (its data from the storage offset on) or a
list of numbers (copied to the device); a `constant T&` or by-value parameter takes a Python
number or list (float → float32, int → int64, converted by `arg_casts` — "fp16" "bf16" "int32"
"int16" "int8" "uint8" — which must then match the parameter's type) or a CPU 0-dim tensor.
`threads` / `group_size` are dispatchThreads sizes (ints or 1-3 element lists); edge
threadgroups are partial, as on Metal: the CUDA grid is rounded up to whole blocks and the
entry point returns before user code in the threads past the Metal grid.
"""
from __future__ import annotations

import ctypes
import re
import struct
from pathlib import Path

import torch

from ..errors import MetalforgeError
from ..sim.callmodel import CAST_SCALAR, DTYPE_SCALAR, cast_dtypes, dims
from .translate import Arg, Entry, SOURCE_NAME, translate

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
NVRTC_OPTIONS = ["-default-device", "--std=c++17", "-D__METAL__=1", "-D__METAL_VERSION__=310"]
SIMD_WIDTH = 32
_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
_CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
_MAX_GRID = (2 ** 31 - 1, 65535, 65535)

# Metal scalar → (struct format, byte size, is float); half/bfloat are packed through torch
_SCALARS = {"float": ("f", 4, True), "half": ("e", 2, True), "bfloat": (None, 2, True),
            "int": ("i", 4, False), "uint": ("I", 4, False), "int32_t": ("i", 4, False),
            "uint32_t": ("I", 4, False), "short": ("h", 2, False), "ushort": ("H", 2, False),
            "int16_t": ("h", 2, False), "uint16_t": ("H", 2, False), "char": ("b", 1, False),
            "uchar": ("B", 1, False), "int8_t": ("b", 1, False), "uint8_t": ("B", 1, False),
            "bool": ("?", 1, False), "long": ("q", 8, False), "ulong": ("Q", 8, False),
            "int64_t": ("q", 8, False), "uint64_t": ("Q", 8, False), "size_t": ("Q", 8, False)}
_CAST_NAME = {"half": "fp16", "bfloat": "bf16", "int": "int32", "uint": "int32",
              "short": "int16", "ushort": "int16", "char": "int8", "uchar": "uint8"}


def _scalar(type_name: str):
    """(scalar, components) of a Metal scalar or vector type name, else None."""
    t = type_name.replace("metal::", "").strip()
    if t in _SCALARS:
        return t, 1
    m = (re.fullmatch(r"([a-z]+?)([234])", t) or
         re.fullmatch(r"vec<\s*(\w+)\s*,\s*([234])\s*>", t))
    if m and m.group(1) in _SCALARS:
        return m.group(1), int(m.group(2))
    return None


def _compatible(want: str, got: str) -> bool:
    """Whether data of Metal scalar `got` may bind a parameter of scalar `want`."""
    if _SCALARS[want][2] or got in ("float", "half", "bfloat", "double"):
        return want == got
    return got in _SCALARS and _SCALARS[want][1] == _SCALARS[got][1]


class KernelError(MetalforgeError, RuntimeError):
    """A CUDA kernel could not be launched (driver error)."""


_driver = None


def _libcuda():
    """The CUDA driver library, as torch loads it (once: torch's helper reopens it per call)."""
    global _driver
    if _driver is None:
        _driver = torch.cuda._utils._get_gpu_runtime_library()
    return _driver


def _stream_handle(device: int):
    """torch's current stream on `device`, as a CUstream."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return ctypes.c_void_p(raw(device))
    return torch.cuda.current_stream(device)._as_parameter_


def _check(res: int, what: str) -> None:
    if res != 0:
        msg = ctypes.c_char_p()
        _libcuda().cuGetErrorString(res, ctypes.byref(msg))
        raise KernelError(f"metalforge.cuda: {what} failed: "
                          f"{msg.value.decode() if msg.value else f'CUDA error {res}'}")


def _nvrtc_error(e: Exception) -> SyntaxError:
    msg = str(e)
    for prefix in ("Kernel compilation failed:\n",):
        msg = msg.replace(prefix, "")
    msg = re.sub(r"mf_entry_\d+\.cu", "", msg)
    lines = msg.splitlines()
    if len(lines) > 80:
        lines = lines[:80] + [f"... ({len(lines) - 80} more lines)"]
    err = SyntaxError("failed to compile Metal source for CUDA (NVRTC):\n" + "\n".join(lines))
    err.filename = SOURCE_NAME
    m = re.search(rf'{SOURCE_NAME}\((\d+)\)', msg)
    if m:
        err.lineno = int(m.group(1))
    return err


class _Module:
    """The compiled translation unit on one device: function handles by entry symbol."""

    def __init__(self, text: str, entries: tuple[Entry, ...], device: int):
        with torch.cuda.device(device):
            try:
                first = torch.cuda._compile_kernel(text, entries[0].symbol,
                                                   cuda_include_dirs=[str(INCLUDE_DIR)],
                                                   nvcc_options=list(NVRTC_OPTIONS))
            except RuntimeError as e:
                if "compilation failed" in str(e):
                    raise _nvrtc_error(e) from None
                raise
        self.module = first.module
        self.funcs = {entries[0].symbol: first.func}
        self.device = device

    def function(self, symbol: str) -> ctypes.c_void_p:
        f = self.funcs.get(symbol)
        if f is None:
            f = ctypes.c_void_p()
            _check(_libcuda().cuModuleGetFunction(ctypes.byref(f), self.module,
                                                  symbol.encode()), f"loading {symbol}")
            self.funcs[symbol] = f
        return f

    def attribute(self, symbol: str, attr: int) -> int:
        v = ctypes.c_int()
        _check(_libcuda().cuFuncGetAttribute(ctypes.byref(v), attr, self.function(symbol)),
               "cuFuncGetAttribute")
        return v.value


class Library:
    """A compiled MSL source; `lib.<host_name>` is a LibraryFunction."""

    def __init__(self, source: str):
        tr = translate(source)
        self.text = tr.text
        self._entries = {e.host_name: e for e in tr.entries}
        self._order = tr.entries
        self._modules: dict[int, _Module] = {}
        self._kernels: dict[str, LibraryFunction] = {}

    def module(self, device: int) -> _Module:
        m = self._modules.get(device)
        if m is None:
            m = self._modules[device] = _Module(self.text, self._order, device)
        return m

    def __getattr__(self, name: str) -> LibraryFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        k = self._kernels.get(name)
        if k is None:
            e = self._entries.get(name)
            if e is None:
                raise AttributeError(f"no kernel named '{name}' in this library (kernels: "
                                     f"{', '.join(self._entries)})")
            k = self._kernels[name] = LibraryFunction(self, e)
        return k

    def __dir__(self):
        return list(self._entries)


def _pack(values: list, scalar: str, ncomp: int) -> bytes:
    """The bytes of a Metal scalar/vector value (a 3-vector occupies four elements)."""
    fmt = _SCALARS[scalar][0]
    slots = 4 if ncomp == 3 else ncomp
    vals = list(values) + [0] * (slots - len(values))
    if fmt is None:                                   # bfloat
        t = torch.tensor(vals, dtype=torch.float64).to(torch.bfloat16)
        return bytes(t.view(torch.uint8).numpy())
    if fmt in "fe":
        return struct.pack(f"<{slots}{fmt}", *[float(v) for v in vals])
    size = _SCALARS[scalar][1]
    return b"".join((int(v) & ((1 << (8 * size)) - 1)).to_bytes(size, "little") for v in vals)


def _group(group_size, grid: list[int], threads, mx: int) -> list[int]:
    """The threadgroup: `group_size`, or by default as many threads as allowed along the first
    axis; at most `mx` threads in all."""
    if group_size is None:
        group = [min(grid[0], mx)] if len(grid) == 1 else [mx] + [1] * (len(grid) - 1)
    else:
        group = dims(group_size, "group_size")
        if len(group) != len(grid):
            raise RuntimeError(f"group_size {group_size!r} must have as many dimensions "
                               f"as threads {threads!r}")
    prod = 1
    for g in group:
        prod *= g
    if prod > mx:
        raise ValueError(f"Threadgroup size exceeds {mx} limit")
    return group


class _Where:
    """'kernel 'k' argument i 'name' (type)', formatted only when an error message needs it."""
    __slots__ = ("kernel", "i", "spec")

    def __init__(self, kernel: str, i: int, spec: Arg):
        self.kernel, self.i, self.spec = kernel, i, spec

    def __format__(self, spec: str) -> str:
        return (f"kernel '{self.kernel}' argument {self.i} '{self.spec.name}' "
                f"({self.spec.type_text.strip()})")


class LibraryFunction:
    """One kernel of a Library (what ``lib.<name>`` returns)."""

    def __init__(self, lib: Library, entry: Entry):
        self._lib = lib
        self._entry = entry
        self._types = [_scalar(a.elem_type) for a in entry.args]
        self._on: dict[int, tuple] = {}     # device → (function handle, max threads per group)

    def __repr__(self) -> str:
        return f"<metalforge.cuda kernel '{self._entry.host_name}'>"

    def _module(self) -> _Module:
        return self._lib.module(torch.cuda.current_device())

    def _compiled(self, device: int) -> tuple:
        """(function handle, max threads per group) on a device, compiled on first use."""
        got = self._on.get(device)
        if got is None:
            with torch.cuda.device(device):
                m = self._module()
                got = self._on[device] = (m.function(self._entry.symbol),
                                          self.max_threads_per_threadgroup)
        return got

    @property
    def max_threads_per_threadgroup(self) -> int:
        """The declared limit (1024, or [[max_total_threads_per_threadgroup(N)]]) and what the
        compiled function allows on the current device (its registers), whichever is lower."""
        m = self._module()
        return min(self._entry.max_total_threads,
                   m.attribute(self._entry.symbol, _CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK))

    @property
    def thread_execution_width(self) -> int:
        return SIMD_WIDTH

    @property
    def static_thread_group_memory_length(self) -> int:
        return self._module().attribute(self._entry.symbol, _CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)

    # -------------------------------------------------------------------- call
    def __call__(self, *args, threads=None, group_size=None, arg_casts=None):
        """Bind `args` by buffer index and launch on the current stream of their device."""
        self._check_signature(args)
        casts = cast_dtypes(arg_casts, len(args))
        dev_index = self._device(args)
        keep: list = []                  # tensors made here live until the launch is queued
        params, first_numel = self._params(args, casts, dev_index, keep)
        grid = self._grid(threads, first_numel)
        func, mx = self._compiled(dev_index)
        group = _group(group_size, grid, threads, mx)
        grid3 = (grid + [1, 1])[:3]
        group3 = (group + [1, 1])[:3]
        if any(t == 0 for t in grid3):
            return
        blocks = self._blocks(grid, group, grid3, group3, group_size)
        for t in grid3:
            params.append(ctypes.c_uint32(t))
        arr = (ctypes.c_void_p * len(params))(*[ctypes.addressof(p) for p in params])
        _check(_libcuda().cuLaunchKernel(func, *blocks, *group3, 0, _stream_handle(dev_index),
                                         arr, None),
               f"launching kernel '{self._entry.host_name}'")

    def _check_signature(self, args: tuple) -> None:
        """One argument per parameter, the parameters at buffers 0, 1, ... without gaps."""
        e = self._entry
        if len(args) != len(e.args):
            plist = ", ".join(f"{a.buffer_index}: '{a.name}' ({a.type_text.strip()})"
                              for a in e.args)
            raise TypeError(f"kernel '{e.host_name}' takes {len(e.args)} arguments ({plist}), "
                            f"got {len(args)}")
        if [a.buffer_index for a in e.args] != list(range(len(e.args))):
            raise TypeError(f"kernel '{e.host_name}': buffer indices "
                            f"{[a.buffer_index for a in e.args]} leave gaps; positional "
                            f"argument i binds buffer(i)")

    def _device(self, args: tuple) -> int:
        """The one CUDA device of the tensor arguments (the current device when none is)."""
        device = None
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.device.type == "cuda":
                if device is None:
                    device = a.device
                elif a.device != device:
                    raise TypeError(f"kernel '{self._entry.host_name}' argument {i}: on "
                                    f"{a.device}, but argument tensors before it are on {device}")
        return device.index if device is not None else torch.cuda.current_device()

    def _params(self, args: tuple, casts, dev_index: int, keep: list) -> tuple[list, int | None]:
        """(the launch parameter of each argument, the first tensor argument's numel)."""
        first_numel = None
        params: list = []
        for i, (a, spec, ty) in enumerate(zip(args, self._entry.args, self._types)):
            where = _Where(self._entry.host_name, i, spec)
            if isinstance(a, torch.Tensor) and first_numel is None:
                first_numel = a.numel()
            if spec.by_pointer:
                params.append(self._pointer(a, i, spec, ty, where, casts, dev_index, keep))
            else:
                params.append(self._value(a, i, ty, where, casts))
        return params, first_numel

    @staticmethod
    def _grid(threads, first_numel: int | None) -> list[int]:
        """The dispatchThreads grid: `threads`, else the first tensor argument's numel."""
        grid = dims(threads, "threads") if threads is not None else None
        if grid is None:
            if first_numel is None:
                raise RuntimeError("Number of threads is undefined or has wrong dimension")
            grid = [first_numel]
        return grid

    def _blocks(self, grid: list[int], group: list[int], grid3: list[int], group3: list[int],
                group_size) -> list[int]:
        """CUDA blocks covering the grid (edge blocks partial), within CUDA's grid limits."""
        if any(g == 0 for g in group3):
            raise ValueError(f"group_size {group_size!r} has a zero dimension")
        blocks = [(t + g - 1) // g for t, g in zip(grid3, group3)]
        if any(b > m for b, m in zip(blocks, _MAX_GRID)) or any(t >= 2 ** 32 for t in grid3):
            raise ValueError(f"kernel '{self._entry.host_name}': threads {grid} in groups of "
                             f"{group} need {blocks} blocks, over CUDA's grid limits "
                             f"{list(_MAX_GRID)}")
        return blocks

    def _pointer(self, a, i, spec: Arg, ty, where, casts, dev_index, keep):
        if isinstance(a, (list, tuple)):
            if not a or not all(isinstance(v, (int, float)) for v in a):
                raise RuntimeError("Unexpected argument types")
            dt = casts.get(i) or (torch.float32 if isinstance(a[0], float) else torch.int64)
            a = torch.tensor(list(a), dtype=dt, device=f"cuda:{dev_index}")
            keep.append(a)
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{where}: a pointer parameter takes a CUDA tensor, got "
                            f"{type(a).__name__}")
        if a.device.type != "cuda":
            raise TypeError(f"{where}: the CUDA backend needs CUDA tensors, got one on "
                            f"{a.device}; move it with .cuda()")
        got = DTYPE_SCALAR.get(a.dtype, "")
        if ty is not None and got and not _compatible(ty[0], got):
            raise TypeError(f"{where}: got a {a.dtype} tensor, whose elements are {got}, but "
                            f"the parameter's elements are {ty[0]}")
        return ctypes.c_void_p(a.data_ptr())

    def _value(self, a, i, ty, where, casts):
        if ty is None:
            raise TypeError(f"{where}: the CUDA backend cannot pass a value of this type")
        scalar, ncomp = ty
        if isinstance(a, torch.Tensor):
            if a.device.type != "cpu" or a.dim() != 0:
                raise TypeError(f"{where}: expects a value, got a tensor of shape "
                                f"{tuple(a.shape)} on {a.device}; pass a Python number (with "
                                f"arg_casts), or declare the parameter as a pointer")
            vals = [a.item()]
            got = DTYPE_SCALAR.get(a.dtype, "")
        else:
            vals = list(a) if isinstance(a, (list, tuple)) else [a]
            if not vals or not all(isinstance(v, (int, float)) for v in vals):
                raise RuntimeError(f"Unsupported argument type {type(a).__name__} "
                                   f"(argument {i})")
            dt = casts.get(i) or (torch.float32 if isinstance(vals[0], float) else torch.int64)
            got = CAST_SCALAR[dt]
        if not _compatible(scalar, got):
            desc = (f"a 0-dim {a.dtype} tensor" if isinstance(a, torch.Tensor) else
                    f"a list of {len(vals)} values as {got}" if isinstance(a, (list, tuple))
                    else f"a Python {type(a).__name__} (bound as {got})")
            cast = _CAST_NAME.get(scalar)
            hint = (f"; pass arg_casts={{{i}: '{cast}'}}" if cast
                    else "; pass a value of the parameter's type")
            raise TypeError(f"{where}: got {desc}, whose elements are {got}, but the "
                            f"parameter's elements are {scalar}{hint}")
        if len(vals) != ncomp:
            raise TypeError(f"{where}: expects {ncomp} value(s), got {len(vals)}")
        return ctypes.create_string_buffer(_pack(vals, scalar, ncomp), 16 if ncomp > 1 else 8)


Kernel = LibraryFunction   # the earlier name, kept for code that imports it (as metalforge.sim)


def compile_shader(source: str) -> Library:
    """Translate an MSL source for CUDA (compiled per device on first use)."""
    return Library(source)
