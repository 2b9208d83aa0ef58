"""A kernel call in compile_shader's call model, checked once and then replayed as a plan.

Everything the checks of a call depend on is in its *key* (`call_key`): per argument its kind
(a tensor's type, dtype and device, and for a tensor not on the GPU its number of dimensions;
a Python scalar's type; a list's type and its elements' types), the `threads` and
`group_size` values, `arg_casts`, and where a call depends on them the first tensor's numel
(no `threads`) or the current device (no CUDA tensor). The first call with a key runs every
check (`plan_call`, with the messages of torch.mps.compile_shader and metalforge.sim) and
returns a `Plan`; later calls with the same key passed the same checks, so they only run the
plan (`Plan.launch`), which does the work that depends on the argument *values*:

1. each parameter's value from its argument: a tensor's data pointer, a Python scalar
   converted to the parameter's type (`converter`), a list as a vector's bytes (`pack`), a
   list bound to a pointer copied to a fresh device tensor;
2. the values packed with one `struct` call into a parameter buffer laid out like the entry
   point's parameters (`Layout`: the parameters in buffer order, then the Metal grid size as
   three unsigned ints, each at its natural alignment), whose kernelParams array (a pointer per
   parameter into the buffer) is made with the buffer (the driver reads each parameter through
   its pointer, so only the slots' sizes must be right; the offsets are the ABI's as well);
3. torch's current stream on the plan's device, and cuLaunchKernel with the plan's function,
   blocks and threadgroup.

Nothing in a plan changes after it is made except its free list of parameter buffers. Thread
safety: a call takes a buffer off that list (or makes one when the list is empty), fills it,
launches and puts it back. `list.pop` and `list.append` are atomic, so a buffer belongs to one
call at a time: two threads (or a signal handler re-entering a call) never fill one buffer
while another call is launching from it. The driver copies the parameters before
cuLaunchKernel returns, so a buffer can be reused at once. (A fresh buffer per call costs more
than the launch itself; a thread-local one would be shared by a re-entrant call in the same
thread.)

Nothing here touches a GPU: the driver calls, the current stream and the compiled function
are passed in (`Driver`, `plan_call`'s `compiled`), so the plans can be tested on any machine.
"""
from __future__ import annotations

import ctypes
import operator
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional, Sequence

import torch

from ..msl.callmodel import CAST_SCALAR, DTYPE_SCALAR, cast_dtypes, grid_of, group_of
from .translate import Arg, Entry

MAX_GRID = (2 ** 31 - 1, 65535, 65535)

# Metal scalar → (struct format, byte size, is float); bfloat has no struct format (bf16_bits)
SCALARS = {"float": ("f", 4, True), "half": ("e", 2, True), "bfloat": (None, 2, True),
           "int": ("i", 4, False), "uint": ("I", 4, False), "int32_t": ("i", 4, False),
           "uint32_t": ("I", 4, False), "short": ("h", 2, False), "ushort": ("H", 2, False),
           "int16_t": ("h", 2, False), "uint16_t": ("H", 2, False), "char": ("b", 1, False),
           "uchar": ("B", 1, False), "int8_t": ("b", 1, False), "uint8_t": ("B", 1, False),
           "bool": ("?", 1, False), "long": ("q", 8, False), "ulong": ("Q", 8, False),
           "int64_t": ("q", 8, False), "uint64_t": ("Q", 8, False), "size_t": ("Q", 8, False)}
_CAST_NAME = {"half": "fp16", "bfloat": "bf16", "int": "int32", "uint": "int32",
              "short": "int16", "ushort": "int16", "char": "int8", "uchar": "uint8"}
_UNSIGNED = {1: "B", 2: "H", 4: "I", 8: "Q"}
POINTER_SIZE = 8


def scalar_type(type_name: str) -> Optional[tuple[str, int]]:
    """(scalar, components) of a Metal scalar or vector type name, else None."""
    t = type_name.replace("metal::", "").strip()
    if t in SCALARS:
        return t, 1
    m = (re.fullmatch(r"([a-z]+?)([234])", t) or
         re.fullmatch(r"vec<\s*(\w+)\s*,\s*([234])\s*>", t))
    if m and m.group(1) in SCALARS:
        return m.group(1), int(m.group(2))
    return None


def compatible(want: str, got: str) -> bool:
    """Whether data of Metal scalar `got` may bind a parameter of scalar `want`."""
    if SCALARS[want][2] or got in ("float", "half", "bfloat", "double"):
        return want == got
    return got in SCALARS and SCALARS[want][1] == SCALARS[got][1]


# --------------------------------------------------------------------------- values → bytes

def bf16_bits(v: float) -> int:
    """The bits of `v` as a bfloat16, rounded as torch rounds a Python float (to float32, then
    to nearest even; NaN is 0x7FC0)."""
    v = float(v)
    if v != v:
        return 0x7FC0
    try:
        u: int = struct.unpack("<I", struct.pack("<f", v))[0]
    except OverflowError:                   # rounds to ±inf as a float32
        return 0xFF80 if v < 0 else 0x7F80
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


def _wrap(size: int) -> Callable[[Any], int]:
    mask = (1 << (8 * size)) - 1

    def wrap(v: Any) -> int:
        """An integer as its low `size` bytes (two's complement), as a C cast wraps it."""
        return int(v) & mask
    return wrap


def converter(scalar: str) -> tuple[str, Callable[[Any], Any]]:
    """(struct code, conversion) packing one Python number as Metal scalar `scalar`: floats as
    themselves ('f', 'e'), bfloat as its bits, integers wrapped to their width, unsigned."""
    fmt, size, _ = SCALARS[scalar]
    if fmt is None:
        return "H", bf16_bits
    if fmt in "fe":
        return fmt, float
    return _UNSIGNED[size], _wrap(size)


def pack(values: Sequence[Any], scalar: str, ncomp: int) -> bytes:
    """The bytes of a Metal scalar/vector value (a 3-vector occupies four elements)."""
    code, conv = converter(scalar)
    slots = 4 if ncomp == 3 else ncomp
    vals = list(values) + [0] * (slots - len(values))
    return struct.pack(f"<{slots}{code}", *[conv(v) for v in vals])


# --------------------------------------------------------------------------- the parameter buffer

@dataclass(frozen=True)
class Slot:
    """Where one entry-point parameter lies in the parameter buffer."""
    offset: int
    size: int               # bytes (8 for a pointer; a 3-vector as four elements)
    code: str               # the struct code of its value ('Q' a pointer, 'f', 'I', '16s', ...)


@dataclass(frozen=True)
class Layout:
    """The parameter buffer of an entry point: its parameters in buffer order (a pointer or a
    value), then the Metal grid size (three unsigned ints), each at its natural alignment (a
    vector at its size, as the shim's vec<T, N>), as the entry point's parameter list."""
    slots: tuple[Slot, ...]
    size: int
    packer: struct.Struct   # every slot's value, in order, with the padding between them
    params: struct.Struct   # the parameters' slots alone (`packer` up to the grid)

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(s.offset for s in self.slots)


def slot_shape(arg: Arg, ty: Optional[tuple[str, int]]) -> Optional[tuple[int, str]]:
    """(size, struct code) of one parameter; None for a value type the backend cannot pass."""
    if arg.by_pointer:
        return POINTER_SIZE, "Q"
    if ty is None:
        return None
    scalar, ncomp = ty
    if ncomp == 1:
        return SCALARS[scalar][1], converter(scalar)[0]
    size = SCALARS[scalar][1] * (4 if ncomp == 3 else ncomp)
    return size, f"{size}s"


def layout(shapes: Sequence[tuple[int, str]]) -> Layout:
    """The buffer of parameters of these (size, struct code), then the three grid dims."""
    slots, fmt, offset = [], ["<"], 0
    params = ""
    for k, (size, code) in enumerate(list(shapes) + [(4, "I")] * 3):
        if k == len(shapes):
            params = "".join(fmt)
        start = -(-offset // size) * size            # aligned to its size
        if start > offset:
            fmt.append(f"{start - offset}x")
        fmt.append(code)
        slots.append(Slot(start, size, code))
        offset = start + size
    total = -(-offset // POINTER_SIZE) * POINTER_SIZE
    return Layout(tuple(slots), total, struct.Struct("".join(fmt)), struct.Struct(params))


# cuLaunchKernelEx's CUlaunchConfig (grid, block, shared bytes, stream, attrs, numAttrs: 56
# bytes), padded to 64 so that the parameters after it keep their 16-byte alignment
CONFIG = "<7I4xQ8xI4x8x"
CONFIG_SIZE = struct.calcsize(CONFIG)
STREAM_AT = 32                                        # CUlaunchConfig.hStream
CONFIG_DIMS = "<7I"                                   # its grid, block and shared bytes
CONFIG_TAIL = "<Q24x"                                 # from hStream on (attrs NULL, none)
assert struct.calcsize(CONFIG_DIMS) <= STREAM_AT and \
    STREAM_AT + struct.calcsize(CONFIG_TAIL) == CONFIG_SIZE


class Params:
    """One parameter buffer and its kernelParams array (a pointer to each slot); with `head`,
    the buffer starts with that many bytes (cuLaunchKernelEx's CUlaunchConfig) before the
    parameters."""
    __slots__ = ("data", "pointers")

    def __init__(self, lay: Layout, head: int = 0):
        self.data = ctypes.create_string_buffer(head + lay.size)
        base = ctypes.addressof(self.data) + head
        self.pointers = (ctypes.c_void_p * len(lay.slots))(*[base + o for o in lay.offsets])


# --------------------------------------------------------------------------- the key

class _Uncached(Exception):
    """A call whose key would not say everything its checks depend on: no plan is kept."""


def _dims_key(v: Any) -> Hashable:
    """`threads` / `group_size` as a key: None, an int or a tuple of ints, exactly (a bool or a
    float would compare equal to an int and share its plan without being checked)."""
    if v is None or type(v) is int:
        return v
    if (type(v) is list or type(v) is tuple) and all(type(x) is int for x in v):
        return tuple(v)
    raise _Uncached


def _casts_key(arg_casts: Any) -> Hashable:
    """`arg_casts` as a key: None, a str, or a dict's items, int → str exactly (a float key
    would compare equal to an int and share its plan without being checked)."""
    if arg_casts is None or type(arg_casts) is str:
        return arg_casts
    if type(arg_casts) is not dict:
        raise _Uncached
    for k, v in arg_casts.items():
        if type(k) is not int or type(v) is not str:
            raise _Uncached
    return tuple(arg_casts.items())


def call_key(args: Sequence[Any], threads: Any, group_size: Any, arg_casts: Any,
             current_device: Callable[[], int]) -> Optional[tuple[Hashable, ...]]:
    """What the checks of a call depend on, as a hashable key; None when a call is checked in
    full every time (an unusual `threads`, `group_size` or `arg_casts`). Per argument: a Python
    scalar's type; a CUDA tensor's type, dtype and device; another tensor's type, dtype,
    device and dim (a value parameter takes a 0-dim CPU tensor); a list's type and its
    elements' types (so its length); another object's type. Then `threads`, `group_size`,
    `arg_casts`, and what the grid or the device comes from when the arguments' kinds do not
    say it: the first tensor's numel when `threads` is None, the current device when no
    argument is a CUDA tensor."""
    kinds: list[Any] = []                  # each hashable
    cuda = False
    numel = None
    for a in args:
        t = type(a)
        if t is float or t is int or t is bool:
            kinds.append(t)
        elif isinstance(a, torch.Tensor):
            if a.is_cuda:
                kinds.append((t, a.dtype, a.device))
                cuda = True
            else:
                kinds.append((t, a.dtype, a.device, a.dim()))
            if threads is None and numel is None:
                numel = a.numel()
        elif t is list or t is tuple:
            kinds.append((t, *map(type, a)))
        else:
            kinds.append(t)
    try:
        key = (tuple(kinds), threads if type(threads) is int else _dims_key(threads),
               group_size if type(group_size) is int else _dims_key(group_size),
               _casts_key(arg_casts), numel, None if cuda else current_device())
    except _Uncached:
        return None
    return key


# --------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Driver:
    """The CUDA calls a plan makes: cuLaunchKernel (ctypes, no argtypes: pointers as c_void_p,
    sizes as ints), the current stream's handle on a device, the check of a result, and
    making a device's context current in a thread that has none (`library.make_context_current`)."""
    launch: Callable[..., int]
    stream: Callable[[int], Any]
    check: Callable[[int, str], None]
    make_current: Callable[[int], None] = lambda device: None
    # cuLaunchKernelEx (config, function, kernelParams, extra), where the driver has it: four
    # arguments for ctypes to convert instead of eleven (None: cuLaunchKernel)
    launch_ex: Optional[Callable[..., int]] = None


INVALID_CONTEXT = 201                                 # CUDA_ERROR_INVALID_CONTEXT


_pointer = operator.methodcaller("data_ptr")          # a tensor's data pointer


def _item(conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda a: conv(a.item())


def _first(conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda a: conv(a[0])


def _vector(scalar: str, ncomp: int) -> Callable[[Any], bytes]:
    return lambda a: pack(list(a), scalar, ncomp)


@dataclass(frozen=True)
class Plan:
    """A checked call's launch, as a function of the next call's argument values: per
    parameter a getter (argument → its value in the parameter buffer), the lists that become
    device tensors first, the buffer layout, the compiled function, and the launch geometry."""
    kernel: str                                   # host name, for messages
    device: int
    func: Any                                     # the CUfunction (a c_void_p)
    getters: tuple[Callable[[Any], Any], ...]
    lists: tuple[tuple[int, torch.dtype], ...]    # (argument, dtype) copied to the device
    layout: Layout
    grid: tuple[int, int, int]                    # the Metal grid (threads)
    blocks: tuple[int, int, int]                  # the CUDA grid (blocks), rounded up
    group: tuple[int, int, int]                   # the threadgroup (block)
    launches: bool                                # False for an empty grid
    driver: Driver
    free: list[Params] = field(default_factory=list, compare=False, repr=False)  # idle

    # the launch as straight-line Python (`run_source`): run(*args), one argument a parameter
    run: Callable[..., None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "run", self._generic if self.lists else _compile_run(self))

    def values(self, args: Sequence[Any]) -> list[Any]:
        """The value of every parameter's slot, from its argument (then come the grid's)."""
        return [g(a) for g, a in zip(self.getters, args)]

    @property
    def inlined(self) -> bool:
        """Whether `lines` gives this launch's lines (not for a plan copying lists to the
        device first: `run` it)."""
        return not self.lists

    def lines(self, args: Sequence[str], env: dict[str, Any], tag: str,
              known: Optional[dict[int, Any]] = None, pointers: Optional[dict[int, str]] = None,
              floats: frozenset[int] = frozenset()) -> Optional[list[str]]:
        """This launch as lines of Python for the caller's own function (`launch_lines`, what
        the caller knows of the arguments as `Bound`'s fields), or None where it has none
        (`inlined`)."""
        if not self.inlined:
            return None
        return launch_lines(self, args, env, tag, Bound(known or {}, pointers or {}, floats))

    def launch(self, args: Sequence[Any]) -> None:
        """Launch with these arguments (of this plan's key): their values packed into an idle
        parameter buffer (one taken off `free`, or a new one), then cuLaunchKernel (or
        cuLaunchKernelEx, with the launch configuration at the buffer's start) on the current
        stream; the buffer goes back to `free` (which keeps at most 4)."""
        self.run(*args)

    def _generic(self, *args: Any) -> None:
        """`launch` of a plan with lists bound to pointers: each copied to a device tensor
        first (kept alive until the launch is queued), then cuLaunchKernel."""
        args_ = list(args)
        for i, dt in self.lists:
            args_[i] = list_tensor(args_[i], dt, self.device)
        vals = self.values(args_)
        try:
            buf = self.free.pop()
        except IndexError:
            buf = Params(self.layout)
        self.layout.packer.pack_into(buf.data, 0, *vals, *self.grid)
        if self.launches:
            d = self.driver
            res = d.launch(self.func, *self.blocks, *self.group, 0,
                           ctypes.c_void_p(d.stream(self.device)), buf.pointers, None)
            if res:
                relaunch(self, False, res, buf)
        if len(self.free) < 4:
            self.free.append(buf)


def relaunch(p: Plan, ex: bool, res: int, buf: Params) -> None:
    """After a launch that returned `res` (not 0): a thread with no current context yet gets
    the device's and launches again; any other error (or a second failure) raises."""
    d = p.driver
    if res == INVALID_CONTEXT:
        d.make_current(p.device)
        stream = d.stream(p.device)
        if ex:
            assert d.launch_ex is not None
            struct.pack_into("<Q", buf.data, STREAM_AT, stream)
            res = d.launch_ex(buf.data, p.func, buf.pointers, None)
        else:
            res = d.launch(p.func, *p.blocks, *p.group, 0, ctypes.c_void_p(stream),
                           buf.pointers, None)
    if res:
        d.check(res, f"launching kernel '{p.kernel}'")


def run_source(p: Plan) -> tuple[str, dict[str, Any]]:
    """A plan's launch as straight-line Python, and the names it reads: `run(a0, a1, ...)`,
    one argument a parameter, whose body is `launch_lines`."""
    env: dict[str, Any] = {}
    args = [f"a{i}" for i in range(len(p.getters))]
    lines = [f"def run({', '.join(args)}):", *launch_lines(p, args, env)]
    return "\n".join(lines) + "\n", env


@dataclass(frozen=True)
class Bound:
    """What the caller of `launch_lines` knows of the arguments, by argument index: `known`,
    values that are the same on every call (converted once, not on every call); `pointers`,
    expressions of tensors' data pointers it has already taken; `floats`, arguments that are
    Python floats already (a float parameter's conversion, `float`, is skipped)."""
    known: dict[int, Any] = field(default_factory=dict)
    pointers: dict[int, str] = field(default_factory=dict)
    floats: frozenset[int] = frozenset()


def launch_lines(p: Plan, args: Sequence[str], env: dict[str, Any], tag: str = "",
                 bound: Optional[Bound] = None) -> list[str]:
    """The lines of a plan's launch (four-space indented), with the arguments given as Python
    expressions (`args`, one a parameter), for a caller to put in its own function (the warm
    call's replay inlines them: no call into `run`): take an idle parameter buffer (a new
    one has the grid and launch configuration written: `configured`), pack the arguments'
    values (a tensor's data pointer, a scalar through its getter) with one `pack_into` (with
    cuLaunchKernelEx, after the current stream), launch, give the buffer back. The names
    they read go in `env`, suffixed with `tag` (several plans in one function); `bound`: what
    the caller knows of the arguments (`Bound`)."""
    d = p.driver
    ex = d.launch_ex is not None and p.launches
    # the grid (and with cuLaunchKernelEx the configuration's dimensions) is packed once, into
    # each new buffer; a call packs the parameters (from the stream on: the attributes after
    # it NULL, none)
    packer = struct.Struct(CONFIG_TAIL + p.layout.params.format[1:]) if ex else p.layout.params
    t = tag
    env.update({
        f"_pop{t}": p.free.pop, f"_push{t}": p.free.append, f"_free{t}": p.free,
        f"_func{t}": p.func, f"_new{t}": lambda: configured(p, ex),
        f"_pack{t}": packer.pack_into, f"_stream{t}": d.stream, "_vp": ctypes.c_void_p,
        f"_launch{t}": d.launch_ex if ex else d.launch,
        f"_relaunch{t}": lambda res, buf: relaunch(p, ex, res, buf)})
    b = bound or Bound()
    values = []
    for i, (g, a) in enumerate(zip(p.getters, args)):
        if g is _pointer:
            values.append(b.pointers.get(i, f"{a}.data_ptr()"))
        elif i in b.known:
            env[f"_k{t}_{i}"] = g(b.known[i])
            values.append(f"_k{t}_{i}")
        elif g is float and i in b.floats:
            values.append(a)
        else:
            env[f"_g{t}_{i}"] = g
            values.append(f"_g{t}_{i}({a})")
    at, config = (STREAM_AT, [f"_stream{t}({p.device})"]) if ex else (0, [])
    lines = ["    try:", f"        buf = _pop{t}()", "    except IndexError:",
             f"        buf = _new{t}()",
             f"    _pack{t}(buf.data, {at}, {', '.join(config + values)})"]
    if ex:
        lines.append(f"    res = _launch{t}(buf.data, _func{t}, buf.pointers, None)")
    elif p.launches:
        dims = ", ".join(map(str, (*p.blocks, *p.group)))
        lines.append(f"    res = _launch{t}(_func{t}, {dims}, 0, _vp(_stream{t}({p.device})), "
                     f"buf.pointers, None)")
    if p.launches:
        lines += ["    if res:", f"        _relaunch{t}(res, buf)"]
    lines += [f"    if len(_free{t}) < 4:", f"        _push{t}(buf)"]
    return lines


def configured(p: Plan, ex: bool) -> Params:
    """A new parameter buffer of `p` (for cuLaunchKernelEx: after the launch configuration)
    with what is the same on every launch of the plan written: the Metal grid after the
    parameters, and with `ex` the configuration's dimensions and shared bytes."""
    head = CONFIG_SIZE if ex else 0
    buf = Params(p.layout, head)
    if ex:
        struct.pack_into(CONFIG_DIMS, buf.data, 0, *p.blocks, *p.group, 0)
    struct.pack_into("<3I", buf.data, head + p.layout.slots[-3].offset, *p.grid)
    return buf


def _compile_run(p: Plan) -> Callable[..., None]:
    text, env = run_source(p)
    exec(compile(text, f"<metalforge.cuda launch of '{p.kernel}'>", "exec"), env)  # noqa: S102
    run: Callable[..., None] = env["run"]
    return run


def list_tensor(a: Sequence[Any], dtype: torch.dtype, device: int) -> torch.Tensor:
    """A list bound to a pointer parameter, copied to the device."""
    if not a or not all(isinstance(v, (int, float)) for v in a):
        raise RuntimeError("Unexpected argument types")
    return torch.tensor(list(a), dtype=dtype, device=f"cuda:{device}")


class _ArgName:
    """'kernel 'k' argument i 'name' (type)', formatted only when an error message needs it."""
    __slots__ = ("kernel", "i", "spec")

    def __init__(self, kernel: str, i: int, spec: Arg):
        self.kernel, self.i, self.spec = kernel, i, spec

    def __format__(self, spec: str) -> str:
        return (f"kernel '{self.kernel}' argument {self.i} '{self.spec.name}' "
                f"({self.spec.type_text.strip()})")


def check_signature(entry: Entry, args: Sequence[Any]) -> None:
    """One argument per parameter, the parameters at buffers 0, 1, ... without gaps."""
    e = entry
    if len(args) != len(e.args):
        plist = ", ".join(f"{a.buffer_index}: '{a.name}' ({a.type_text.strip()})"
                          for a in e.args)
        raise TypeError(f"kernel '{e.host_name}' takes {len(e.args)} arguments ({plist}), "
                        f"got {len(args)}")
    if [a.buffer_index for a in e.args] != list(range(len(e.args))):
        raise TypeError(f"kernel '{e.host_name}': buffer indices "
                        f"{[a.buffer_index for a in e.args]} leave gaps; positional "
                        f"argument i binds buffer(i)")


def call_device(entry: Entry, args: Sequence[Any], current_device: Callable[[], int]) -> int:
    """The one CUDA device of the tensor arguments (the current device when none is)."""
    device = None
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.device.type == "cuda":
            if device is None:
                device = a.device
            elif a.device != device:
                raise TypeError(f"kernel '{entry.host_name}' argument {i}: on "
                                f"{a.device}, but argument tensors before it are on {device}")
    return device.index if device is not None else current_device()


def pointer_getter(a: Any, i: int, ty: Optional[tuple[str, int]], where: _ArgName,
                   casts: dict[int, torch.dtype]
                   ) -> tuple[Callable[[Any], Any], Optional[torch.dtype]]:
    """(getter, dtype a list is copied to the device as, or None) of a pointer parameter."""
    list_dtype = None
    if isinstance(a, (list, tuple)):
        if not a or not all(isinstance(v, (int, float)) for v in a):
            raise RuntimeError("Unexpected argument types")
        list_dtype = casts.get(i) or (torch.float32 if isinstance(a[0], float) else torch.int64)
        dtype, device_type = list_dtype, "cuda"
    elif isinstance(a, torch.Tensor):
        dtype, device_type = a.dtype, a.device.type
    else:
        raise TypeError(f"{where}: a pointer parameter takes a CUDA tensor, got "
                        f"{type(a).__name__}")
    if device_type != "cuda":
        raise TypeError(f"{where}: the CUDA backend needs CUDA tensors, got one on "
                        f"{a.device}; move it with .cuda()")
    got = DTYPE_SCALAR.get(dtype, "")
    if ty is not None and got and not compatible(ty[0], got):
        raise TypeError(f"{where}: got a {dtype} tensor, whose elements are {got}, but "
                        f"the parameter's elements are {ty[0]}")
    return _pointer, list_dtype


def value_getter(a: Any, i: int, ty: Optional[tuple[str, int]], where: _ArgName,
                 casts: dict[int, torch.dtype]) -> Callable[[Any], Any]:
    """The getter of a value parameter (`constant T&` or by value), after its checks."""
    if ty is None:
        raise TypeError(f"{where}: the CUDA backend cannot pass a value of this type")
    scalar, ncomp = ty
    if isinstance(a, torch.Tensor):
        if a.device.type != "cpu" or a.dim() != 0:
            raise TypeError(f"{where}: expects a value, got a tensor of shape "
                            f"{tuple(a.shape)} on {a.device}; pass a Python number (with "
                            f"arg_casts), or declare the parameter as a pointer")
        n = 1
        got = DTYPE_SCALAR.get(a.dtype, "")
    else:
        vals = list(a) if isinstance(a, (list, tuple)) else [a]
        if not vals or not all(isinstance(v, (int, float)) for v in vals):
            raise RuntimeError(f"Unsupported argument type {type(a).__name__} "
                               f"(argument {i})")
        n = len(vals)
        dt = casts.get(i) or (torch.float32 if isinstance(vals[0], float) else torch.int64)
        got = CAST_SCALAR[dt]
    if not compatible(scalar, got):
        desc = (f"a 0-dim {a.dtype} tensor" if isinstance(a, torch.Tensor) else
                f"a list of {n} values as {got}" if isinstance(a, (list, tuple))
                else f"a Python {type(a).__name__} (bound as {got})")
        cast = _CAST_NAME.get(scalar)
        hint = (f"; pass arg_casts={{{i}: '{cast}'}}" if cast
                else "; pass a value of the parameter's type")
        raise TypeError(f"{where}: got {desc}, whose elements are {got}, but the "
                        f"parameter's elements are {scalar}{hint}")
    if n != ncomp:
        raise TypeError(f"{where}: expects {ncomp} value(s), got {n}")
    if ncomp > 1:
        return _vector(scalar, ncomp)
    conv = converter(scalar)[1]
    if isinstance(a, torch.Tensor):
        return _item(conv)
    return _first(conv) if isinstance(a, (list, tuple)) else conv


def blocks_of(kernel: str, grid: list[int], group: list[int], grid3: list[int],
              group3: list[int], group_size: Any) -> list[int]:
    """CUDA blocks covering the grid (edge blocks partial), within CUDA's grid limits."""
    if any(g == 0 for g in group3):
        raise ValueError(f"group_size {group_size!r} has a zero dimension")
    blocks = [(t + g - 1) // g for t, g in zip(grid3, group3)]
    if any(b > m for b, m in zip(blocks, MAX_GRID)) or any(t >= 2 ** 32 for t in grid3):
        raise ValueError(f"kernel '{kernel}': threads {grid} in groups of "
                         f"{group} need {blocks} blocks, over CUDA's grid limits "
                         f"{list(MAX_GRID)}")
    return blocks


def _one_d(grid: list[int], group_size: Any) -> bool:
    """Whether a dispatch is 1-D (grid and threadgroup), so the 1-D unit may run it. A
    group_size that is not a list of ints is left to `group_of`'s error."""
    if any(g != 1 for g in grid[1:]):
        return False
    if group_size is None or isinstance(group_size, int):
        return True
    return isinstance(group_size, (list, tuple)) and all(
        isinstance(g, int) and g == 1 for g in list(group_size)[1:])


def plan_call(entry: Entry, args: Sequence[Any], threads: Any, group_size: Any,
              arg_casts: Any, *, compiled: Callable[[int, bool], tuple[Any, int]],
              current_device: Callable[[], int], driver: Driver) -> Plan:
    """Every check of a call (raising what torch.mps.compile_shader / metalforge.sim raise for
    bad input), then its plan. `compiled(device, one_d)` is (function handle, max threads per
    threadgroup) on a device, of the unit for 1-D dispatches or of the one for any grid."""
    check_signature(entry, args)
    casts = cast_dtypes(arg_casts, len(args))
    device = call_device(entry, args, current_device)
    types = [scalar_type(a.elem_type) for a in entry.args]
    getters, lists, shapes = [], [], []
    first_numel = None
    for i, (a, spec, ty) in enumerate(zip(args, entry.args, types)):
        where = _ArgName(entry.host_name, i, spec)
        if isinstance(a, torch.Tensor) and first_numel is None:
            first_numel = a.numel()
        if spec.by_pointer:
            g, list_dtype = pointer_getter(a, i, ty, where, casts)
            if list_dtype is not None:
                lists.append((i, list_dtype))
        else:
            g = value_getter(a, i, ty, where, casts)
        shape = slot_shape(spec, ty)
        assert shape is not None                  # value_getter refused the others
        if not spec.by_pointer:                   # packs (or raises) in argument order,
            struct.pack("<" + shape[1], g(a))     # before the grid's checks, as always
        getters.append(g)
        shapes.append(shape)
    grid = grid_of(threads, first_numel)
    func, mx = compiled(device, _one_d(grid, group_size))
    group = group_of(group_size, grid, threads, mx)
    grid3 = (grid + [1, 1])[:3]
    group3 = (group + [1, 1])[:3]
    launches = all(t != 0 for t in grid3)
    blocks = (blocks_of(entry.host_name, grid, group, grid3, group3, group_size) if launches
              else [0, 0, 0])
    return Plan(entry.host_name, device, func, tuple(getters), tuple(lists), layout(shapes),
                (grid3[0], grid3[1], grid3[2]), (blocks[0], blocks[1], blocks[2]),
                (group3[0], group3[1], group3[2]), launches, driver)


def plan_unchecked(entry: Entry, args: Sequence[Any], threads: int, group_size: int,
                   arg_casts: Any, func: Any, driver: Driver) -> Plan:
    """A 1-D plan of `args` (tensors of any device: their pointers only) for function handle
    `func` on `driver`, without `plan_call`'s checks or a compiled module: what a host-cost
    measurement or a test that records launches drives through a fake driver."""
    casts = cast_dtypes(arg_casts, len(args))
    getters, shapes = [], []
    for i, (a, spec) in enumerate(zip(args, entry.args)):
        ty = scalar_type(spec.elem_type)
        getters.append(_pointer if spec.by_pointer else
                       value_getter(a, i, ty, _ArgName(entry.host_name, i, spec), casts))
        shape = slot_shape(spec, ty)
        assert shape is not None
        shapes.append(shape)
    return Plan(entry.host_name, 0, func, tuple(getters), (), layout(shapes), (threads, 1, 1),
                (-(-threads // group_size), 1, 1), (group_size, 1, 1), True, driver)
