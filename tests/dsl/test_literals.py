"""Literal dims ("T[C, 4]", "T[C, K=4]", a Const-sized "T[C, W]") and i64/u64 tensors: the
call's checks, constant indexing `w[:, j]`, the literal in the generated kernel, the causal
convolution against torch's conv1d, 64-bit integers through elementwise kernels and as gather
indices (range-checked on all 64 bits). Kernels run on the simulator; expectations are computed
with torch (or numpy, where torch has no uint64 arithmetic) directly."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import metalforge as mf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from causal_conv import causal_conv, causal_conv_silu  # noqa: E402


def conv_torch(x, w, bias=None):
    """Depthwise causal conv1d of x [..., C, L] with w [C, K]: torch directly, in float64."""
    k = w.shape[-1]
    y = F.conv1d(F.pad(x.double().reshape(-1, *x.shape[-2:]), (k - 1, 0)), w.double()[:, None, :],
                 None if bias is None else bias.double(), groups=x.shape[-2])
    return y.reshape(x.shape)


# --------------------------------------------------------------------------- the causal conv

@pytest.mark.parametrize("shape", [(3, 1), (2, 5, 37), (1, 4, 4)])
def test_causal_conv_matches_torch_conv1d(shape):
    torch.manual_seed(0)
    x = torch.randn(shape)
    w = torch.randn(shape[-2], 4)
    torch.testing.assert_close(causal_conv(x, w), conv_torch(x, w).float())


def test_causal_conv_silu_with_a_const_width_in_f16():
    torch.manual_seed(1)
    x, w, b = torch.randn(2, 6, 19).half(), torch.randn(6, 3).half(), torch.randn(6).half()
    want = F.silu(conv_torch(x, w, b)).half()
    torch.testing.assert_close(causal_conv_silu(x, w, b, W=3), want, rtol=2e-3, atol=2e-3)
    with pytest.raises(mf.ShapeError, match=r"dim 1 is the literal 'W' 4"):
        causal_conv_silu(x, w, b)                                  # W defaults to 4


def test_the_literal_is_a_constant_of_the_kernel():
    src = causal_conv.source(torch.randn(2, 3, 8), torch.randn(3, 4))
    assert "w[mf_pos_C * 4u + 3u]" in src                 # tap 3: literal stride and position
    assert "mf_size_w" not in src                          # no size argument for the literal
    # x's gathers at max(l - k, 0) are proven in range (schedule/ranges.py): none is checked
    assert "mf_err" not in src and src.count("proven in range") == 4 * 2


# --------------------------------------------------------------------------- the call's checks

def test_a_wrong_literal_size_is_a_shape_error_naming_argument_and_dim():
    with pytest.raises(mf.ShapeError) as e:
        causal_conv(torch.randn(2, 3, 8), torch.randn(3, 5))
    msg = str(e.value)
    for words in ("argument 'w'", '"T[C, 4]"', "dim 1 is the literal 4", "(3, 5)"):
        assert words in msg, msg


@mf.kernel
def named(x: "T[R, K]", w: "T[K=4]"):
    return mf.sum(x * w, axis="K")


def test_a_named_literal_binds_every_tensor_that_names_it():
    x, w = torch.randn(5, 4), torch.randn(4)
    torch.testing.assert_close(named(x, w), (x.double() * w.double()).sum(1).float())
    with pytest.raises(mf.ShapeError, match=r"argument 'x'.*literal 'K' 4"):
        named(torch.randn(5, 6), w)


def test_conflicting_named_literals_and_bad_literals_are_annotation_errors():
    with pytest.raises(mf.AnnotationError, match="literal 8 here but 4 in parameter 'a'"):
        @mf.kernel
        def clash(a: "T[K=4]", b: "T[K=8]"):
            return a
    with pytest.raises(mf.AnnotationError, match="at least 1"):
        @mf.kernel
        def zero(a: "T[N, 0]"):
            return a
    with pytest.raises(mf.AnnotationError, match="name it as the parameter does"):
        @mf.kernel
        def ret(a: "T[N, 4]") -> "T[N, 4]":
            return a
        ret.graph(torch.randn(2, 4))


# --------------------------------------------------------------------------- indexing

@mf.kernel
def picks(w: "T[4, C]", v: "T[C, 2, 3]", n: mf.Const[int] = 2):
    first = w[0] + w[-1]                                 # leading literal dim; negative index
    second = mf.sum((v * 2.0)[:, n - 1], axis="v[2]")    # a computed value, reduced
    third = mf.max(v[..., 0, :], axis="v[2]") - mf.index("C")
    return first, second, third


def test_constant_indexing_of_arguments_and_computed_values():
    w, v = torch.randn(4, 6), torch.randn(6, 2, 3)
    first, second, third = picks(w, v)
    torch.testing.assert_close(first, w[0] + w[-1])
    torch.testing.assert_close(second, (v[:, 1] * 2.0).sum(-1))
    torch.testing.assert_close(third, v[:, 0].amax(-1) - torch.arange(6))


@pytest.mark.parametrize("body, words", [
    (lambda x, w, w2: x[0], "'N' is sized at the call"),
    (lambda x, w, w2: w[:, 4], "index 4 is out of range for axis 'w[1]' of size 4"),
    (lambda x, w, w2: w[:, x], "indexed only by Python integers"),
    (lambda x, w, w2: w[1:, 0], "indexed only by Python integers"),
    (lambda x, w, w2: w[0, 0, 0], "too many indices"),
    (lambda x, w, w2: w + w2, "unnamed literal dims 'w[1]' and 'w2[1]'"),
])
def test_indexing_errors_say_what_is_allowed(body, words):
    @mf.kernel
    def k(x: "T[N]", w: "T[N, 4]", w2: "T[N, 4]"):
        return body(x, w, w2)
    with pytest.raises(mf.TraceError) as e:
        k.graph(torch.randn(3), torch.randn(3, 4), torch.randn(3, 4))
    assert words in str(e.value), str(e.value)


def test_one_constant_index_per_read_of_an_argument():
    @mf.kernel
    def two(v: "T[C, 2, 3]"):
        return v[:, 1, 2]
    with pytest.raises(mf.TraceError, match="one literal dim of an argument per read"):
        two.graph(torch.randn(4, 2, 3))


# --------------------------------------------------------------------------- i64 and u64

@mf.kernel
def mixed64(a: "i64[N]", b: "i32[N]"):
    return a * 3 + b, a // b, a > b


def test_i64_tensors_follow_torch_promotion_and_arithmetic():
    a = torch.tensor([1, -5, 2**40 + 3, 2**62, -(2**63), 7], dtype=torch.int64)
    b = torch.tensor([1, 2, -3, 4, 5, -6], dtype=torch.int32)
    got = mixed64(a, b)
    want = (a * 3 + b, torch.div(a, b, rounding_mode="floor"), a > b)
    for g, e in zip(got, want):
        assert g.dtype == e.dtype
        assert torch.equal(g, e)


@mf.kernel
def unsigned64(a: "u64[N]", b: "u64[N]"):
    return (a >> 3) ^ a, a // b, a % b, mf.maximum(a, b), a < b, a.to(mf.f32)


def test_u64_tensors_compute_as_unsigned_64_bit_values():
    av = [1, 2**63 + 5, 2**40, 7, 2**64 - 1, 2**63, 3, 0]
    bv = [3, 7, 2**63 + 1, 2**64 - 1, 5, 2**63, 1, 9]
    a, b = (torch.tensor(v, dtype=torch.uint64) for v in (av, bv))
    an, bn = (np.array(v, dtype=np.uint64) for v in (av, bv))
    want = ((an >> np.uint64(3)) ^ an, an // bn, an % bn, np.maximum(an, bn), an < bn,
            an.astype(np.float32))
    got, ref = unsigned64(a, b), unsigned64.reference(a, b)
    for g, r, e in zip(got, ref, want):
        assert np.array_equal(g.numpy(), e) and np.array_equal(r.numpy(), e)
    assert got[0].dtype == torch.uint64


@mf.kernel
def gather64(x: "T[V]", idx: "I[N]"):
    return mf.take(x, "V", idx) * 2.0


@pytest.mark.parametrize("dt", [torch.int64, torch.uint64])
def test_64_bit_gather_indices_are_checked_on_all_64_bits(dt):
    x = torch.randn(10)
    idx = torch.tensor([0, 9, 3], dtype=dt)
    torch.testing.assert_close(gather64(x, idx), x[idx.to(torch.int64)] * 2.0)
    assert "32-bit indexing" in gather64.source(x, idx)       # 64-bit values, 32-bit offsets
    bad = [2**32 + 1, 2**32, 2**64 - 1 if dt == torch.uint64 else -(2**32) + 1]
    for v in bad:
        with pytest.raises(mf.GatherIndexError, match=f"index {v} is out of range"):
            gather64(x, torch.tensor([0, v], dtype=dt))
        with pytest.raises(mf.GatherIndexError, match=f"index {v} is out of range"):
            gather64.reference(x, torch.tensor([0, v], dtype=dt))


def test_u64_mixed_with_signed_ints_is_refused_as_torch_refuses():
    @mf.kernel
    def bad(a: "u64[N]", b: "i64[N]"):
        return a + b
    with pytest.raises(mf.TraceError, match="does not promote"):
        bad.graph(torch.zeros(2, dtype=torch.uint64), torch.zeros(2, dtype=torch.int64))


@mf.kernel
def affine_taps(x: "T[N, C]", w: "T[C, 3]", idx: "i64[N]"):
    return x * w[:, 0] + w[:, 2] + idx


def test_literal_taps_and_i64_tensors_on_the_mlx_backend():
    mx = pytest.importorskip("mlx.core")
    x, w = torch.randn(5, 6), torch.randn(6, 3)
    idx = torch.tensor([0, 2**40, -3, 7, 2**62], dtype=torch.int64)
    want = x * w[:, 0] + w[:, 2] + idx[:, None]
    torch.testing.assert_close(affine_taps(x, w, idx), want)
    with mf.backend("sim"):         # MLX's kernel source, run by the simulator off a Mac
        got = affine_taps(*(mx.array(t.numpy()) for t in (x, w, idx)))
    torch.testing.assert_close(torch.from_numpy(np.array(got)), want)


def test_generated_checks_hold_literal_dims_at_their_size():
    from metalforge.testing import check
    check(causal_conv, dtypes={"T": ["f32"]}, max_examples=3)
    report = check(named, dtypes={"T": ["f32"]}, max_examples=3)
    assert "'K' is a literal dim of size 4" in report.coverage()   # one row variant fits K=4


def test_constant_indexing_is_differentiable():
    op = affine_taps.as_op("mf_literals_test::affine_taps")
    x, w = torch.randn(5, 6, requires_grad=True), torch.randn(6, 3, requires_grad=True)
    idx = torch.arange(5, dtype=torch.int64)
    g = torch.randn(5, 6)
    op(x, w, idx).backward(g)
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    (x2 * w2[:, 0] + w2[:, 2] + idx[:, None]).backward(g)
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)          # column 1 is never read: zero
