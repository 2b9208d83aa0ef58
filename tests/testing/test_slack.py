"""What each schedule says it reorders (`Schedule.reordering`), which testing's slack reads."""
import torch

import metalforge as mf
from metalforge.runtime import schedule_of
from metalforge.testing.slack import allowance


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
