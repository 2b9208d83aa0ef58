"""The quantized schedule's second tiled kernel (`qmm_wide`: the matrix block with its own
tile and teams, schedule/quant/build.py), which the host launches instead of `qmm` from
`qmm_wide_rows` rows of x on (QuantSchedule.variant): one library, the kernel picked per call.
Against torch computed directly: codes dequantized with torch ops, rounded to x's type (what
the matrix block multiplies), then a float64 matmul."""
from __future__ import annotations

import pytest
import torch

import metalforge as mf
from metalforge import quant, runtime
from metalforge.schedule.policy import backend_launch
from metalforge.testing import check

WIDE_FROM = 40              # not a multiple of either tile: both kernels' last tiles partial


@mf.kernel(launch={"qmm_min_rows": 8, "qmm_wide_rows": WIDE_FROM})
def q4_linear(wq: "u32[N, K/8]", scales: "T[N, K/GS]", biases: "T[N, K/GS]", x: "T[M, K]",
              GS: mf.Const[int] = 64) -> "T[M, N]":
    return mf.sum((mf.unpack(wq, bits=4) * scales + biases) * x, axis="K")


def _weights(n: int, k: int, dt: torch.dtype, seed: int):
    """Packed random codes, their scales and biases in dt, and the weight they give rounded
    to dt (fp32 arithmetic, as the kernel dequantizes), computed directly."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g)
    s = (torch.rand(n, k // 64, generator=g) * 0.1 + 0.02).to(dt)
    b = (torch.randn(n, k // 64, generator=g) * 0.1).to(dt)
    w = codes.float() * s.float().repeat_interleave(64, 1) + b.float().repeat_interleave(64, 1)
    return quant.pack(codes, bits=4), s, b, w.to(dt)


@pytest.mark.parametrize("dt,target", [(torch.float16, "apple9"), (torch.bfloat16, "apple10")])
def test_the_tile_switches_at_qmm_wide_rows(dt, target):
    """M = 39: qmm (64 x 64 tiles, a partial one of rows of x); M = 40: qmm_wide (128 x 128,
    one team, partial in both); N = 70 partial in each, K = 128 four steps. One library holds
    both, each launched with its own grid."""
    wq, s, b, w = _weights(70, 128, dt, seed=11)
    with mf.target(target):
        for m, variant, grid in ((WIDE_FROM - 1, "qmm", 2 * 1 * 128),
                                 (WIDE_FROM, "qmm_wide", 1 * 1 * 128)):
            x = torch.randn(m, 128, generator=torch.Generator().manual_seed(m)).to(dt)
            host, threads, group = q4_linear.launches(wq, s, b, x)[0]
            assert host.endswith(f"_{variant}") and (threads, group) == (grid, 128)
            want = x.double() @ w.double().T
            torch.testing.assert_close(q4_linear(wq, s, b, x).double(), want, rtol=1e-2,
                                       atol=1e-2)


def test_check_selects_each_tiled_kernel():
    """check's sizes: qmm below qmm_wide_rows, qmm_wide from it (a partial 128 x 128 tile of
    each, two steps along K); the same source as the f16 case above (compiled once)."""
    s = runtime.schedule_of(q4_linear.graph(T="f16"), launch=q4_linear.launch,
                            sizes={"M": 1, "N": 8, "K": 128, "K/8": 16, "K/64": 2})
    assert s.tiles == {"qmm": (64, 64, 32, 128), "qmm_wide": (128, 128, 32, 128)}
    assert s.selecting(s.variants["qmm"].host_name) == [{"K": 64, "N": 65, "M": 8}]
    assert s.selecting(s.variants["qmm_wide"].host_name) == [{"K": 64, "N": 129, "M": 40}]
    report = check(q4_linear, max_examples=1, dtypes={"T": "f16"}, layouts=False)
    assert "M=40" in report.coverage() and "_qmm_wide" in report.coverage()


def test_which_calls_have_the_wide_kernel():
    """Built only where asked (qmm_wide_rows > 0: the cuda table's 128) and where x is half or
    bfloat (the fp32 kernel has one tile); never below qmm_min_rows."""
    assert backend_launch("cuda", "quant")["qmm_wide_rows"] == 128

    def names(kernel, **bind) -> set[str]:
        src = kernel.source(**bind)
        return {n for n in ("qmm", "qmm_wide") if f"kernel void mf_q4_linear_{n}(" in src}
    assert names(q4_linear, T="f16") == {"qmm", "qmm_wide"}
    assert names(q4_linear.with_launch(qmm_wide_rows=0), T="f16") == {"qmm"}
    assert names(q4_linear, T="f32") == {"qmm"}
    s = runtime.schedule_of(q4_linear.graph(T="f16"),
                            launch={**q4_linear.launch, "qmm_min_rows": 64},
                            sizes={"M": 1, "N": 8, "K": 128, "K/8": 16, "K/64": 2})
    assert s.wide_rows == 64 and s.variant({"M": 64, "N": 8, "K": 128}) == "qmm_wide"
    assert s.selecting(s.variants["qmm"].host_name) == []       # qmm_wide takes all its rows


def test_the_wide_kernel_waits_for_a_grid_of_qmm_wide_groups():
    """With qmm_wide_groups (the cuda table's 96) the wide tile runs only where its grid has
    that many threadgroups: 4096 weight rows are 32 tiles of 128, so M = 256 (2 tiles of rows
    of x: 64 groups) stays on qmm and M = 512 (128 groups) goes wide; check's sizes for
    qmm_wide make such a grid (96 tiles of weight rows, the last partial, at M = 40)."""
    assert backend_launch("cuda", "quant")["qmm_wide_groups"] == 96
    s = runtime.schedule_of(q4_linear.graph(T="f16"),
                            launch={**q4_linear.launch, "qmm_wide_groups": 96},
                            sizes={"M": 1, "N": 8, "K": 128, "K/8": 16, "K/64": 2})
    at = {"N": 4096, "K": 4096}
    assert [s.variant({**at, "M": m}) for m in (256, 512)] == ["qmm", "qmm_wide"]
    assert s.variant({"N": 14336, "K": 4096, "M": 128}) == "qmm_wide"      # 112 groups
    assert s.selecting(s.variants["qmm_wide"].host_name) == [{"K": 64, "N": 95 * 128 + 1,
                                                              "M": 40}]
    with pytest.raises(mf.LaunchError, match=r"qmm_wide_groups must be an int >= 0"):
        q4_linear.with_launch(qmm_wide_groups=-1).source(T="f16")


def test_wide_option_errors():
    with pytest.raises(mf.LaunchError, match="qmm_wide_tile_m must be 32, 64 or 128, got 48"):
        q4_linear.with_launch(qmm_wide_tile_m=48).source(T="f16")
    with pytest.raises(mf.LaunchError, match="qmm_wide_splits must be 1, 2 or 4, got 3"):
        q4_linear.with_launch(qmm_wide_splits=3).source(T="f16")
    with pytest.raises(mf.LaunchError, match=r"qmm_wide_rows must be an int >= 0 \(0: never"):
        q4_linear.with_launch(qmm_wide_rows=-1).source(T="f16")
    with pytest.raises(mf.LaunchError, match=r"qmm_wide_tile_m=128 x qmm_wide_tile_n=128 x "
                       r"qmm_tile_k=32 with qmm_wide_splits=2 needs 65536 bytes"):
        q4_linear.with_launch(qmm_wide_splits=2).source(T="f16")


def test_cuda_translation_of_the_cuda_table_passes_host_syntax_check(tmp_path):
    """The cuda backend's table (64 x 32 tiles in 4 teams, 128 x 128 from 128 rows of x):
    both tiled kernels in one translation, each with its own launch bounds and threadgroup
    arrays, read as C++ against the shim's headers."""
    from metalforge.cuda.translate import translate

    from ..cuda_host import assert_host_syntax
    with mf.target("cuda"):
        src = q4_linear.with_launch(**backend_launch("cuda", "quant")).source(T="bf16")
    wide = src[src.index("kernel void mf_q4_linear_qmm_wide("):]
    assert "threadgroup bfloat mf_as[4096];" in wide and "matmul2d" in wide
    qmm = src[src.index("kernel void mf_q4_linear_qmm("):src.index("kernel void "
                                                                     "mf_q4_linear_qmm_wide(")]
    assert "threadgroup bfloat mf_shared[" in qmm and "mf_team" in qmm
    assert_host_syntax(translate(src).text, tmp_path, metal_version=400)
