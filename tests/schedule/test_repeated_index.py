"""`mf.index(axis)` read any number of times in one kernel is one position variable per scope
(issue #48: each read declared its own `mf_index_<axis>`, a redeclaration the compiler
refused), in every family; attention's masks are in tests/ops/test_attention.py."""
import pytest
import torch

import metalforge as mf


@mf.kernel
def elementwise(x: "T[R, D]"):
    return x * mf.index("D") + mf.index("D") * 2 - mf.index("R")


@mf.kernel
def row(x: "T[R, D]"):
    y = x * mf.index("D") + (mf.index("D") < 7)
    return y - mf.max(y + mf.index("D"), axis="D")


@mf.kernel
def column(x: "T[R, D]"):
    y = x * mf.index("R") + mf.index("R") * 2
    return mf.sum(y, axis="R")


@pytest.mark.parametrize("kernel", [elementwise, row, column])
@pytest.mark.parametrize("shape", [(5, 37), (3, 1000)])
def test_an_index_read_several_times(kernel, shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[1]))
    torch.testing.assert_close(kernel(x), kernel.reference(x))
