"""What each schedule says it reorders (`Schedule.reordering`), which testing's slack reads."""
import math

import torch

import metalforge as mf
from metalforge.runtime import schedule_of
from metalforge.testing.slack import allowance
from metalforge.tolerance import compare, tolerance


@mf.kernel
def sl_scale(x: "T[R, D]", w: "T[D]"):
    return x * w


@mf.kernel
def sl_row_max(x: "T[R, D]"):
    return mf.max(x, axis="D")


@mf.kernel
def sl_softmax(x: "T[R, D]"):
    e = mf.exp(x - mf.max(x, axis="D"))
    return e / mf.sum(e, axis="D")


@mf.kernel
def sl_causal(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]"):
    s = mf.sum(q * k, axis="E")
    s = mf.where(mf.index("L") <= mf.index("S") + mf.size("L") - mf.size("S"), s, -mf.inf)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


def test_exact_schedules_reorder_nothing():
    assert schedule_of(sl_scale.graph(T="f32")).reordering() is None
    assert schedule_of(sl_row_max.graph(T="f32")).reordering() is None     # no sum: exact
    x, w = torch.randn(2, 3), torch.randn(3)
    got = allowance(sl_scale.graph(T="f32"), {"x": x, "w": w}, (x * w,))
    assert got.slack is None and got.alternatives == []


def test_row_sums_are_reordered_and_compared_by_no_later_reduction():
    graph = sl_softmax.graph(T="f32")
    r = schedule_of(graph).reordering()
    assert [n.attr for n in r.sums] == [("sum", "D")]
    assert not r.combined and r.skipped_keys is None
    x = torch.randn(2, 5)
    got = allowance(graph, {"x": x}, (torch.softmax(x, -1),))
    assert len(got.alternatives) == 2 and got.slack[0].shape == (2, 5)    # all up, all down


def test_masked_attention_skips_keys_and_its_scores_are_compared():
    graph = sl_causal.graph(T="f32")
    r = schedule_of(graph).reordering()
    assert {n.attr for n in r.sums} == {("sum", "E"), ("sum", "L")}
    assert {n.attr for n in r.combined} == {("sum", "E")}                 # the scores
    assert r.skipped_keys == "L"


@mf.kernel
def sl_attention(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]"):
    return mf.sum(mf.softmax(mf.sum(q * k, axis="E"), axis="L") * v, axis="L")


def test_half_prefill_rounds_its_weights_and_the_reference_may_too():
    """The f16 prefill kernel multiplies P into V as half operands: a weight of 1e-11 (exact
    in fp32) becomes 0 there and, against a -inf in V, NaN where the float64 reference (and the
    fp32 decode kernel) give -inf. The allowance's reference with P rounded to half accepts the
    NaN; an f32 call and a decode call round nothing."""
    q = torch.ones(1, 1, 32, 8, dtype=torch.float16)
    k = torch.ones(1, 1, 4, 8, dtype=torch.float16)
    k[..., 0, :] = -2                                   # key 0's weight: e^-24 / 3 ~ 1.3e-11
    v = torch.randn(1, 1, 4, 8, generator=torch.Generator().manual_seed(0)).half()
    v[..., 0, 0] = -math.inf
    values = {"q": q, "k": k, "v": v}
    for target in ("cuda", "apple10"):
        kernel = sl_attention.with_launch(target=target)
        assert "_prefill" in kernel.launches(q, k, v)[0][0]
        got = kernel(q, k, v)
        expected = torch.softmax((q.double() @ k.double().mT), -1) @ v.double()
        assert got[..., 0].isnan().all() and (expected[..., 0] == -math.inf).all()
        tol = tolerance("f16", reduction_length=8)
        assert compare(got, expected.half(), tol) is not None
        allowed = allowance(kernel.graph(T="f16"), values, (expected,), kernel.launch)
        assert compare(got, expected.half(), tol,
                       alternatives=[m[0] for m in allowed.alternatives]) is None
        # the kernel's own launch options count: with matrix_rows=0 nothing is rounded
        decode = allowance(kernel.graph(T="f16"), values, (expected,),
                           {**kernel.launch, "matrix_rows": 0})
        assert len(decode.alternatives) == len(allowed.alternatives) - 1
    decode = sl_attention.with_launch(target="cuda", matrix_rows=0)
    assert (decode(q, k, v)[..., 0] == -math.inf).all()
    sizes = {"B": 1, "H": 1, "S": 32, "L": 4, "E": 8}
    graph = sl_attention.graph(T="f16")
    assert schedule_of(graph, sizes=sizes).rounded_operands(sizes)
    assert not schedule_of(graph, sizes=sizes, launch={"matrix_rows": 0}).rounded_operands(sizes)
    for launch in ({}, {"target": "cuda"}):
        f32 = schedule_of(sl_attention.graph(T="f32"), sizes=sizes, launch=launch)
        assert not f32.rounded_operands(sizes)
