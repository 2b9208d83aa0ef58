"""The elementwise schedule's two widths: 8 elements a thread (one 16-byte access of 2-byte
values) and, for grids of fewer than `small_grid` elements, the `small` kernel at 4. Which one a
call launches at the Metal table's and the cuda backend's thresholds, both against torch through
the simulator (tails and broadcast or gathered inputs included), and `check` covering both."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import metalforge as mf
from metalforge.schedule import policy
from metalforge.testing import check

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from rope import rope, torch_rope  # noqa: E402
from silu import silu  # noqa: E402


@mf.kernel
def scaled_tanh(x: "T[R, D]", s: "f32[R]"):          # an f32 input read once per row
    return mf.tanh(x * s).to("T")


def test_thresholds_of_the_tables():
    assert policy.POLICIES["elementwise"].small_grid == 1 << 19
    assert policy.backend_launch("cuda", "elementwise") == {"small_grid": 1 << 21}


@pytest.mark.parametrize("small_grid", [1 << 19, 1 << 21])
def test_small_kernel_below_small_grid(small_grid):
    """Just below the threshold the small kernel, 4 elements a thread; from it the wide one, 8;
    f32 (4 a vector already) has one kernel."""
    view = silu.with_launch(small_grid=small_grid)
    below = torch.empty(small_grid // 1024, 1024 - 1, dtype=torch.float16)
    at = torch.empty(small_grid // 1024, 1024, dtype=torch.float16)
    ((host, threads, _),) = view.launches(below)
    assert host == "silu_f16_small" and threads == -(-below.numel() // 4)
    ((host, threads, _),) = view.launches(at)
    assert host == "silu_f16" and threads == at.numel() // 8
    ((host, threads, _),) = view.launches(below.float())
    assert host == "silu_f32" and threads == -(-below.numel() // 4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,d", [(3, 40), (5, 37), (4, 64), (1, 9)])
def test_both_widths_match_torch(dtype, rows, d):
    """Each kernel at sizes with and without a tail: silu; a tanh scaled by an f32 value per
    row (not read as vectors, so it does not narrow the 16-byte accesses); RoPE (int32
    positions)."""
    g = torch.Generator().manual_seed(rows * d)
    x = torch.randn(rows, d, generator=g).to(dtype)
    s = torch.randn(rows, generator=g)
    q = torch.randn(1, 2, rows, 2 * d, generator=g).to(dtype)
    pos = torch.randint(0, 512, (1, rows), generator=g, dtype=torch.int32)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    tag = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    for small_grid, suffix in ((x.numel() + 1, "_small"), (x.numel(), "")):
        k_silu, k_tanh = silu.with_launch(small_grid=small_grid), \
            scaled_tanh.with_launch(small_grid=small_grid)
        k_rope = rope.with_launch(small_grid=q.numel() + (1 if suffix else 0))
        assert k_silu.launches(x)[0][0] == f"silu_{tag}{suffix}"
        assert k_tanh.launches(x, s)[0][0] == f"scaled_tanh_{tag}{suffix}"
        assert k_rope.launches(q, pos)[0][0] == f"rope_{tag}{suffix}"
        torch.testing.assert_close(k_silu(x).float(), torch.nn.functional.silu(x.float()),
                                   rtol=tol, atol=tol)
        torch.testing.assert_close(k_tanh(x, s).float(),
                                   torch.tanh(x.float() * s[:, None]), rtol=tol, atol=tol)
        torch.testing.assert_close(k_rope(q, pos).float(), torch_rope(q.float(), pos),
                                   rtol=tol, atol=tol)


def test_check_covers_both_kernels():
    report = check(silu.with_launch(small_grid=512), max_examples=3, dtypes={"T": "f16"})
    hosts = {i.host_name: i for i in report.instantiations}
    assert {"silu_f16", "silu_f16_small"} <= set(hosts), report.coverage()
    assert hosts["silu_f16"].launches and hosts["silu_f16_small"].launches, report.coverage()


def test_check_reaches_the_wide_kernel_under_the_table():
    """Under the table's small_grid (2^19) check's own examples are small: it reaches the wide
    kernel through `selecting`, with rows of whole chunks and of a partial one."""
    report = check(silu, max_examples=3, dtypes={"T": "f16"})
    wide = next(i for i in report.instantiations if i.host_name == "silu_f16")
    assert wide.launches and any("D=8" in s for s in wide.sizes) and \
        any("D=9" in s for s in wide.sizes), report.coverage()
