"""Row and column reductions through the simulator, against hand-written torch (float64).

Each kernel compiles once per dtype (its three row-length variants are one library); sizes and
launch overrides that only change the host's variant choice (looped_limit) do not recompile.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import metalforge as mf
from metalforge import runtime
from metalforge.schedule import LaunchError, UnsupportedConstruct

INF, NAN = math.inf, math.nan
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1e-2)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# simd, simd, group, group, then looped for f32 (8193) and for 2-byte types (16385: their group
# rows reach twice as far, same threads)
ROWS = (1, 31, 33, 96, 200, 300, 8193, 16385)


def close(got, want, dtype, scale=1.0):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got, want.to(got.dtype), rtol=rtol * scale, atol=atol * scale,
                               equal_nan=True)


def variant(kernel, *args, **kw):
    """The row/column variant a call with these arguments launches."""
    g = kernel.graph(*args, **kw)
    values = {p.name: a for p, a in zip(g.params, args)}
    s = runtime.schedule_of(g, values, launch=kernel.launch)
    from metalforge.shapes import bind_shapes
    sizes = bind_shapes(g, {t.name: values[t.name] for t in g.tensors}).sizes
    return s.variant(sizes), s, sizes


# --------------------------------------------------------------------------- kernels

@mf.kernel
def rms_norm(x: "T[*B, D]", w: "T[D]", eps: float = 1e-6):
    return x * mf.rsqrt(mf.mean(x * x, axis="D") + eps) * w


@mf.kernel
def layer_norm(x: "T[R, D]", w: "T[D]", b: "T[D]", eps: float = 1e-5):
    mu = mf.mean(x, axis="D")
    var = mf.mean((x - mu) * (x - mu), axis="D")
    return (x - mu) * mf.rsqrt(var + eps) * w + b


@mf.kernel
def softmax(x: "T[*B, D]"):
    return mf.softmax(x, axis="D")


# the same kernel, made to take the looped (online) variant from 129 elements on: same source
@mf.kernel(name="softmax", launch={"looped_limit": 128})
def softmax_looped(x: "T[*B, D]"):
    return mf.softmax(x, axis="D")


@mf.kernel
def log_softmax(x: "T[R, D]"):
    return mf.log_softmax(x, axis="D")


@mf.kernel
def logsumexp(x: "T[R, D]"):
    return mf.logsumexp(x, axis="D")


@mf.kernel
def add_rms_norm(x: "T[*B, D]", r: "T[*B, D]", w: "T[D]", eps: float = 1e-6):
    h = x + r
    return h, h * mf.rsqrt(mf.mean(h * h, axis="D") + eps) * w


@mf.kernel
def stats(x: "T[R, D]"):                 # four reductions in one phase, four outputs
    return mf.max(x, axis="D"), mf.min(x, axis="D"), mf.sum(x, axis="D"), mf.prod(x, axis="D")


@mf.kernel
def arg(x: "T[R, D]"):
    return mf.argmax(x, axis="D"), mf.argmin(x, axis="D")


@mf.kernel(name="arg", launch={"looped_limit": 128})
def arg_looped(x: "T[R, D]"):
    return mf.argmax(x, axis="D"), mf.argmin(x, axis="D")


@mf.kernel
def column_sum(x: "T[R, D]"):
    return mf.sum(x, axis="R")


@mf.kernel
def column_softmax(x: "T[R, D]"):
    return mf.softmax(x, axis="R")


@mf.kernel
def column_arg(x: "T[R, D]"):
    return mf.argmax(x, axis="R"), mf.argmin(x, axis="R")


@mf.kernel
def middle_mean(x: "T[B, R, D]", s: "T[B, D]"):
    return mf.mean(x, axis="R") * s


@pytest.fixture(autouse=True)
def _seeded():
    """Every test draws the same random data on every run."""
    torch.manual_seed(0)


def special_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows 0..4: all -inf, a masked prefix, a NaN, an +inf, all equal; the rest random."""
    d = x.shape[-1]
    v = x.view(-1, d)
    v[0] = -INF
    v[1, : max(1, d // 3)] = -INF
    v[2, d // 2] = NAN
    v[3, (d - 1) // 2] = INF
    v[4] = 0.5
    return x


# --------------------------------------------------------------------------- row

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_every_variant_batched_and_strided(dtype):
    seen = set()
    for d in ROWS:
        base = torch.randn(2, 3, 2 * d, dtype=dtype)
        x = base[..., ::2]                                  # non-contiguous rows
        w = torch.randn(d, dtype=dtype)
        want = F.rms_norm(x.double(), (d,), w.double(), eps=1e-6)
        close(rms_norm(x, w), want, dtype)
        seen.add(variant(rms_norm, x, w)[0])
    assert seen == {"simd", "group", "looped"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_rows_not_a_multiple_of_the_vector_width_spread_each_threads_elements(dtype):
    """Rows that are not a multiple of the 16-byte width (8 f16, 4 f32) move element by
    element in the simd, group and looped kernels, a thread's elements strided by the row's
    threads: each element still at its own mf.index, stored where it was read."""
    long = 16388 if dtype.itemsize == 2 else 8194             # past the group kernel's rows
    for d, want in ((100, "simd"), (102, "simd"), (99, "simd"), (4100, "group"),
                    (4098, "group"), (4097, "group"), (long, "looped"), (long + 1, "looped")):
        g = torch.Generator().manual_seed(d)              # argmax below: no near-ties
        x, w = torch.randn(3, d, generator=g).to(dtype), torch.randn(d, generator=g).to(dtype)
        assert variant(softmax, x)[0] == want
        close(softmax(x), torch.softmax(x.double(), dim=-1), dtype)
        close(rms_norm(x, w), F.rms_norm(x.double(), (d,), w.double(), eps=1e-6), dtype)
        x = x / 8                                      # x * position stays finite in f16
        y, i = ramp(x)
        yd = x.double() * torch.arange(1, d + 1, dtype=torch.float64)
        close(y, yd - yd.amax(-1, keepdim=True), dtype, scale=d / 100)
        assert torch.equal(i, yd.argmax(-1))
    src = softmax.source(torch.randn(2, 8).to(dtype))
    assert "x[mf_row_x + mf_index_t(mf_first + mf_k * mf_step)]" in src


def test_rms_norm_f16_reads_each_input_once():
    x = torch.randn(64, 4096, dtype=torch.float16)
    w = torch.randn(4096, dtype=torch.float16)
    v, s, sizes = variant(rms_norm, x, w)
    assert v == "group"
    t = s.traffic(sizes)
    assert (t.read, t.written) == (64 * 4096 * 2 + 4096 * 2, 64 * 4096 * 2)
    src = rms_norm.source(x, w)
    start = src.index("kernel void mf_rms_norm_group")
    group = src[start:src.index("kernel void mf_rms_norm_looped")]
    # 16 halves per thread (32 bytes, as f32's 8): one 16-byte load site (8 halves, two
    # trips) and one guarded scalar site for x, in one load block
    assert group.count("reinterpret_cast<device const mf_pack8<T>*>(x + ") == 1
    assert "for (uint mf_c = 0u; mf_c < 2u; ++mf_c)" in group
    assert group.count("x[mf_row_x") == 1
    assert "T mf_reg_x[16];" in group and "simd_sum" in group and "threadgroup float" in group
    # f32: the same 8 elements per thread as two 16-byte vectors
    x32, w32 = x.float(), w.float()
    src = rms_norm.source(x32, w32)
    group = src[src.index("kernel void mf_rms_norm_group"):]
    assert "for (uint mf_c = 0u; mf_c < 2u; ++mf_c)" in group
    assert "reinterpret_cast<device const vec<T, 4>*>(x + " in group
    assert "mf_pack8" not in src
    # f16 rows of 16384 are still read once (1024 threads of 16); the looped variant re-reads
    # x for the epilogue: its traffic says so
    assert s.traffic({"B": 2, "D": 16384}).read == 2 * 16384 * 2 + 16384 * 2
    assert s.traffic({"B": 2, "D": 16400}).read == 2 * (2 * 16400 * 2) + 16400 * 2


def test_group_rows_over_the_pipeline_limit_run_looped():
    """A group kernel whose pipeline takes fewer threads than a row needs (register pressure
    on a real GPU; here its declared limit) sends those rows to the looped kernel."""
    x = torch.randn(3, 16384, dtype=torch.float16)
    w = torch.randn(16384, dtype=torch.float16)
    assert variant(rms_norm, x, w)[0] == "group"               # 1024 threads of 16 halves
    limit = "[[max_total_threads_per_threadgroup(512)]] kernel void mf_rms_norm_group"
    token = runtime.launcher.MSL_REWRITE.set(
        lambda src: src.replace("kernel void mf_rms_norm_group", limit))
    try:
        for d in (8192, 16384):                                 # 512 threads: still group
            got = rms_norm(x[:, :d], w[:d])
            want = F.rms_norm(x[:, :d].double(), (d,), w[:d].double(), eps=1e-6)
            close(got, want, torch.float16)
        launch = runtime.launcher.bind(runtime.launcher.check_call(
            rms_norm.graph(x, w), {"x": x, "w": w, "eps": 1e-6}, None, None))
        assert launch.host_name == "rms_norm_f16_looped" and launch.group_size == 1024
    finally:
        runtime.launcher.MSL_REWRITE.reset(token)


# staged: rows of whole blocks (32 x R: f32 R = 8, 2-byte types R = 16) above the simd rows
WHOLE = {torch.float32: (512, 8192), torch.float16: (512, 16384), torch.bfloat16: (1024, 16384)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_staged_rows_match_the_reference(dtype):
    """stage_rows=True: rows of whole blocks run the staged kernel (half of each thread's
    block of x read back from threadgroup memory after phase 1), others the group kernel;
    both against float64 torch, special values included."""
    kernels = [(k.with_launch(stage_rows=True), ref) for k, ref in (
        (rms_norm, lambda x, w: F.rms_norm(x.double(), (x.shape[-1],), w.double(), eps=1e-6)),
        (softmax, lambda x, w: torch.softmax(x.double(), -1)))]
    for d in WHOLE[dtype] + (1000,):
        x = special_rows(torch.randn(6, d, dtype=dtype))
        w = torch.randn(d, dtype=dtype)
        for k, ref in kernels:
            args = (x, w) if k.name == "rms_norm" else (x,)
            close(k(*args), ref(x, w), dtype)
            assert variant(k, *args)[0] == ("group" if d == 1000 else "staged")
    ln = layer_norm.with_launch(stage_rows=True)
    x, w, b = (torch.randn(3, 8192, dtype=dtype) * 3 + 1, torch.randn(8192, dtype=dtype),
               torch.randn(8192, dtype=dtype))
    close(ln(x, w, b), F.layer_norm(x.double(), (8192,), w.double(), b.double()), dtype,
          scale=4.0)


def test_staged_kernel_stages_phase_one_inputs_in_half_the_threadgroup_memory():
    x = torch.randn(2, 16384, dtype=torch.float16)
    w, b = torch.randn(16384, dtype=torch.float16), torch.randn(16384, dtype=torch.float16)
    ln = layer_norm.with_launch(stage_rows=True)
    v, s, sizes = variant(ln, x, w, b)
    assert v == "staged" and s.traffic(sizes) == s.traffic(sizes, "group")   # read once
    assert s.staged_rows == (512,)         # check's boundary sizes: its shortest row (16 x 32)
    src = ln.source(x, w, b)
    staged = src[src.index("kernel void mf_layer_norm_staged"):]
    staged = staged[:staged.index("\n}\n")]
    # x's second chunk of 8 halves per thread (1024 threads: 16 KB), not w or b (the epilogue
    # loads them); whole vectors only, no per-element tail
    assert "threadgroup float4 mf_stage_x_mem[1024];" in staged
    assert "mf_stage_w" not in staged and "mf_stage_b" not in staged
    assert "row tail" not in staged and "each element checked" not in staged
    assert 16 * 1024 < s.policy.threadgroup_bytes <= 32 * 1024 // 2 + 1024
    # not built unless asked for (the Metal table), nor where a block is one vector
    assert "_staged" not in layer_norm.source(x, w, b)
    one = layer_norm.with_launch(stage_rows=True, reads_per_thread=4, looped_limit=4096)
    assert "_staged" not in one.source(x.float(), w.float(), b.float())


def test_source_shows_what_the_backend_builds():
    # .source() of a call follows its backend's changes to the table: cuda builds the staged
    # row kernel beside the group kernel, the simulator (the Metal table) does not
    x, w = torch.randn(2, 1024), torch.randn(1024)
    assert "_staged" not in rms_norm.source(x, w)
    with runtime.backend("cuda"):
        src = rms_norm.source(x, w)
    assert "kernel void mf_rms_norm_staged" in src and "kernel void mf_rms_norm_group" in src


def test_launcher_takes_the_staged_kernel_where_twice_the_groups_share_a_core(monkeypatch):
    """stage_rows=None: the staged kernel where the backend says at least twice as many of
    its threadgroups share a core as the group kernel's (the simulator says nothing: group)."""
    from metalforge.sim.library import LibraryFunction
    x = torch.randn(2, 8192, dtype=torch.float16)
    w = torch.randn(8192, dtype=torch.float16)
    k = rms_norm.with_launch(stage_rows=None)

    def host(*args):
        return k.launches(*args)[0][0]
    assert host(x, w) == "rms_norm_f16_group"
    for staged, group, want in ((2, 1, "staged"), (4, 2, "staged"), (3, 2, "group")):
        monkeypatch.setattr(LibraryFunction, "groups_per_core", lambda self, n, s=staged,
                            g=group: s if self._sig.host_name.endswith("_staged") else g,
                            raising=False)
        assert host(x, w) == f"rms_norm_f16_{want}"
        assert host(x[:, :1000], w[:1000]) == "rms_norm_f16_group"    # not whole blocks
    close(k(x, w), F.rms_norm(x.double(), (8192,), w.double(), eps=1e-6), torch.float16)


def test_launcher_regroups_the_looped_kernel_where_more_threads_share_a_core(monkeypatch):
    """The looped kernel reads its group size at run time: the launcher runs it in groups of
    half the threads where the backend says that keeps half again as many threads on a core
    (one group of 1024 -> three of 512), not where it keeps as many (two -> four); the
    simulator says nothing (1024). Either way the result is the reference's."""
    from metalforge.sim.library import LibraryFunction
    x, w, b = torch.randn(3, 9000), torch.randn(9000), torch.randn(9000)
    k = layer_norm.with_launch(looped_limit=2048, fill_groups=0)
    (host, threads, group), = k.launches(x, w, b)
    assert (host, threads, group) == ("layer_norm_f32_looped", 3 * 1024, 1024)
    want = F.layer_norm(x.double(), (9000,), w.double(), b.double(), eps=1e-5)
    for fits, tpg in (({1024: 1, 512: 3}, 512), ({1024: 2, 512: 4}, 1024),
                      ({1024: 1, 512: 3, 256: 6}, 512)):
        monkeypatch.setattr(LibraryFunction, "groups_per_core",
                            lambda self, n, f=fits: f.get(n, 0), raising=False)
        assert k.launches(x, w, b) == (("layer_norm_f32_looped", 3 * tpg, tpg),)
        close(k(x, w, b), want, torch.float32)


def test_softmax_keeps_exp_in_registers():
    x = torch.randn(4, 1000)
    src = softmax.source(x)
    group = src[src.index("kernel void mf_softmax_group"):src.index("kernel void mf_softmax_loo")]
    phase2, epilogue = group.split("// epilogue")
    assert "precise::exp(" in phase2 and "float mf_keep2[8];" in phase2
    assert "precise::exp(" not in epilogue and "mf_keep2[mf_k] * mf_r1" in epilogue
    assert "const float mf_r1 = mf_divide(1.0f, mf_acc2);" in epilogue   # one division a row
    close(softmax(x), torch.softmax(x.double(), dim=-1), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_nan_inf_rows(dtype):
    for d in ROWS:
        x = special_rows(torch.randn(2, 4, d, dtype=torch.float32)).to(dtype)
        want = torch.softmax(x.double(), dim=-1)
        close(softmax(x), want, dtype)
    x = special_rows(torch.randn(6, 300, dtype=torch.float32)).to(dtype)
    assert variant(softmax_looped, x)[0] == "looped"       # online max + sum in one pass
    close(softmax_looped(x), torch.softmax(x.double(), dim=-1), dtype)
    assert "mf_online_add" in softmax.source(x)


@mf.kernel(name="log_softmax", launch={"looped_limit": 128})
def log_softmax_looped(x: "T[R, D]"):
    return mf.log_softmax(x, axis="D")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("threads", [1024, 64], ids=["one_chunk", "four_chunks"])
def test_online_pass_folds_whole_chunks(dtype, threads):
    """The looped variant folds each thread's chunk of 4 into the running (max, sum) at once:
    rows whose max grows inside chunks and across them, -inf up to the last element, +inf and
    NaN at each position of a chunk, a partial last chunk (D = 1001), one chunk per thread
    (1024 threads) or four (64), and a long row, all as torch."""
    launch = {"threads_per_group": threads}
    soft, logsoft = softmax_looped.with_launch(**launch), log_softmax_looped.with_launch(**launch)
    d = 1001
    x = torch.randn(12, d)
    x[0] = torch.arange(d) / 10.0              # the max grows at every element
    x[1] = -torch.arange(d) / 10.0             # the first element is the max
    x[2] = -INF
    x[2, -1] = 1.0                             # everything -inf but the (tail) last element
    x[3] = -INF
    x[3, 300:304] = 2.0                        # one chunk holds everything
    for i, at in enumerate((0, 1, 2, 3)):
        x[4 + i, 400 + at] = INF if i % 2 else NAN
    x[8, 1000] = NAN                           # in the partial last chunk
    x[9, ::2] = -INF
    x = x.to(dtype)
    assert variant(soft, x)[0] == "looped"
    assert "mf_online_add_chunk(" in soft.source(x)
    xd = x.double()
    close(soft(x), torch.softmax(xd, dim=-1), dtype)
    close(logsoft(x), torch.log_softmax(xd, dim=-1), dtype)
    long = torch.randn(2, 100003) * 3
    close(soft(long), torch.softmax(long.double(), dim=-1), torch.float32)
    # the running max itself is an output: NaN at any chunk position makes it NaN
    m, lse = max_and_lse.with_launch(looped_limit=128, **launch)(x)
    assert m[4:8:2].isnan().all() and m[8].isnan()
    close(m, xd.amax(-1), dtype)
    close(lse, max_and_lse.reference(x)[1], dtype)


def test_softmax_online_pass_count():
    x = torch.randn(2, 300)
    _, s, sizes = variant(softmax_looped, x)
    assert s.traffic(sizes).read == 2 * 2 * 300 * 4        # two passes: online max+sum, write


def test_long_row_f32():
    x = torch.randn(1, 65537)
    x[0, :1000] = -INF
    close(softmax(x), torch.softmax(x.double(), dim=-1), torch.float32)


def test_log_softmax_and_logsumexp():
    for d in (1, 33, 4097):
        x = special_rows(torch.randn(6, d))
        close(log_softmax(x), torch.log_softmax(x.double(), dim=-1), torch.float32)
        close(logsumexp(x), torch.logsumexp(x.double(), dim=-1), torch.float32)
    x = special_rows(torch.randn(6, 100)).half()
    close(logsumexp(x), torch.logsumexp(x.double(), dim=-1), torch.float16)


# rows of up to 256 elements: the simd variant gives each row the fewest lanes (a power of two)
# holding it at 8 elements a lane, so several rows share a simdgroup and combine by an xor
# butterfly over their own lanes; rows those lanes cover exactly (8, 64, 256) take the
# simd_exact kernel (no row-end checks; f32 lanes' chunks interleaved along the row)
SHORT = (1, 2, 7, 8, 9, 17, 64, 96, 129, 256)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_short_rows_share_a_simdgroup(dtype):
    for d in SHORT:
        for rows in (1, 5, 37):             # 37: the last simdgroup's rows past the end return
            x = torch.randn(rows, d).to(dtype)
            v, s, sizes = variant(softmax, x)
            w = s.lanes_per_row(d)
            assert w == min(32, 1 << max(0, math.ceil(d / 8) - 1).bit_length())
            assert v == ("simd_exact" if d == 8 * w else "simd")
            assert s.launch(sizes)[0] == rows * w
            if rows >= 5:
                special_rows(x)
            xd = x.double()
            close(softmax(x), torch.softmax(xd, dim=-1), dtype)
            close(log_softmax(x), torch.log_softmax(xd, dim=-1), dtype)
            mx, mn, sm, _ = stats(x)
            close(mx, xd.amax(-1), dtype)
            close(mn, xd.amin(-1), dtype)
            close(sm, xd.sum(-1), dtype, scale=4)
            ties = torch.randint(-3, 4, (rows, d)).to(dtype)
            ties[0, d // 2] = NAN
            amax, amin = arg(ties)
            assert torch.equal(amax, ties.argmax(-1)) and torch.equal(amin, ties.argmin(-1))


@mf.kernel
def ramp(x: "T[R, D]"):                     # each element's position matters
    y = x * (mf.index("D") + 1)
    return y - mf.max(y, axis="D"), mf.argmax(y, axis="D")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_exact_rows_keep_each_element_at_its_position(dtype):
    """The simd_exact kernel spreads an f32 lane's chunks along the row (f16 lanes hold one
    chunk): every element still meets its own mf.index, is stored where it was read, and
    argmax reports its position."""
    for d in (8, 32, 64, 128, 256):
        x = torch.randn(37, d).to(dtype)
        assert variant(ramp, x)[0] == "simd_exact"
        y, i = ramp(x)
        yd = x.double() * torch.arange(1, d + 1, dtype=torch.float64)
        close(y, yd - yd.amax(-1, keepdim=True), dtype)
        assert torch.equal(i, yd.argmax(-1))


@mf.kernel
def max_and_lse(x: "T[R, D]"):             # the max is an output of its own
    m = mf.max(x, axis="D")
    return m, mf.log(mf.sum(mf.exp(x - m), axis="D")) + m


@mf.kernel
def gated_shift(x: "T[R, D]"):             # where() hides the sum's NaN from the output
    m = mf.max(x, axis="D")
    s = mf.sum(mf.exp(x - m), axis="D")
    return mf.where(s > 0.0, 0.0, x - m)


def test_max_skips_nan_only_where_the_sum_carries_it():
    x = special_rows(torch.randn(6, 100))
    # softmax / log_softmax: a NaN element makes sum(exp(x - max)) and every output NaN, so
    # the max may skip NaN (Metal's fmax / simd_max); the outputs are still all NaN
    for k, ref in ((softmax, torch.softmax), (log_softmax, torch.log_softmax)):
        src = k.source(x)
        assert "fmax(mf_acc1" in src and "mf_maximum" not in src
        y = k(x)
        assert y[2].isnan().all()
        close(y, ref(x.double(), dim=-1), torch.float32)
    # the max is an output, or where() decides on the sum: NaN-propagating max as before
    for k in (max_and_lse, gated_shift):
        assert "mf_maximum" in k.source(x) and "fmax(" not in k.source(x)
    m, lse = max_and_lse(x)
    assert m[2].isnan() and lse[2].isnan()
    close(m, x.double().amax(-1), torch.float32)
    close(lse, max_and_lse.reference(x)[1], torch.float32)
    close(gated_shift(x), gated_shift.reference(x), torch.float32)
    assert gated_shift(x)[2].isnan().all()      # x - max, all NaN: the max itself is NaN


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layer_norm(dtype):
    for d in (1, 33, 4097):
        x = (torch.randn(5, d) * 3 + 1).to(dtype)
        w, b = torch.randn(d, dtype=dtype), torch.randn(d, dtype=dtype)
        want = F.layer_norm(x.double(), (d,), w.double(), b.double(), eps=1e-5)
        close(layer_norm(x, w, b), want, dtype, scale=2)


def test_add_rms_norm_two_outputs():
    for d in (31, 2048, 5000):
        x = torch.randn(2, 3, d, dtype=torch.float16)
        r = torch.randn(2, 3, d, dtype=torch.float16)
        w = torch.randn(d, dtype=torch.float16)
        h, y = add_rms_norm(x, r, w)
        hd = x.double() + r.double()
        close(h, hd, torch.float16)
        close(y, F.rms_norm(hd.half().double(), (d,), w.double(), eps=1e-6), torch.float16,
              scale=2)


@mf.kernel
def add_softmax(x: "T[*B, D]", r: "T[*B, D]"):
    h = x + r
    return h, mf.softmax(h, axis="D")


@mf.kernel
def select_norm(x: "T[*B, D]", r: "T[*B, D]", m: "bool[*B, D]"):
    h = mf.where(m, x, r)
    return h * mf.rsqrt(mf.mean(h * h, axis="D") + 1e-5), h * 2.0


def _group_kernel(kernel, *args):
    src = kernel.source(*args)
    group = src[src.index(f"kernel void mf_{kernel.name}_group"):]
    return group[:group.index("\n}\n")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_computed_values_are_held_instead_of_their_inputs(dtype):
    """h = x + r is held in registers past the first phase in place of x and r (one block,
    not two), and stored by the first phase (it needs no reduction): as the argument a later
    phase reuses (softmax's max of h) or carried for the epilogue (add_rms_norm's sum of
    h * h); every variant, row tails and special values against float64 torch."""
    x, r, w = (torch.randn(2, 1000, dtype=dtype) for _ in range(3))
    for kernel, args, held in ((add_softmax, (x, r), "mf_keep1"),
                               (add_rms_norm, (x, r, w[0]), "mf_carry1")):
        phase1, later = _group_kernel(kernel, *args).split("// phase 2" if kernel is add_softmax
                                                           else "// epilogue")
        assert f"float {held}[" in phase1 and "mf_out0 + mf_row_mf_out0" in phase1
        assert f"{held}[mf_k]" in later and "mf_out0" not in later
        assert "mf_reg_x" not in later and "mf_reg_r" not in later
    # nor is x or r read again: nothing to stage, no staged kernel
    x, r, w = (torch.randn(3, WHOLE[dtype][1], dtype=dtype) for _ in range(3))
    assert "_staged" not in add_rms_norm.with_launch(stage_rows=True).source(x, r, w[0])
    # three inputs held as one value; an output with a constant in it stored early too
    x, r, m = torch.randn(2, 1000, dtype=dtype), torch.randn(2, 1000, dtype=dtype), \
        torch.rand(2, 1000) < 0.5
    phase1, later = _group_kernel(select_norm, x, r, m).split("// epilogue")
    assert "float mf_carry1[" in phase1 and "mf_out1 + mf_row_mf_out1" in phase1
    assert not any(f"mf_reg_{t}[" in later for t in "xrm") and "mf_out1" not in later
    for d in ROWS:
        x = special_rows(torch.randn(6, d, dtype=dtype))
        r, w = torch.randn(6, d, dtype=dtype), torch.randn(d, dtype=dtype)
        m = torch.rand(6, d) < 0.5
        y, h2 = select_norm(x, r, m)
        hs = torch.where(m, x, r).double()
        close(h2, hs * 2, dtype)
        close(y, F.rms_norm(hs, (d,), eps=1e-5), dtype, scale=2)
        hd = x.double() + r.double()
        h, y = add_softmax(x, r)
        close(h, hd, dtype)
        close(y, torch.softmax(hd, -1), dtype)
        h, y = add_rms_norm(x, r, w)
        close(h, hd, dtype)
        close(y, F.rms_norm(hd, (d,), w.double(), eps=1e-6), dtype, scale=2)


def test_max_min_sum_prod_propagate_nan_and_inf():
    for d in (1, 31, 33, 4097):
        # values in 1 +- w/2 with w = min(1, 4/d): every partial product of a row stays within
        # exp(+-2) (for d = 4097; 1.5^33 and 0.5^33 for the short rows), so fp32 neither
        # underflows to 0 (then 0 * inf = NaN where float64 says inf) nor overflows
        x = special_rows(1 + (torch.rand(7, d) - 0.5) * min(1.0, 4 / d))
        mx, mn, sm, pr = stats(x)
        xd = x.double()
        want = xd.prod(-1)
        assert (want[5:].abs() > 1e-12).all() and want[5:].isfinite().all()
        close(mx, xd.amax(-1), torch.float32)
        close(mn, xd.amin(-1), torch.float32)
        close(sm, xd.sum(-1), torch.float32, scale=10)
        close(pr, want, torch.float32, scale=100)
        # NaN and +-inf propagate through the product as in torch
        assert pr[2].isnan() and pr[3] == INF and pr[0] == (-INF if d % 2 else INF)
        assert pr[1] == (-INF if max(1, d // 3) % 2 else INF)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32], ids=str)
def test_argmax_argmin_first_index_ties_and_nan(dtype):
    for d in (1, 31, 33, 4097):
        x = torch.randint(-3, 4, (6, d)).float()                # many ties
        if dtype.is_floating_point:
            x[0] = -INF
            x[1, d // 2] = NAN
            x[1, d - 1] = NAN
            x[2, -1] = INF
        x = x.to(dtype)
        amax, amin = arg(x)
        assert torch.equal(amax, x.argmax(-1)) and torch.equal(amin, x.argmin(-1))
    x = torch.randint(-3, 4, (4, 700)).float().to(dtype)
    assert variant(arg_looped, x)[0] == "looped"
    amax, amin = arg_looped(x)
    assert torch.equal(amax, x.argmax(-1)) and torch.equal(amin, x.argmin(-1))


# --------------------------------------------------------------------------- column

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_column_sum_short_tall_and_strided(dtype):
    seen = set()
    for r, d in ((1, 1), (5, 33), (1000, 33), (300, 70), (300, 64)):
        x = torch.randn(d, r, dtype=dtype).t()                  # non-contiguous
        close(column_sum(x), x.double().sum(0), dtype, scale=max(1, r / 10))
        seen.add(variant(column_sum, x)[0])
    assert seen == {"column", "split", "wide"}        # wide: D a multiple of its columns


def test_column_softmax_and_argmax():
    for r in (3, 1000):                                       # column; split (online merge)
        x = torch.randn(r, 37)
        x[:, 0] = -INF
        x[: r // 2, 1] = -INF
        x[r // 3, 2] = NAN
        x[1, 3] = INF
        close(column_softmax(x), torch.softmax(x.double(), dim=0), torch.float32)
        t = torch.randint(-2, 3, (r, 37)).float()
        t[:, 0] = -INF
        t[r // 2, 1] = NAN
        t[r - 1, 1] = NAN
        amax, amin = column_arg(t)
        assert torch.equal(amax, t.argmax(0)) and torch.equal(amin, t.argmin(0))


def test_long_sums_stay_accurate_like_torch():
    """A thread that adds many values in fp32 one after another loses ~n*eps (at 262145 equal
    rows: 264296 for 264382); the sequential loops compensate their sums, as torch's cascade
    sum is accurate: every row equal, so rounding errors all have the same sign."""
    vals = torch.tensor([1.0085, 0.1, -3.3, 7.77])
    x = vals.expand(262145, 4).contiguous()
    assert variant(column_sum, x)[0] == "wide"             # 4 columns a thread, chunked
    want = x.double().sum(0)
    close(column_sum(x), want, torch.float32)
    assert torch.allclose(column_sum(x).double(), torch.sum(x, 0).double(), rtol=2e-6, atol=0)
    x[0] = 2.0                                # softmax's (online) sum of exp over the column
    close(column_softmax(x[:, :3]), torch.softmax(x[:, :3].double(), dim=0), torch.float32)
    # the looped row variant: 4M elements per row, 4096 per thread
    y = vals[:, None].expand(4, 1 << 22).contiguous()
    y[2, 7] = INF
    y[3, 9] = NAN
    sm = stats(y)[2]
    assert variant(stats, y)[0] == "looped"
    close(sm, y.double().sum(-1), torch.float32)
    y[:, 0] = 2.0
    close(logsumexp(y), torch.logsumexp(y.double(), dim=-1), torch.float32)


def test_column_reduction_of_a_middle_axis():
    for r in (4, 600):
        x = torch.randn(3, r, 10)
        s = torch.randn(3, 10)
        close(middle_mean(x, s), x.double().mean(1) * s.double(), torch.float32)


# --------------------------------------------------------------------------- column chunks
# chunk_rows=16 splits the reduced axis at small sizes: chunks of whole steps of the group
# (8 slices x 4 rows = 32 rows), so 33 rows are a chunk of 32 and one of 1

@mf.kernel(launch={"chunk_rows": 16})
def column_stats(x: "T[R, D]"):
    m = mf.max(x, axis="R")                           # with sum(exp(x - m)): an online pair
    return (mf.sum(x, axis="R"), m, mf.min(x, axis="R"), mf.prod(x, axis="R"),
            mf.mean(x, axis="R"), m + mf.log(mf.sum(mf.exp(x - m), axis="R")))


@mf.kernel(launch={"chunk_rows": 16})
def column_arg_chunks(x: "T[R, D]"):
    return mf.argmax(x, axis="R"), mf.argmin(x, axis="R")


def chunking(kernel, x):
    """(variant, chunks, launches) of the call kernel(x)."""
    v, s, sizes = variant(kernel, x)
    return v, s.chunks(sizes), len(s.steps(sizes))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_column_chunks_at_their_boundaries(dtype):
    """Against the reference: reduced length 1 and the column kernel's last; one chunk (the
    split/wide kernel stores the outputs); a partial last chunk of one row; many chunks;
    columns a multiple of the wide kernel's (2 f32, 4 f16) or not (split, one column a
    thread); a column block with one live column."""
    seen = set()
    for r, d in ((1, 8), (16, 3), (17, 8), (32, 6), (33, 8), (33, 7), (200, 12), (259, 33),
                 (70, 1)):
        x = (torch.rand(r, d) + 0.5).to(dtype)
        got, want = column_stats(x), column_stats.reference(x)
        for g, w in zip(got, want):
            close(g, w.double(), dtype, scale=max(1, r / 10))
        v, chunks, launches = chunking(column_stats, x)
        assert launches == (2 if chunks > 1 else 1)
        seen.add((v, chunks > 1))
        assert torch.equal(got[1], x.amax(0)) and torch.equal(got[2], x.amin(0))
    assert {("column", False), ("split", True), ("wide", True), ("wide", False)} <= seen, seen


@pytest.mark.parametrize("d", (7, 8), ids=("split", "wide"))
def test_column_argmax_ties_and_nans_across_chunks(d):
    """The first index wins across chunk boundaries (rows 31 | 32 | 64 | 96 start chunks):
    ties, a NaN in a later chunk than another, the extreme only in the partial last chunk."""
    r = 100
    t = torch.zeros(r, d)
    t[[31, 32, 99], 1] = 1.0                          # max tied across chunks 0 and 1
    t[[96, 64], 1] = -1.0                             # min tied across chunks 2 and 3
    t[[70, 40], 2] = NAN                              # first NaN wins both
    t[99, 3] = 5.0                                    # only in the last (partial) chunk
    t[98, 3] = -INF
    t[:, 4] = -INF                                    # all -inf: index 0
    amax, amin = column_arg_chunks(t)
    v, chunks, _ = chunking(column_arg_chunks, t)
    assert (v, chunks) == ({7: "split", 8: "wide"}[d], 4)
    assert torch.equal(amax, t.argmax(0)) and torch.equal(amin, t.argmin(0))
    ref_max, ref_min = column_arg_chunks.reference(t)
    assert torch.equal(amax, ref_max) and torch.equal(amin, ref_min)
    assert (amax[1], amin[1], amax[2], amin[2], amax[3], amin[3]) == (31, 64, 40, 40, 99, 98)


@pytest.mark.parametrize("d", (7, 8), ids=("split", "wide"))
def test_column_blocked_folds_and_many_chunks(d):
    """41 chunks of 32 rows (the combine kernel's slices take whole steps of 4 chunks, then
    single ones); a step's 4 values of a sum added before one compensated add, of a max / min
    taken with fmax / fmin and a NaN put back: NaN at each row of a step and in the partial
    last chunk, +inf and -inf in one step (max inf, min -inf, sum NaN as torch), large values
    cancelling across chunks. Checked against torch directly; the same bits on a second call."""
    r = 41 * 32 - 5
    x = torch.randn(r, d, generator=torch.Generator().manual_seed(3))
    for j, row in enumerate((0, 1, 2, 3)):            # NaN at each position of a step
        x[row + 64 * j, 1 + j % 2] = NAN
    x[r - 1, 3] = NAN                                 # in the partial last chunk
    x[[200, 201], 4] = torch.tensor([INF, -INF])
    x[[5, 900], 5] = torch.tensor([1e7, -1e7])        # cancel: the rest must survive
    got = column_stats(x)
    v, chunks, _ = chunking(column_stats, x)
    assert (v, chunks) == ({7: "split", 8: "wide"}[d], 41)
    nan = x.isnan().any(0)
    assert torch.equal(got[1].isnan(), nan) and torch.equal(got[2].isnan(), nan)
    assert torch.equal(got[1][~nan], x.amax(0)[~nan]) and got[1][4] == INF
    assert torch.equal(got[2][~nan], x.amin(0)[~nan]) and got[2][4] == -INF
    want = x.double().sum(0)
    assert torch.equal(got[0].isnan(), want.isnan())
    ok = ~want.isnan()
    # within a few fp32 roundings of the step blocks' magnitudes (sum |x|), the cancelling
    # column included; the long sum over blocks compensated
    bound = 8 * 2.0 ** -24 * x.double().abs().nan_to_num(posinf=0).sum(0)
    assert ((got[0][ok].double() - want[ok]).abs() <= bound[ok]).all()
    again = column_stats(x)[0]                        # deterministic: the same bits
    assert torch.equal(again.nan_to_num(), got[0].nan_to_num())


def test_column_wide_needs_whole_vectors_and_plain_tensors():
    """The wide kernel takes columns a multiple of its vector and tensors whose columns are
    contiguous; a per-column input without the reduced axis keeps the split kernel (chunked);
    an unaligned start is copied before the vector loads."""
    x = torch.randn(300, 10)
    assert chunking(column_sum, x)[0] == "wide"
    assert chunking(column_sum, torch.randn(300, 9))[0] == "split"
    v, s, _ = variant(middle_mean, torch.randn(3, 300, 8), torch.randn(3, 8))
    assert v == "split" and "wide" not in s.variants and "combine" in s.variants
    y = torch.randn(300 * 10 + 1)[1:].view(300, 10)   # storage offset 1
    close(column_sum(y), y.double().sum(0), torch.float32, scale=30)


# --------------------------------------------------------------------------- edges and errors

def test_empty_reductions_like_torch():
    assert torch.equal(column_sum(torch.empty(0, 5)), torch.zeros(5))
    assert rms_norm(torch.empty(3, 0), torch.empty(0)).shape == (3, 0)
    assert logsumexp(torch.empty(0, 4)).shape == (0,)
    with pytest.raises(ValueError, match=r"mf\.max.*empty axis \(D = 0\)"):
        logsumexp(torch.empty(3, 0))


def test_launch_policy_is_validated():
    x = torch.randn(2, 8)
    with pytest.raises(LaunchError, match="rows_per_group=64"):
        mf.kernel(launch={"rows_per_group": 64})(softmax.fn)(x)
    with pytest.raises(LaunchError, match="looped_limit=16384"):
        mf.kernel(launch={"looped_limit": 16384})(softmax.fn)(x)
    with pytest.raises(LaunchError, match="reads_per_thread=32: over 16 values"):
        mf.kernel(launch={"reads_per_thread": 32})(softmax.fn)(x)
    with pytest.raises(LaunchError, match="simd_reads_per_thread=6 must be a multiple"):
        mf.kernel(launch={"simd_reads_per_thread": 6})(softmax.fn)(x)
    with pytest.raises(LaunchError, match="multiple of 32"):
        mf.kernel(launch={"threads_per_group": 100, "looped_limit": 64})(softmax.fn)(x)
    with pytest.raises(LaunchError, match="do not apply to a row kernel"):
        mf.kernel(launch={"vectors_per_thread": 2})(softmax.fn)(x)


def test_unsupported_reductions_say_what_and_where():
    @mf.kernel
    def isum(x: "i32[R, D]"):
        return mf.sum(x, axis="D")

    with pytest.raises(UnsupportedConstruct, match=r"mf\.sum.*test_reductions\.py:\d+.*integer "
                                                   r"sums.*x\.to\(mf\.f32\)"):
        isum(torch.ones(2, 3, dtype=torch.int32))
