"""mf.Const variants: each value is its own kernel with its own name, branches on constants are
resolved while tracing (no runtime branch in the MSL), and variants() lists what was compiled."""
import re

import torch

import metalforge as mf
from metalforge.runtime import backends


@mf.kernel
def masked_steps(x: "T[S, L]", bias: float, reps: mf.Const[int] = 2,
                 causal: mf.Const[bool] = True):
    y = x
    for _ in range(reps):               # Python loop over a Const: unrolled while tracing
        y = y * 0.5 + bias
    if causal:                          # Python branch on a Const: one kernel per value
        y = mf.where(mf.index("L") <= mf.index("S"), y, -mf.inf)
    return y


def torch_masked_steps(x, bias, reps=2, causal=True):
    y = x.double()
    for _ in range(reps):
        y = y * 0.5 + bias
    if causal:
        keep = torch.ones(x.shape, dtype=torch.bool).tril()
        y = y.masked_fill(~keep, float("-inf"))
    return y.to(x.dtype)


def body(src: str) -> str:
    """The kernel body: the MSL between the kernel's opening brace and the instantiations."""
    return src[src.index("{", src.index("kernel void")):src.index("template [[host_name")]


def host_names(src: str) -> list[str]:
    return re.findall(r'host_name\("(\w+)"\)', src)


def test_each_const_value_is_a_separate_correct_kernel(monkeypatch):
    compiled = []
    real = backends._compile
    monkeypatch.setattr(backends, "_compile", lambda b, s: compiled.append(s) or real(b, s))
    x = torch.randn(5, 7)
    settings = [dict(), dict(reps=3), dict(causal=False), dict(reps=0, causal=False)]
    for kw in settings:
        for _ in range(2):                                   # the second call compiles nothing
            got = masked_steps(x, 0.25, **kw)
            torch.testing.assert_close(got, torch_masked_steps(x, 0.25, **kw))
    assert len(compiled) == len(settings)
    names = [host_names(s) for s in compiled]
    assert names == [["masked_steps_f32_reps_2_causal_true"],
                     ["masked_steps_f32_reps_3_causal_true"],
                     ["masked_steps_f32_reps_2_causal_false"],
                     ["masked_steps_f32_reps_0_causal_false"]]
    # a runtime scalar is an argument: a new value compiles nothing
    masked_steps(x, -1.5)
    assert len(compiled) == len(settings)


def test_branches_on_consts_are_resolved_while_tracing():
    x = torch.randn(4, 4)
    on = masked_steps.source(x, 0.0, reps=3, causal=True)
    off = masked_steps.source(x, 0.0, reps=3, causal=False)
    for src in (on, off):
        b = body(src)
        # no kernel argument, variable or branch for the constants
        assert "causal" not in b and "reps" not in b
        assert not re.search(r"constant \w+& (causal|reps)\b", src)
        # the loop over reps is unrolled: three multiply-adds per element
        assert len(re.findall(r"\* 0\.5f", b)) == 3 * b.count("compute (f16/bf16 in f32)")
    # only the causal variant computes positions and selects -inf; the other has no trace of it
    assert "INFINITY" in body(on) and "mf_pos_" in body(on)
    assert "INFINITY" not in body(off) and "mf_pos_" not in body(off)
    # the only ifs in either body are the vector/tail split and the bounds guard
    for src in (on, off):
        conds = re.findall(r"\bif \((.*)\) \{", body(src))
        assert all("mf_numel" in c for c in conds), conds


def test_const_values_are_literals_in_the_code():
    @mf.kernel
    def scale_by(x: "T[N]", k: mf.Const[int] = 3):
        return x * k

    src = scale_by.source(torch.randn(8), k=7)
    assert "mf_in_x * 7" in body(src) and "k" not in re.findall(r"\b\w+\b", body(src))
    torch.testing.assert_close(scale_by(torch.arange(6.0), k=-2), torch.arange(6.0) * -2)
    assert host_names(scale_by.source(torch.randn(8), k=-2)) == ["scale_by_f32_k_m2"]


def test_variants_lists_traced_and_compiled_kernels():
    @mf.kernel
    def shift(x: "T[N]", by: mf.Const[int] = 1):
        return x + by

    x = torch.randn(9)
    shift.source(x, by=5)                        # traced (and printed), not compiled
    shift(x)
    shift(x.half(), by=2)
    shift.with_launch(threads_per_group=64)(x)   # launch-only change: same compiled kernel
    assert shift.variants() == [{"T": "f32", "by": 5}, {"T": "f32", "by": 1},
                                {"T": "f16", "by": 2}]
    got = shift.variants(compiled=True)
    assert [(v["T"], v["by"], v["host_name"], v["backend"]) for v in got] == [
        ("f32", 1, "shift_f32_by_1", "sim"), ("f16", 2, "shift_f16_by_2", "sim")]
    assert [lp["threads_per_group"] for lp in got[0]["launches"]] == [256, 64]
    assert got[0]["family"] == "elementwise" and got[0]["host_names"] == ("shift_f32_by_1",)


def test_reduction_variants_share_one_library():
    @mf.kernel
    def norm_or_softmax(x: "T[R, D]", log: mf.Const[bool] = False):
        return mf.log_softmax(x, axis="D") if log else mf.softmax(x, axis="D")

    short, long = torch.randn(3, 40), torch.randn(2, 5000)
    for x in (short, long):
        torch.testing.assert_close(norm_or_softmax(x, log=True), torch.log_softmax(x, -1))
    (v,) = norm_or_softmax.variants(compiled=True)
    assert v["log"] is True and v["family"] == "row"
    assert v["host_names"] == ("norm_or_softmax_f32_log_true_simd",
                               "norm_or_softmax_f32_log_true_simd_exact",
                               "norm_or_softmax_f32_log_true_group",
                               "norm_or_softmax_f32_log_true_looped")
