"""metalforge.testing.check on real kernels through the simulator: what it draws, what it
accepts, how options narrow it, and its errors."""
import math

import pytest
import torch

import metalforge as mf
from metalforge.testing import check
from metalforge.testing.profiles import PROFILES, profile
from metalforge.testing.tolerance import reduction_length


@mf.kernel
def chk_affine(x: "T[*B, R, D]", w: "T[D]", alpha: float = 2.0, flip: mf.Const[bool] = False):
    y = x * w + alpha
    if flip:
        y = -y
    return y


@mf.kernel
def chk_floordiv(a: "T[N]", b: "T[N]"):
    return a // b


@mf.kernel
def chk_nan_max(x: "T[N]", y: "T[N]"):
    return mf.where(x > 0, mf.maximum(x, y), mf.exp(y))


class Spy:
    """A kernel stand-in that records the arguments check passes (and forwards everything)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.calls = []

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __call__(self, **kwargs):
        self.calls.append({k: (v.shape, v.stride(), v.storage_offset(), v.dtype, v.clone())
                           if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        return self.kernel(**kwargs)


def test_check_passes_a_correct_kernel_over_dtypes_consts_batch_and_layouts():
    spy = Spy(chk_affine)
    report = check(spy, max_examples=12, max_variants=2)
    assert report.variants == ["T=f32, flip=False", "T=f16, flip=True"]
    assert "T=bf16, flip=False" in report.skipped_variants       # capped by max_variants
    # random examples plus the 32-bit boundary examples went through the spy; the 64-bit ones
    # through a with_launch(index64=True) view of the kernel
    assert report.examples > len(spy.calls) >= 24
    strides = [c["x"][1] for c in spy.calls]
    shapes = [c["x"][0] for c in spy.calls]
    assert any(0 in s for s in strides + [c["w"][1] for c in spy.calls])    # expanded
    assert any(c["x"][2] > 0 or c["w"][2] > 0 for c in spy.calls)           # storage offset
    assert any(len(s) > 2 for s in shapes) and any(len(s) == 2 for s in shapes)  # *B: 0..3 dims
    assert {c["x"][3] for c in spy.calls} == {torch.float32, torch.float16}
    alphas = {c["alpha"] for c in spy.calls}
    assert 2.0 in alphas and len(alphas) > 1                     # default and drawn scalars


@mf.kernel
def chk_grouped(w: "u32[N, K/8]", s: "T[N, K/GS]", GS: mf.Const[int] = 64):
    return s * 2 + mf.size("N")


def test_derived_dims_follow_each_const_variant():
    spy = Spy(chk_grouped)
    report = check(spy, dtypes={"T": "f32"}, values={"GS": [32, 64]}, max_examples=5)
    assert report.variants == ["T=f32, GS=32", "T=f32, GS=64"]
    for c in spy.calls:
        (n, k8), (n2, kgs) = c["w"][0], c["s"][0]
        assert n == n2 and k8 * 8 == kgs * c["GS"]           # K is a multiple of 8 and GS


def test_values_dims_and_layout_options_narrow_the_draw():
    spy = Spy(chk_affine)
    check(spy, dims={"D": 33, "R": [1, 2], "B": [(3,)]}, dtypes={"T": "bf16"},
          values={"x": "tiny", "w": (1.0, 2.0), "alpha": 0.25, "flip": True},
          layouts=False, max_examples=6)
    assert len(spy.calls) == 6 + 2      # and two 32-bit boundary examples: D=33 is one
    for c in spy.calls:
        assert c["x"][0][0] == 3 and c["x"][0][-1] == 33 and c["x"][0][-2] in (1, 2)
        assert c["x"][3] == torch.bfloat16 and c["alpha"] == 0.25 and c["flip"] is True
        x, w = c["x"][4].float(), c["w"][4].float()
        assert (x.abs() <= torch.finfo(torch.bfloat16).tiny * 2 ** 12).all()
        assert ((w >= 1) & (w <= 2)).all()
        assert c["x"][1] == tuple(torch.empty(c["x"][0]).stride()) and c["x"][2] == 0


def test_int_kernels_get_nonzero_divisors_and_compare_exactly():
    spy = Spy(chk_floordiv)
    report = check(spy, dtypes={"T": ["i32", "i8"]}, max_examples=8)
    assert report.variants == ["T=i32", "T=i8"]
    assert all((c["b"][4] != 0).all() for c in spy.calls)


def test_nan_and_inf_inputs_must_match_torch():
    spy = Spy(chk_nan_max)
    check(spy, dtypes={"T": "f32"}, values=["special"], max_examples=6)
    assert any(torch.isnan(c["x"][4]).any() for c in spy.calls)


def test_bad_options_name_what_was_wrong():
    with pytest.raises(ValueError, match="no dim 'Q'"):
        check(chk_affine, dims={"Q": 3}, max_examples=1, max_variants=1)
    with pytest.raises(ValueError, match="not a dtype variable.*T"):
        check(chk_affine, dtypes={"U": "f16"})
    with pytest.raises(ValueError, match="unknown dtype 'f64'"):
        check(chk_affine, dtypes={"T": "f64"})
    with pytest.raises(ValueError, match="'z', which is not a parameter"):
        check(chk_affine, values={"z": "normal"})
    with pytest.raises(ValueError, match="unknown family huge"):
        check(chk_affine, values={"x": "huge"}, dtypes={"T": "f32"}, max_examples=1,
              max_variants=1)
    with pytest.raises(ValueError, match="unknown hypothesis profile 'fast'"):
        check(chk_affine, profile="fast")


@mf.kernel
def chk_softmax(x: "T[R, D]"):
    e = mf.exp(x - mf.max(x, axis="D"))
    return e / mf.sum(e, axis="D")


def test_reduction_kernels_pass_with_tolerance_widened_by_length():
    spy = Spy(chk_layer_norm)
    check(spy, max_examples=10)
    assert max(c["x"][0][-1] for c in spy.calls) > 32          # rows past one simdgroup
    check(chk_softmax, max_examples=10)


def test_reduced_dims_are_never_empty():
    spy = Spy(chk_softmax)
    check(spy, dtypes={"T": "f32"}, max_examples=40)
    assert all(c["x"][0][1] >= 1 for c in spy.calls)
    empty = sum(c["x"][0][0] == 0 for c in spy.calls)        # one example in eight, about
    assert 1 <= empty <= len(spy.calls) // 3


def test_reduction_length_follows_the_graph():
    x = torch.zeros(2, 8)
    assert reduction_length(chk_layer_norm.graph(x, torch.zeros(8)), {"B": 2, "D": 8}) == 16
    assert reduction_length(chk_softmax.graph(x), {"R": 2, "D": 8}) == 8        # max is exact
    assert reduction_length(chk_affine.graph(torch.zeros(2, 3), torch.zeros(3)), {}) == 0


def test_profiles(monkeypatch):
    monkeypatch.delenv("METALFORGE_HYPOTHESIS_PROFILE", raising=False)
    assert profile().name == "metalforge-ci"
    monkeypatch.setenv("METALFORGE_HYPOTHESIS_PROFILE", "metalforge-thorough")
    assert profile().name == "metalforge-thorough"
    assert profile("metalforge-ci").name == "metalforge-ci"
    ci, thorough = PROFILES["metalforge-ci"], PROFILES["metalforge-thorough"]
    assert ci.settings.max_examples < thorough.settings.max_examples
    assert ci.max_variants is not None and thorough.max_variants is None
    assert ci.settings.deadline is None and ci.settings.derandomize
    assert ci.memory_budget < thorough.memory_budget
    monkeypatch.setenv("METALFORGE_HYPOTHESIS_PROFILE", "nope")
    with pytest.raises(ValueError, match="METALFORGE_HYPOTHESIS_PROFILE names unknown"):
        profile()


def test_mf_check_fixture_uses_the_session_profile(mf_check):
    assert mf_check.keywords["profile"] == profile().name
    report = mf_check(chk_affine, dtypes={"T": "f32"}, values={"flip": False}, max_examples=2)
    assert report.profile == profile().name and report.examples > 2     # + boundary sizes


@mf.kernel
def chk_col_sum(x: "T[R, D]"):
    return mf.sum(x, axis="R")


def test_variants_the_schedules_refuse_are_left_out_and_reported():
    """Integer sums are refused before launch with a clear error (UnsupportedConstruct), which
    is not a wrong answer: check leaves such variants out (reporting them), and fails when none
    is left."""
    report = check(chk_col_sum, dtypes={"T": ["f32", "i32", "u8"]}, max_examples=4)
    assert report.variants == ["T=f32"]
    assert [r.split(":")[0] for r in report.refused_variants] == ["T=i32", "T=u8"]
    assert "integer sums" in report.refused_variants[0]
    with pytest.raises(ValueError, match=r"(?s)chk_col_sum.*T=i32.*integer sums"):
        check(chk_col_sum, dtypes={"T": "i32"}, max_examples=1)


@mf.kernel
def chk_layer_norm(x: "T[*B, D]", w: "T[D]", b: "T[D]", eps: float = 1e-5):
    mu = mf.mean(x, axis="D")
    var = mf.mean((x - mu) * (x - mu), axis="D")
    return (x - mu) * mf.rsqrt(var + eps) * w + b


def test_ill_conditioned_outputs_get_their_sensitivity_to_reduction_rounding():
    """LayerNorm of a constant row (an expanded input): x - mean(x) is pure fp32 rounding,
    multiplied by rsqrt(eps) ~ 316. torch's own fp32 evaluation of the same expression is off
    by as much as the kernel; the slack (how far the reference moves when its sums are off by
    the allowed accumulation error) lets both pass, and stays tiny for ordinary rows."""
    from metalforge.testing.slack import moved_references, reduction_slack
    from metalforge.testing.tolerance import compare, tolerance

    torch.manual_seed(0)
    d = 63
    w, b = torch.randn(d), torch.randn(d)
    x = torch.tensor([-0.7]).expand(d)                  # stride 0: a constant row
    g = chk_layer_norm.graph(T="f32")
    args = {"x": x, "w": w, "b": b, "eps": 1e-5}
    want = chk_layer_norm.reference(x, w, b)
    mu = x.mean(-1, keepdim=True)
    eager = (x - mu) * torch.rsqrt(((x - mu) * (x - mu)).mean(-1, keepdim=True) + 1e-5) * w + b
    tol = tolerance("f32", reduction_length=2 * d, scale=float(max(w.abs().max(),
                                                                   b.abs().max(), x.abs()[0])))
    got = chk_layer_norm(x, w, b)
    assert compare(eager, want, tol) is not None                # torch fails the plain bound
    slack = reduction_slack(g, args, (want,))[0]
    assert compare(eager, want, tol, slack=slack) is None
    assert compare(got, want, tol, slack=slack) is None
    assert compare(got + 0.01, want, tol, slack=slack) is not None     # still a real bound
    # with an infinite weight the element is rounding residue x inf: the reference's residue is
    # exactly 0 (NaN), the kernel's is not (inf); a sum off by its allowed error gives inf too
    w2 = w.clone()
    w2[5] = math.inf
    want, got = chk_layer_norm.reference(x, w2, b), chk_layer_norm(x, w2, b)
    assert want[5].isnan() and got[5].isinf()
    moved = moved_references(g, {**args, "w": w2})
    slack = reduction_slack(g, {**args, "w": w2}, (want,))[0]
    assert compare(got, want, tol, slack=slack) is not None
    assert compare(got, want, tol, slack=slack, alternatives=[m[0] for m in moved]) is None
    got[5] = 1.0
    assert compare(got, want, tol, slack=slack, alternatives=[m[0] for m in moved]) is not None
    # eps = 0: the reference's 0 * rsqrt(0) is NaN, the kernel's residue / |residue| is +-1
    args0 = {**args, "eps": 0.0}
    want, got = chk_layer_norm.reference(x, w, b, eps=0.0), chk_layer_norm(x, w, b, eps=0.0)
    assert want.isnan().all() and got.isfinite().all()
    assert any(torch.allclose(got, s * w + b) for s in (1.0, -1.0))     # residue / |residue|
    moved = moved_references(g, args0)
    assert compare(got, want, tol) is not None
    assert compare(got, want, tol, alternatives=[m[0] for m in moved]) is None
    assert compare(got + 0.01, want, tol, alternatives=[m[0] for m in moved]) is not None
    # an ordinary row: the slack is below the tolerance itself
    x = torch.randn(4, d)
    want = chk_layer_norm.reference(x, w, b)
    slack = reduction_slack(g, {**args, "x": x}, (want,))[0]
    assert float(slack.max()) < tol.atol + tol.rtol * float(want.abs().min())


@mf.kernel
def chk_causal(q: "T[B, H, S, E]", k: "T[B, H, L, E]", v: "T[B, H, L, E]"):
    s = mf.sum(q * k, axis="E")
    s = mf.where(mf.index("L") <= mf.index("S") + mf.size("L") - mf.size("S"), s, -mf.inf)
    return mf.sum(mf.softmax(s, axis="L") * v, axis="L")


def test_keys_the_mask_hides_may_be_left_out():
    """The attention kernels never read the keys a causal mask hides from every row of a
    tile: an inf planted in such a key's values gives the reference's rows NaN (zero weight
    times inf) and the kernel's a finite value. check accepts either, and nothing else."""
    from metalforge.testing.slack import unread_keys_reference
    from metalforge.testing.tolerance import compare, tolerance

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 5, 2), torch.randn(1, 1, 3, 2), torch.randn(1, 1, 3, 2)
    v[0, 0, 2, 0] = math.inf          # key 2: only the last query row sees it (S > L)
    args = {"q": q, "k": k, "v": v}
    want, got = chk_causal.reference(**args), chk_causal(**args)
    other = unread_keys_reference(chk_causal.graph(**args), args)[0]
    assert want[0, 0, :2].isnan().all() and other[0, 0, :2].isnan().all()    # see no key
    assert want[0, 0, 2:4, 0].isnan().all() and other[0, 0, 2:4, 0].isfinite().all()
    assert torch.equal(want[0, 0, 4], other[0, 0, 4]) and want[0, 0, 4, 0] == math.inf
    tol = tolerance("f32", reduction_length=3, scale=4.0)
    assert compare(got, want, tol) is not None
    assert compare(got, want, tol, alternatives=[other]) is None
    for row in (1, 4):                # a row that sees no key, a row that sees the inf
        bad = got.clone()
        bad[0, 0, row, 0] = 0.5
        assert compare(bad, want, tol, alternatives=[other]) is not None
    assert unread_keys_reference(chk_softmax.graph(T="f32"), {"x": torch.randn(2, 8)}) is None


# --------------------------------------------------------------------------- coverage

def test_every_instantiation_is_launched_with_its_boundary_sizes():
    report = check(chk_softmax, dtypes={"T": "f32"}, max_examples=2)
    got = {i.host_name: i for i in report.instantiations}
    # four row variants at two index widths, each launched
    variants = ("simd", "simd_exact", "group", "looped")
    assert set(got) == {f"chk_softmax_f32{w}_{v}" for w in ("", "_idx64") for v in variants}
    assert all(i.launches >= 1 for i in got.values()), report.coverage()
    assert all(i.index64 == ("idx64" in h) for h, i in got.items())

    def ds(host):
        return {int(s.split("D=")[1]) for s in got[host].sizes}
    # 32-bit: every boundary size of each threshold (besides the random examples' sizes);
    # 64-bit: one size per kernel
    assert ds("chk_softmax_f32_simd") >= {1, 9, 17, 31, 33, 65, 129}
    assert ds("chk_softmax_f32_simd_exact") >= {8, 16, 32, 64, 128, 256}   # lanes x 8
    assert ds("chk_softmax_f32_group") >= {257, 260, 8192}
    assert ds("chk_softmax_f32_looped") >= {8193, 8196}
    assert [len(ds(f"chk_softmax_f32_idx64_{v}")) for v in variants] == [1, 1, 1, 1]
    assert "chk_softmax_f32_idx64_looped: 2 launch(es), sizes R=" in report.coverage()


def test_coverage_counts_the_kernel_the_launcher_picks(monkeypatch):
    """With stage_rows=None the launcher, not the schedule, picks the staged row kernel (where
    the backend fits twice its groups a core): check counts what was launched, and a staged
    kernel no example's device took is unreachable, not a failure."""
    from metalforge.sim.library import LibraryFunction
    kernel = chk_softmax.with_launch(stage_rows=None)
    dims = {"D": [300, 512]}                        # 512: whole blocks of 32 x 16 f16 values
    report = check(kernel, dtypes={"T": "f16"}, dims=dims, max_examples=2)
    got = {i.host_name: i for i in report.instantiations}
    assert got["chk_softmax_f16_group"].launches
    assert not got["chk_softmax_f16_staged"].launches          # the simulator: no occupancy
    assert "twice as many of its threadgroups" in got["chk_softmax_f16_staged"].unreachable
    monkeypatch.setattr(LibraryFunction, "groups_per_core", lambda self, n: 2 if
                        self._sig.host_name.endswith("_staged") else 1, raising=False)
    report = check(kernel, dtypes={"T": "f16"}, dims=dims, max_examples=2)
    got = {i.host_name: i for i in report.instantiations}
    assert {s.split("D=")[1] for s in got["chk_softmax_f16_staged"].sizes} == {"512"}
    assert {s.split("D=")[1] for s in got["chk_softmax_f16_group"].sizes} == {"300"}
    assert got["chk_softmax_f16_idx64_staged"].launches     # 64-bit: where it may be taken


def test_an_instantiation_never_launched_fails_the_check(monkeypatch):
    from metalforge.testing import coverage
    monkeypatch.setattr(coverage, "cover", lambda *a, **k: 0)     # random examples only
    with pytest.raises(AssertionError, match=r"(?s)never launched.*chk_softmax_\w*idx64"):
        check(chk_softmax, dtypes={"T": "f32"}, max_examples=2)


def test_pinned_dims_make_the_other_instantiations_unreachable_not_failures():
    report = check(chk_softmax, dtypes={"T": "f32"}, dims={"D": [31, 33]}, max_examples=2)
    got = {i.host_name: i for i in report.instantiations}
    assert got["chk_softmax_f32_simd"].launches and got["chk_softmax_f32_idx64_simd"].launches
    assert not got["chk_softmax_f32_looped"].launches
    assert got["chk_softmax_f32_looped"].unreachable == "dims= pins 'D' to [31, 33]"


@mf.kernel
def gather_rows(table: "T[N, D]", ids: "i32[M]") -> "T[M, D]":
    return mf.take(table, axis="N", index=ids) * 2


def test_the_work_budget_counts_the_axes_a_kernel_iterates():
    # a gather's source axis (a cache's rows) is only indexed: it does not multiply the work
    # that check's budget bounds
    import sys
    work = sys.modules["metalforge.testing.check"]._iterations
    graph = gather_rows.graph(T="f32")
    assert work(graph, {"N": 1000, "D": 8, "M": 3}) == 24
    assert work(chk_softmax.graph(T="f32"), {"R": 5, "D": 7}) == 35


@mf.kernel
def qmv_cover(wq: "u32[N, K/8]", s: "T[N, K/GS]", b: "T[N, K/GS]", x: "T[M, K]",
              GS: mf.Const[int] = 64) -> "T[M, N]":
    return mf.sum((mf.unpack(wq, bits=4) * s + b) * x, axis="K")


def test_coverage_finds_allowed_sizes_for_kernels_other_axes_select():
    """The tiled quantized kernel is selected by rows of x (its coverage pins M = N = 65); with
    dims= allowing N only 2, 15 or 64, check takes an allowed N that still selects it, at both
    index widths, instead of leaving the 64-bit kernel untested and failing (as llama_decode's
    rope check did on cuda, whose staged kernel starts at another E)."""
    r = check(qmv_cover, max_examples=10, dims={"N": [2, 15, 64]}, dtypes={"T": "f16"})
    launched = {i.host_name: i.launches for i in r.instantiations}
    assert launched["qmv_cover_f16_GS_64_idx64_qmm"] and launched["qmv_cover_f16_GS_64_qmm"]
