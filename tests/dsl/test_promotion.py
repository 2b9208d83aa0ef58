"""Type promotion: the dtypes the tracer gives every result, checked against torch itself
(torch.result_type and torch ops on real tensors), and the reference's values against the
same torch ops."""
import itertools

import pytest
import torch

import metalforge as mf
from metalforge import dtypes

NAMES = list(dtypes.ANNOTATION_DTYPES)


def sample(name, n=6, lo=1):
    dt = dtypes.ALL[name].torch
    if dt == torch.bool:
        return torch.tensor([True, False, True, True, False, True][:n])
    if dt.is_floating_point:
        return (torch.arange(n) * 0.75 + 0.5).to(dt)
    return (torch.arange(n) + lo).to(dt)


def torch_dtype(fn):
    """The dtype torch gives, or None where torch refuses (or has no CPU kernel)."""
    try:
        return fn().dtype
    except (RuntimeError, NotImplementedError, TypeError):
        return None


@mf.kernel
def arith(a: "T[N]", b: "U[N]"):
    return a + b, a * b, a / b, a < b, mf.maximum(a, b), mf.where(a == a, a, b)


@pytest.mark.parametrize("ta, tb", list(itertools.product(NAMES, NAMES)))
def test_tensor_tensor_promotion(ta, tb):
    a, b = sample(ta), sample(tb)
    try:
        common = torch.result_type(a, b)
    except RuntimeError:
        with pytest.raises(mf.TraceError, match="does not promote"):
            arith.graph(a, b)
        return
    outs = arith.graph(a, b).outputs
    got = [o.dtype.torch for o in outs]
    assert got[0] == common and got[1] == common
    assert got[2] == (common if common.is_floating_point else torch.float32)
    assert got[3] == torch.bool and got[4] == common and got[5] == common
    # where torch's CPU kernels exist, the ops themselves agree (dtype and value)
    ref = arith.reference(a, b)
    for i, op in enumerate([torch.add, torch.mul, torch.div, torch.lt, torch.maximum,
                            lambda x, y: torch.where(x == x, x, y)]):
        want = torch_dtype(lambda: op(a, b))
        if want is None:
            continue
        assert got[i] == want
        expect = op(a, b)
        assert ref[i].dtype == expect.dtype
        torch.testing.assert_close(ref[i].double(), expect.double(), rtol=1e-2, atol=1e-3,
                                   equal_nan=True)


@mf.kernel
def with_scalars(a: "T[N]", s: float, i: int, flag: bool):
    return a * s, a * i, a + flag, a * 2.5, a * 3, a / 2, a > 1.5, a + 0


@pytest.mark.parametrize("ta", NAMES)
def test_weak_python_scalars(ta):
    a = sample(ta)
    g = with_scalars.graph(a, 1.5, 2, True)
    checks = [lambda: a * 1.5, lambda: a * 2, lambda: a + True, lambda: a * 2.5,
              lambda: a * 3, lambda: a / 2, lambda: a > 1.5, lambda: a + 0]
    compared = 0
    for out, fn in zip(g.outputs, checks):
        want = torch_dtype(fn)
        if want is not None:        # torch has a CPU kernel for this dtype
            assert out.dtype.torch == want, (ta, out)
            compared += 1
    assert compared >= (1 if ta in ("u16", "u32", "u64") else 8)


@pytest.mark.parametrize("ta", NAMES)
def test_weak_scalar_dtypes_via_result_type(ta):
    a = sample(ta)
    g = with_scalars.graph(a, 1.5, 2, True)
    for out, s in zip(g.outputs[:5], [1.5, 2, True, 2.5, 3]):
        assert out.dtype.torch == torch.result_type(a, s)


def test_subtraction_with_bools_is_refused_like_torch():
    @mf.kernel
    def k(a: "T[N]", flag: bool):
        return a - flag

    with pytest.raises(mf.TraceError, match="torch refuses it too"):
        k.graph(sample("f32"), True)
    with pytest.raises(RuntimeError):
        sample("f32") - True


def test_examples_from_the_design():
    @mf.kernel
    def k(h: "f16[N]", i: "i32[N]", j: "i32[N]", b: "bool[N]", u: "u8[N]", s: "i8[N]"):
        return h * 2.0, i * 2.5, i / j, h < 1, b + 1, u + s, i ** 2, b ** 2, i ** 0.5

    got = [o.dtype for o in k.graph(*(sample(n) for n in
                                      ("f16", "i32", "i32", "bool", "u8", "i8"))).outputs]
    assert got == [dtypes.F16, dtypes.F32, dtypes.F32, dtypes.BOOL, dtypes.I64, dtypes.I16,
                   dtypes.I32, dtypes.I64, dtypes.F32]
    h, i, j, b, u, s = (sample(n) for n in ("f16", "i32", "i32", "bool", "u8", "i8"))
    want = [h * 2.0, i * 2.5, i / j, h < 1, b + 1, u + s, i ** 2, b ** 2, i ** 0.5]
    assert [t.dtype for t in want] == [d.torch for d in got]


MATH = ["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf",
        "abs", "floor", "ceil"]


@pytest.mark.parametrize("ta", ["f32", "f16", "bf16", "i32", "i16", "i8", "u8", "bool"])
def test_math_functions_result_dtypes(ta):
    a = sample(ta)
    fns = [f for f in MATH if torch_dtype(lambda: getattr(torch, f)(a)) is not None]

    @mf.kernel
    def k(x: "T[N]"):
        return tuple(getattr(mf, f)(x) for f in fns)

    outs = k.graph(a).outputs
    ref = k.reference(a)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for f, o, r in zip(fns, outs, ref):
        expect = getattr(torch, f)(a)
        assert o.dtype.torch == expect.dtype, f
        tol = 1e-2 if ta == "bf16" else 2e-3      # one bf16 ulp of double rounding
        torch.testing.assert_close(r.double(), expect.double(), rtol=tol, atol=tol,
                                   equal_nan=True)
    refused = [f for f in MATH if f not in fns]
    for f in refused:          # where torch refuses (abs/floor/ceil of bool) we refuse too
        @mf.kernel
        def bad(x: "T[N]"):
            return getattr(mf, f)(x)
        with pytest.raises(mf.TraceError, match="torch refuses it too"):
            bad.graph(a)


@pytest.mark.parametrize("tx, ty", [("f16", "f32"), ("i32", "f32"), ("i8", "i32"),
                                    ("bf16", "f16"), ("bool", "i32"), ("f16", "i64")])
def test_zero_dim_values_rank_below_tensors(tx, ty):
    @mf.kernel
    def k(x: "T[M]", y: "U[N]"):
        return x + mf.sum(y, axis="N"), x * mf.max(y, axis="N")

    x, y = sample(tx), sample(ty if ty != "i64" else "i32").to(dtypes.ALL[ty].torch)
    got = [o.dtype.torch for o in k.graph(x, y).outputs]
    assert got == [(x + y.sum()).dtype, (x * y.amax()).dtype]


@pytest.mark.parametrize("ta", ["f32", "f16", "bf16", "i32", "i16", "u8", "bool"])
def test_reduction_dtypes(ta):
    a = sample(ta).reshape(2, 3)

    @mf.kernel
    def k(x: "T[R, D]"):
        return (mf.sum(x, axis="D"), mf.prod(x, axis="D"), mf.max(x, axis="D"),
                mf.min(x, axis="R"), mf.argmax(x, axis="D"), mf.argmin(x, axis="R"))

    outs = [o.dtype.torch for o in k.graph(a).outputs]
    want = [torch_dtype(lambda: a.sum(1)), torch_dtype(lambda: a.prod(1)),
            torch_dtype(lambda: a.amax(1)), torch_dtype(lambda: a.amin(0)), torch.int64,
            torch.int64]
    for got, w in zip(outs, want):
        if w is not None:
            assert got == w
    assert outs[0] == (torch.int64 if not a.is_floating_point() else a.dtype)


def test_bitwise_and_shifts_follow_torch():
    @mf.kernel
    def k(a: "i32[N]", b: "i32[N]", m: "bool[N]", n: "bool[N]"):
        return a & b, a | 7, a ^ b, ~a, a << 2, a >> 1, m & n, m | n, ~m, m ^ True

    a, b = torch.tensor([5, -3, 12]), torch.tensor([3, 6, -1])
    a, b = a.int(), b.int()
    m, n = torch.tensor([True, False, True]), torch.tensor([True, True, False])
    want = [a & b, a | 7, a ^ b, ~a, a << 2, a >> 1, m & n, m | n, ~m, m ^ True]
    got = k.reference(a, b, m, n)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_integer_overflow_wraps_at_the_dtype_width():
    @mf.kernel
    def k(a: "i8[N]", b: "i8[N]"):
        return a * b + 1, (a * b) > 0

    a = torch.tensor([100, -100, 7], dtype=torch.int8)
    b = torch.tensor([3, 3, 2], dtype=torch.int8)
    got = k.reference(a, b)
    assert torch.equal(got[0], a * b + 1) and torch.equal(got[1], (a * b) > 0)


def test_uint32_unpacking_values():
    @mf.kernel
    def nib(w: "u32[N]", shift: mf.Const[int] = 4):
        return (w >> shift) & 15

    w = torch.tensor([0x12345678, 0xFFFFFFFF, 0], dtype=torch.uint32)
    got = nib.reference(w)
    want = (w.to(torch.int64) >> 4) & 15
    assert got.dtype == torch.uint32 and torch.equal(got.to(torch.int64), want)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_comparisons_round_float_scalars_to_the_half_dtype(dt):
    @mf.kernel
    def k(x: "T[N]", s: float):
        return x == 0.1, x < 0.1, x >= s

    x = torch.tensor([0.1, 0.0999755859375, 0.10009765625, 0.09997558]).to(dt)
    eq, lt, ge = k.reference(x, 0.1)
    assert torch.equal(eq, x == 0.1) and torch.equal(lt, x < 0.1) and torch.equal(ge, x >= 0.1)


def test_64_bit_integer_tensors_promote_as_torch():
    @mf.kernel
    def mix(a: "i64[N]", b: "i32[N]", h: "f16[N]", u: "u64[N]"):
        return a + b, a * 2.5, a + h, u + 1, u * h, a // b, u >> 2
    args = (sample("i64"), sample("i32"), sample("f16"), sample("u64"))
    got = [o.dtype.torch for o in mix.graph(*args).outputs]
    a, b, h, u = args
    want = [torch.result_type(a, b), torch.result_type(a, 2.5), torch.result_type(a, h),
            torch.result_type(u, 1), torch.result_type(u, h), torch.int64, torch.uint64]
    assert got == want == [torch.int64, torch.float32, torch.float16, torch.uint64,
                           torch.float16, torch.int64, torch.uint64]

    @mf.kernel
    def signed_unsigned(u: "u64[N]", b: "i32[N]"):
        return u + b
    with pytest.raises(mf.TraceError, match="does not promote"):
        signed_unsigned.graph(sample("u64"), sample("i32"))
