"""The CUDA backend's call plans (metalforge/cuda/call.py), on any machine (no GPU needed): the
driver is a fake that reads back the parameter buffer it is handed, and CUDA tensors are
stand-ins with a device, a dtype, a shape and a data pointer. What is checked: the packed
bytes of every scalar and vector type (against struct.pack, bfloat against torch), the buffer
layout (aligned slots; the shim's own sizes and alignments, through the host C++ compiler), the
call key (what changes it), that a kernel's cached plan serves only calls with its key, that
bad input raises the same error warm as cold, and that concurrent calls never share a buffer."""
import ctypes
import math
import re
import shutil
import struct
import subprocess
import threading
import time

import pytest
import torch

from metalforge import cuda as mfcuda
from metalforge.cuda import call as C
from metalforge.cuda import library
from metalforge.cuda.library import INCLUDE_DIR
from metalforge.cuda.translate import Arg, Entry, translate


class FakeCuda(torch.Tensor):
    """A CUDA tensor without a GPU: device, dtype, shape and a chosen data pointer (no data)."""

    @staticmethod
    def __new__(cls, shape, dtype=torch.float32, index=0, ptr=0x7F0000001000):
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype,
                                                device=torch.device("cuda", index))
        t.ptr = ptr
        return t

    def data_ptr(self):
        return self.ptr

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"FakeCuda has no data ({func})")


class FakeDriver:
    """cuLaunchKernel that records each launch: function, blocks, group, stream and the bytes
    of each slot of the parameter buffer (read through the kernelParams array it is given)."""

    def __init__(self, sizes=None, pause=0.0, ex=False):
        self.ex = ex                        # also cuLaunchKernelEx (the plans use it)
        self.results = []                   # what the next launches return (then 0)
        self.made_current = []              # devices whose context a launch made current
        self.launches = []
        self.pause = pause
        self.lock = threading.Lock()

    def launch(self, func, bx, by, bz, gx, gy, gz, shared, stream, params, extra):
        assert extra is None and shared == 0
        if self.pause:
            time.sleep(self.pause)          # lets other threads run between fill and launch
        n = len(params)
        base = params[0]
        raw = ctypes.string_at(base, params[n - 1] - base + 4)
        offsets = [params[k] - base for k in range(n)]
        with self.lock:
            self.launches.append(dict(func=func.value, blocks=(bx, by, bz), group=(gx, gy, gz),
                                      stream=stream.value, raw=raw, offsets=offsets,
                                      thread=threading.current_thread().name))
            return self.results.pop(0) if self.results else 0

    def launch_ex(self, config, func, params, extra):
        """cuLaunchKernelEx: the launch configuration read back from the buffer's start."""
        raw = ctypes.string_at(ctypes.addressof(config), C.CONFIG_SIZE)
        *dims, shared, stream, attrs = struct.unpack(C.CONFIG, raw)
        assert raw[40:48] == bytes(8) and attrs == 0           # attrs NULL, numAttrs 0
        return self.launch(func, *dims, shared, ctypes.c_void_p(stream), params, extra)

    def driver(self):
        return C.Driver(self.launch, lambda device: 0x5000 + device, self.check,
                        self.made_current.append, self.launch_ex if self.ex else None)

    @staticmethod
    def check(res, what):
        raise AssertionError(f"{what}: {res}")

    def slot(self, launch, k, size):
        off = launch["offsets"][k]
        return launch["raw"][off:off + size]


def compiled(device, one_d=True):
    """A made-up handle: 0xF000 + device for the 1-D unit, 0xF100 + device for any grid's."""
    return ctypes.c_void_p(0xF000 + device + (0 if one_d else 0x100)), 1024


def make_plan(entry, args, threads=1, group_size=None, arg_casts=None, fake=None):
    fake = fake or FakeDriver()
    return C.plan_call(entry, args, threads, group_size, arg_casts, compiled=compiled,
                       current_device=lambda: 0, driver=fake.driver()), fake


def value_entry(*types):
    """An entry point taking one value parameter of each Metal type."""
    return Entry("k", "mf_entry_0", tuple(Arg(i, f"p{i}", f"constant {t}&", t, False)
                                          for i, t in enumerate(types)), 1024)


def launched_bytes(entry, args, arg_casts=None):
    plan, fake = make_plan(entry, args, arg_casts=arg_casts)
    plan.launch(args)
    (launch,) = fake.launches
    return [fake.slot(launch, k, s.size) for k, s in enumerate(plan.layout.slots)]


# --------------------------------------------------------------------------- packed bytes

_CAST_OF_SIZE = {1: "int8", 2: "int16", 4: "int32", 8: None}
_INT_VALUES = [0, 1, -1, 5, -128, 127, 255, 256, 2 ** 15, -2 ** 15 - 1, 2 ** 31 - 1, 2 ** 31,
               -2 ** 31, 2 ** 32 + 7, 2 ** 63 - 1, -2 ** 63, 2 ** 64 - 1]
_FLOAT_VALUES = [0.0, -0.0, 1.0, -2.5, 1e-3, 3.14159265358979, 65504.0, 1e-8, 6.1e-5, 1e30,
                 -1e-30, math.inf, -math.inf, math.nan, 2.0 ** -24]
INT_TYPES = [t for t, (fmt, _, is_float) in C.SCALARS.items() if not is_float]


@pytest.mark.parametrize("ty", INT_TYPES)
def test_integer_scalars_pack_as_struct_does(ty):
    fmt, size, _ = C.SCALARS[ty]
    cast = _CAST_OF_SIZE[size]
    for v in _INT_VALUES:
        (got, *grid) = launched_bytes(value_entry(ty), (v,),
                                      arg_casts={0: cast} if cast else None)
        want = struct.pack("<" + fmt.upper(), v & ((1 << (8 * size)) - 1)) if fmt != "?" \
            else bytes([v & 0xFF])
        assert got == want, (ty, v)
        assert grid == [struct.pack("<I", 1), struct.pack("<I", 1), struct.pack("<I", 1)]
    # a 0-dim CPU tensor binds by value too
    dt = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    (got, *_) = launched_bytes(value_entry(ty), (torch.tensor(-3, dtype=dt),))
    assert got == (-3 & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


@pytest.mark.parametrize("ty,fmt,cast", [("float", "f", None), ("half", "e", "fp16")])
def test_float_scalars_pack_as_struct_does(ty, fmt, cast):
    for v in _FLOAT_VALUES:
        if fmt == "e" and abs(v) > 65504 and not math.isinf(v):
            continue                                # struct refuses those (as it does cold)
        (got, *_) = launched_bytes(value_entry(ty), (v,), arg_casts={0: cast} if cast else None)
        assert got == struct.pack("<" + fmt, v), (ty, v)
    (got, *_) = launched_bytes(value_entry(ty), (torch.tensor(0.375, dtype=torch.float32
                                                               if ty == "float" else
                                                               torch.float16),))
    assert got == struct.pack("<" + fmt, 0.375)


def _torch_bf16(v):
    return torch.tensor([v], dtype=torch.float64).to(torch.bfloat16).view(torch.int16).item() \
        & 0xFFFF


def test_bfloat_packs_as_torch_rounds():
    edge = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -40, 3.3961e38, 3.4e38, 1e39,
            -1e39, 1e-40, 5e-324, -0.0, math.inf, -math.inf, math.nan]
    g = torch.Generator().manual_seed(0)
    rand = (torch.randn(2000, generator=g, dtype=torch.float64) *
            10 ** torch.randint(-40, 39, (2000,), generator=g).double()).tolist()
    for v in edge + _FLOAT_VALUES + rand:
        assert C.bf16_bits(v) == _torch_bf16(v), v
        (got, *_) = launched_bytes(value_entry("bfloat"), (v,), arg_casts={0: "bf16"})
        assert got == struct.pack("<H", _torch_bf16(v)), v


VECTORS = [(s, n) for s in ["float", "half", "bfloat", "int", "uint", "short", "ushort", "char",
                            "uchar"] for n in (2, 3, 4)]


@pytest.mark.parametrize("scalar,n", VECTORS, ids=lambda v: str(v))
def test_vectors_pack_as_struct_does(scalar, n):
    fmt, size, is_float = C.SCALARS[scalar]
    vals = [1.5, -2.25, 1e-3, 7.0][:n] if is_float else [1, -2, 300, 2 ** 31 + 5][:n]
    cast = {"half": "fp16", "bfloat": "bf16"}.get(scalar) if is_float else _CAST_OF_SIZE[size]
    (got, *_) = launched_bytes(value_entry(f"{scalar}{n}"), (vals,),
                               arg_casts={0: cast} if cast else None)
    padded = vals + [0] * (4 - n if n == 3 else 0)         # a 3-vector takes four elements
    if scalar == "bfloat":
        want = struct.pack(f"<{len(padded)}H", *[_torch_bf16(v) for v in padded])
    elif is_float:
        want = struct.pack(f"<{len(padded)}{fmt}", *padded)
    else:
        want = struct.pack(f"<{len(padded)}{fmt.upper()}",
                           *[v & ((1 << (8 * size)) - 1) for v in padded])
    assert got == want


# --------------------------------------------------------------------------- layout

MIXED = ("#include <metal_stdlib>\nusing namespace metal;\n"
         "kernel void mixed(constant char& a [[buffer(0)]], device float* p [[buffer(1)]],\n"
         "    constant half& b [[buffer(2)]], constant float3& c [[buffer(3)]],\n"
         "    constant short& d [[buffer(4)]], device const half* q [[buffer(5)]],\n"
         "    constant long& e [[buffer(6)]], constant uchar& f [[buffer(7)]],\n"
         "    constant half2& g [[buffer(8)]], constant bool& h [[buffer(9)]],\n"
         "    device uint& r [[buffer(10)]], constant bfloat4& i [[buffer(11)]],\n"
         "    constant uint& j [[buffer(12)]], constant ushort3& k [[buffer(13)]],\n"
         "    constant char2& m [[buffer(14)]],\n"
         "    uint tid [[thread_position_in_grid]]) {\n"
         "    if (tid == 0) p[0] = float(a) + float(b) + c.x + float(d) + float(q[0]);\n}\n")


def _mixed_layout():
    (e,) = translate(MIXED).entries
    types = [C.scalar_type(a.elem_type) for a in e.args]
    return e, C.layout([C.slot_shape(a, t) for a, t in zip(e.args, types)])


def test_slots_are_aligned_and_disjoint():
    e, lay = _mixed_layout()
    assert len(lay.slots) == len(e.args) + 3
    end = 0
    for arg, s in zip(list(e.args) + [None] * 3, lay.slots):
        assert s.offset >= end                          # in order, not overlapping
        assert s.offset % s.size == 0                   # at its natural alignment
        if arg is not None and arg.by_pointer:
            assert s.size == 8 and s.code == "Q" and s.offset % 8 == 0
        end = s.offset + s.size
    assert [s.code for s in lay.slots[-3:]] == ["I"] * 3
    assert lay.size >= end and lay.size % 8 == 0
    assert lay.packer.size == end                       # the struct spans exactly the slots
    assert [s.size for s in lay.slots[:len(e.args)]] == [1, 8, 2, 16, 2, 8, 8, 1, 4, 1, 8, 8,
                                                         4, 8, 2]


def test_slots_match_the_shim_types(tmp_path):
    """The entry point's parameter types, as the host C++ compiler lays them out with the CUDA
    shim: each slot's size and alignment is sizeof/alignof of that parameter."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    tr = translate(MIXED)
    e, lay = _mixed_layout()
    decls = re.findall(r"(::mf_cuda::\w+<mf_F_0, \d+>) mf_a\d+", tr.text)
    assert len(decls) == len(e.args)
    checks = [f"static_assert(sizeof({d}) == {s.size} && alignof({d}) == {s.size}, "
              f"\"slot {k}\");" for k, (d, s) in enumerate(zip(decls, lay.slots))]
    f = tmp_path / "tu.cu"
    f.write_text(tr.text + "\n" + "\n".join(checks) + "\n")
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-DMF_CUDA_HOST_CHECK",
                        f"-I{INCLUDE_DIR}", "-x", "c++", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:4000]


def test_mixed_parameters_land_in_their_slots():
    e, lay = _mixed_layout()
    p, q, r = FakeCuda((4,), ptr=0x1111222233334444), FakeCuda((4,), torch.float16, ptr=8), \
        FakeCuda((1,), torch.int32, ptr=2 ** 64 - 8)
    args = (-3, p, 0.5, [1.0, 2.0, 3.0], 7, q, -2 ** 40, 200, [0.25, 4.0], True, r,
            [1.0, 2.0, 3.0, 4.0], 2 ** 32 - 1, [1, 2, 3], [-1, 5])
    casts = {0: "int8", 2: "fp16", 4: "int16", 7: "uint8", 8: "fp16", 9: "int8", 11: "bf16",
             12: "int32", 13: "int16", 14: "int8"}
    got = launched_bytes(e, args, arg_casts=casts)
    bf = [_torch_bf16(v) for v in (1.0, 2.0, 3.0, 4.0)]
    assert got == [b"\xfd", struct.pack("<Q", 0x1111222233334444), struct.pack("<e", 0.5),
                   struct.pack("<4f", 1, 2, 3, 0), struct.pack("<h", 7), struct.pack("<Q", 8),
                   struct.pack("<q", -2 ** 40), b"\xc8", struct.pack("<2e", 0.25, 4.0), b"\x01",
                   struct.pack("<Q", 2 ** 64 - 8), struct.pack("<4H", *bf),
                   struct.pack("<I", 2 ** 32 - 1), struct.pack("<4H", 1, 2, 3, 0),
                   struct.pack("<2b", -1, 5), *[struct.pack("<I", 1)] * 3]


# --------------------------------------------------------------------------- the key

def key(args, threads=64, group_size=32, arg_casts=None, device=0):
    return C.call_key(args, threads, group_size, arg_casts, lambda: device)


def test_key_changes_with_each_kind():
    x, w = FakeCuda((8, 8)), FakeCuda((8,))
    base = key((x, w, 1.0, 3), arg_casts={3: "int32"})
    assert base is not None and hash(base) is not None
    assert key((FakeCuda((8, 8), ptr=99), FakeCuda((8,), ptr=5), 2.5, 9),
               arg_casts={3: "int32"}) == base                 # values are not in the key
    variants = [
        key((FakeCuda((8, 8), torch.float16), w, 1.0, 3), arg_casts={3: "int32"}),   # dtype
        key((FakeCuda((8, 8), index=1), w, 1.0, 3), arg_casts={3: "int32"}),   # device index
        key((x, w, 1, 3), arg_casts={3: "int32"}),                      # scalar type
        key((x, w, True, 3), arg_casts={3: "int32"}),
        key((x, w, torch.tensor(1.0), 3), arg_casts={3: "int32"}),      # a 0-dim tensor
        key((x, w, [1.0], 3), arg_casts={3: "int32"}),                  # a list
        key((x, w, 1.0, 3), arg_casts={3: "int16"}),                    # arg_casts
        key((x, w, 1.0, 3), arg_casts={2: "int32"}),
        key((x, w, 1.0, 3), arg_casts="int32"),
        key((x, w, 1.0, 3)),
        key((x, w, 1.0, 3), threads=65, arg_casts={3: "int32"}),        # threads
        key((x, w, 1.0, 3), threads=[64], arg_casts={3: "int32"}),
        key((x, w, 1.0, 3), threads=[64, 1], arg_casts={3: "int32"}),
        key((x, w, 1.0, 3), threads=None, arg_casts={3: "int32"}),
        key((x, w, 1.0, 3), group_size=64, arg_casts={3: "int32"}),     # group_size
        key((x, w, 1.0, 3), group_size=None, arg_casts={3: "int32"}),
        key((x, w, 1.0), arg_casts={3: "int32"}),                       # argument count
        key((x, w, 1.0, 3, 3), arg_casts={3: "int32"}),
    ]
    assert all(v is not None and v != base for v in variants)
    assert len(set(variants)) == len(variants)
    assert key([2.0, 3], threads=4) != key([2.0, 3], threads=4, device=1)   # no CUDA tensor
    assert key([x, [1, 2]]) != key([x, [1, 2, 3]]) != key([x, [1, 2.0, 3]])
    assert key([w], threads=None) != key([x], threads=None)         # first numel (no threads)
    assert key([torch.ones(())]) != key([torch.ones(1)])            # a CPU tensor's dims
    assert key((w, x, 1.0, 3)) == key((x, w, 1.0, 3))     # a CUDA tensor's shape is not checked


def test_key_refuses_values_equal_to_an_int():
    """A bool or float equal to an int would share its plan: such calls are checked each time."""
    x = FakeCuda((8,))
    for kw in [dict(threads=True), dict(threads=64.0), dict(threads=[64, True]),
               dict(group_size=32.0), dict(group_size=(True,)), dict(arg_casts={3.0: "int32"}),
               dict(arg_casts={True: "int32"}), dict(arg_casts={3: ["int32"]}),
               dict(arg_casts=["int32"]), dict(threads=[[64]])]:
        assert key((x, 3), **kw) is None, kw


# --------------------------------------------------------------------------- kernels

AXPY = """
#include <metal_stdlib>
using namespace metal;
kernel void axpy(device float* y [[buffer(0)]], device const float* x [[buffer(1)]],
                 constant float& a [[buffer(2)]], constant uint& n [[buffer(3)]],
                 constant half2& v [[buffer(4)]], uint i [[thread_position_in_grid]]) {
    if (i < n) y[i] = a * x[i] + y[i] + float(v.x);
}"""


@pytest.fixture(params=[False, True], ids=["cuLaunchKernel", "cuLaunchKernelEx"])
def fake(monkeypatch, request):
    """A fake driver behind every metalforge.cuda kernel (compiled: a made-up handle, 1024
    threads a group), with device 0 current; the plans launch through cuLaunchKernel, or
    through cuLaunchKernelEx where the driver has it."""
    f = FakeDriver(ex=request.param)
    monkeypatch.setattr(library, "driver", f.driver)
    monkeypatch.setattr(library.CudaFunction, "_compiled",
                        lambda self, dev, one_d: compiled(dev, one_d))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return f


def axpy():
    return mfcuda.compile_shader(AXPY).axpy


GOOD = dict(threads=10, group_size=4, arg_casts={3: "int32", 4: "fp16"})


def good_args(a=2.0, n=10, dtype=torch.float32, index=0, ptr=0x1000):
    return (FakeCuda((n,), dtype, index, ptr), FakeCuda((n,), dtype, index, ptr + 0x100), a, n,
            [1.0, 0.5])


def test_a_warm_call_replays_the_plan_with_its_own_values(fake):
    k = axpy()
    k(*good_args(), **GOOD)
    (plan,) = k._plans._entries.values()
    k(*good_args(a=-7.5, n=33, ptr=0x9000), **GOOD)
    assert list(k._plans._entries.values()) == [plan]                # no new plan
    first, second = fake.launches
    for launch, (y, x, a, n) in [(first, (0x1000, 0x1100, 2.0, 10)),
                                 (second, (0x9000, 0x9100, -7.5, 33))]:
        assert [fake.slot(launch, i, s) for i, s in enumerate([8, 8, 4, 4])] == [
            struct.pack("<Q", y), struct.pack("<Q", x), struct.pack("<f", a),
            struct.pack("<I", n)]
        assert launch["func"] == 0xF000 and launch["stream"] == 0x5000
        assert launch["blocks"] == (3, 1, 1) and launch["group"] == (4, 1, 1)


def test_a_cached_plan_serves_only_its_key(fake):
    k = axpy()
    k(*good_args(), **GOOD)
    k(*good_args(index=1), **GOOD)                        # another device: its own plan
    assert fake.launches[-1]["func"] == 0xF001 and fake.launches[-1]["stream"] == 0x5001
    k(*good_args(), threads=[5, 2], group_size=[2, 2], arg_casts=GOOD["arg_casts"])
    assert fake.launches[-1]["blocks"] == (3, 1, 1) and fake.launches[-1]["group"] == (2, 2, 1)
    assert fake.slot(fake.launches[-1], 5, 4) == struct.pack("<I", 5)       # the Metal grid
    assert fake.launches[-1]["func"] == 0xF100          # a 2-D dispatch: the any-grid unit
    k(*good_args(), threads=[10, 1], group_size=[4, 1], arg_casts=GOOD["arg_casts"])
    assert fake.launches[-1]["func"] == 0xF000          # 1-D in two dimensions
    k(*good_args(), threads=10, group_size=None, arg_casts=GOOD["arg_casts"])
    assert fake.launches[-1]["group"] == (10, 1, 1)
    k(*good_args(n=7), threads=None, group_size=None, arg_casts=GOOD["arg_casts"])
    assert fake.launches[-1]["group"] == (7, 1, 1)               # the first tensor's numel
    k(*good_args(n=9), threads=None, group_size=None, arg_casts=GOOD["arg_casts"])
    assert fake.launches[-1]["group"] == (9, 1, 1)
    assert len(k._plans) == 7
    with pytest.raises(TypeError, match="elements are half"):
        k(*good_args(dtype=torch.float16), **GOOD)
    with pytest.raises(TypeError, match=r"arg_casts=\{2: 'fp16'\}|elements are float"):
        k(*good_args(a=2), **GOOD)                        # an int for a float
    assert len(k._plans) == 7 and len(fake.launches) == 7


def _bad_calls():
    cuda1 = good_args(index=1)
    y, x, a, n, v = good_args()
    return [
        ("too few arguments", (y, x, a, n), GOOD, TypeError),
        ("too many arguments", (y, x, a, n, v, v), GOOD, TypeError),
        ("a half tensor", (y, FakeCuda((10,), torch.float16), a, n, v), GOOD, TypeError),
        ("a CPU tensor", (y, torch.ones(10), a, n, v), GOOD, TypeError),
        ("tensors on two devices", (y, cuda1[1], a, n, v), GOOD, TypeError),
        ("a CUDA tensor as a value", (y, x, FakeCuda(()), n, v), GOOD, TypeError),
        ("a 1-dim CPU tensor as a value", (y, x, torch.ones(1), n, v), GOOD, TypeError),
        ("a double CPU tensor as a value", (y, x, torch.tensor(1.0, dtype=torch.float64), n, v),
         GOOD, TypeError),
        ("an int for a float", (y, x, 2, n, v), GOOD, TypeError),
        ("a string", (y, x, "2.0", n, v), GOOD, RuntimeError),
        ("no cast for a uint", (y, x, a, n, v), dict(GOOD, arg_casts={4: "fp16"}), TypeError),
        ("a wrong cast", (y, x, a, n, v), dict(GOOD, arg_casts={3: "int16", 4: "fp16"}),
         TypeError),
        ("an unknown cast", (y, x, a, n, v), dict(GOOD, arg_casts={3: "int33", 4: "fp16"}),
         RuntimeError),
        ("a float cast key", (y, x, a, n, v), dict(GOOD, arg_casts={3.0: "int32", 4: "fp16"}),
         RuntimeError),
        ("a short vector", (y, x, a, n, [1.0]), GOOD, TypeError),
        ("a float too large", (y, x, 1e39, n, v), GOOD, OverflowError),
        ("a half too large", (y, x, a, n, [1.0, 1e6]), GOOD, OverflowError),
        ("a half too large, then a group too large", (y, x, a, n, [1.0, 1e6]),
         dict(GOOD, group_size=2048), OverflowError),      # in the order they always came
        ("NaN for a uint", (y, x, a, math.nan, v), GOOD, ValueError),
        ("threads as a bool", (y, x, a, n, v), dict(GOOD, threads=True), RuntimeError),
        ("threads as a float", (y, x, a, n, v), dict(GOOD, threads=10.0), RuntimeError),
        ("negative threads", (y, x, a, n, v), dict(GOOD, threads=-1), RuntimeError),
        ("a group too large", (y, x, a, n, v), dict(GOOD, group_size=2048), ValueError),
        ("a group of other dims", (y, x, a, n, v), dict(GOOD, group_size=[2, 2]), RuntimeError),
        ("a zero group", (y, x, a, n, v), dict(GOOD, threads=[4, 4], group_size=[4, 0]),
         ValueError),
        ("too many blocks", (y, x, a, n, v), dict(GOOD, threads=[4, 2 ** 20], group_size=[4, 1]),
         ValueError),
        ("an empty list for a pointer", (y, [], a, n, v), GOOD, RuntimeError),
        ("an object for a pointer", (y, object(), a, n, v), GOOD, TypeError),
    ]


@pytest.mark.parametrize("what,args,kw,exc", _bad_calls(), ids=[c[0] for c in _bad_calls()])
def test_bad_input_raises_the_same_error_warm_as_cold(fake, what, args, kw, exc):
    with pytest.raises(exc) as cold:
        axpy()(*args, **kw)
    k = axpy()
    k(*good_args(), **GOOD)                               # warm: a plan for good input
    k(*good_args(a=-1.0, ptr=0x4000), **GOOD)
    for _ in range(2):                                    # and again after the bad call
        with pytest.raises(exc) as warm:
            k(*args, **kw)
        assert str(warm.value) == str(cold.value)
    assert len(fake.launches) == 2


def test_an_empty_grid_launches_nothing_but_checks_values(fake):
    k = axpy()
    k(*good_args(), threads=0, group_size=4, arg_casts=GOOD["arg_casts"])
    assert fake.launches == []
    with pytest.raises(OverflowError):
        k(*good_args(a=1e39), threads=0, group_size=4, arg_casts=GOOD["arg_casts"])


def test_lists_bound_to_pointers_are_copied_per_call(fake, monkeypatch):
    made = []

    def list_tensor(a, dtype, device):
        made.append((list(a), dtype, device))
        return FakeCuda((len(a),), dtype, device, ptr=0xA000 + len(made))
    monkeypatch.setattr(C, "list_tensor", list_tensor)
    k = axpy()
    y, _, a, n, v = good_args()
    k(y, [1.0, 2.0], a, n, v, **GOOD)
    k(y, [3.0, 4.0, 5.0], a, n, v, **GOOD)
    assert made == [([1.0, 2.0], torch.float32, 0), ([3.0, 4.0, 5.0], torch.float32, 0)]
    assert [fake.slot(launch, 1, 8) for launch in fake.launches] == [
        struct.pack("<Q", 0xA001), struct.pack("<Q", 0xA002)]


def test_concurrent_calls_never_share_a_parameter_buffer(fake):
    """Threads call one kernel at once, each with its own values; the driver pauses between
    being handed the buffer and reading it, so a buffer shared with another call in flight
    would show that call's values."""
    fake.pause = 0.0005
    k = axpy()
    errors = []

    def worker(t):
        try:
            for i in range(40):
                a = float(t * 1000 + i)
                k(*good_args(a=a, ptr=(t + 1) << 32 | i << 12), **GOOD)
        except Exception as e:                            # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(t,), name=f"caller{t}") for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    seen = set()
    for launch in fake.launches:            # each call launched once, with its own values
        (y,) = struct.unpack("<Q", fake.slot(launch, 0, 8))
        (x,) = struct.unpack("<Q", fake.slot(launch, 1, 8))
        (a,) = struct.unpack("<f", fake.slot(launch, 2, 4))
        t, i = (y >> 32) - 1, (y & 0xFFFFFFFF) >> 12
        assert launch["thread"] == f"caller{t}", (launch["thread"], hex(y))
        assert x == y + 0x100 and a == t * 1000 + i, (hex(y), a)
        seen.add((t, i))
    assert seen == {(t, i) for t in range(4) for i in range(40)}


def test_a_kernel_keeps_at_most_its_plan_cache_size(fake):
    k = axpy()
    for n in range(1, library.PLANS_PER_KERNEL + 11):
        k(*good_args(), threads=n, group_size=1, arg_casts=GOOD["arg_casts"])
    assert len(k._plans) == library.PLANS_PER_KERNEL
    k(*good_args(), threads=library.PLANS_PER_KERNEL + 10, group_size=1,
      arg_casts=GOOD["arg_casts"])                        # the newest is still there
    assert len(k._plans) == library.PLANS_PER_KERNEL
    assert fake.launches[-1]["blocks"] == (library.PLANS_PER_KERNEL + 10, 1, 1)


def test_a_thread_without_a_context_gets_one_and_launches_again(fake):
    """CUDA_ERROR_INVALID_CONTEXT (a thread that made no CUDA call yet): the device's context
    is made current and the same buffer launched again; another error raises, naming the
    kernel."""
    k = axpy()
    fake.results = [C.INVALID_CONTEXT]
    k(*good_args(a=3.0), **GOOD)
    assert fake.made_current == [0]
    first, again = fake.launches
    assert first["raw"] == again["raw"] and again["stream"] == 0x5000
    assert fake.slot(again, 2, 4) == struct.pack("<f", 3.0)
    fake.results = [700]
    with pytest.raises(AssertionError, match="launching kernel 'axpy': 700"):
        k(*good_args(), **GOOD)
    k(*good_args(a=4.0), **GOOD)                          # and the next call launches
    assert fake.slot(fake.launches[-1], 2, 4) == struct.pack("<f", 4.0)
