"""A call whose widest output is empty (no thread runs) still fills its other outputs, as torch
does, on the first call and on warm calls; an output that needs an extreme over an empty axis
raises (issue #48: they came back as uninitialised memory)."""
import pytest
import torch

import metalforge as mf
from metalforge.errors import ShapeError


@mf.kernel
def scaled_pair(x: "T[R, D]", w: "T[D]"):
    return x * w, w * 2 + 1


@mf.kernel
def softmax_and_mean(x: "T[R, D]"):
    return mf.softmax(x, axis="D"), mf.mean(x, axis="D"), mf.sum(x + 1, axis="D")


@mf.kernel
def softmax_and_argmax(x: "T[R, D]"):
    return mf.softmax(x, axis="D"), mf.argmax(x, axis="D")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_outputs_beside_an_empty_grid(dtype):
    w = torch.randn(5, dtype=dtype)
    for _ in range(3):                               # cold, then the warm path's key
        big, small = scaled_pair(torch.randn(0, 5, dtype=dtype), w)
        assert big.shape == (0, 5)
        torch.testing.assert_close(small, w * 2 + 1)


def test_reductions_over_an_empty_axis_beside_an_empty_output():
    x = torch.randn(3, 0)
    for _ in range(3):
        sm, mean, total = softmax_and_mean(x)
        assert sm.shape == (3, 0)
        assert torch.isnan(mean).all() and mean.shape == (3,)
        torch.testing.assert_close(total, torch.zeros(3))


def test_an_extreme_over_an_empty_axis_still_raises():
    for _ in range(2):
        with pytest.raises(ShapeError, match="argmax.*empty axis"):
            softmax_and_argmax(torch.randn(3, 0))


def test_all_outputs_empty_is_no_launch_and_no_error():
    sm, mean, total = softmax_and_mean(torch.randn(0, 4))
    assert sm.shape == (0, 4) and mean.shape == (0,) and total.shape == (0,)


def test_mlx_arrays_beside_an_empty_grid():
    mx = pytest.importorskip("mlx.core")
    from metalforge.runtime.mlx import to_torch
    w = torch.randn(5)
    with mf.backend("sim"):
        big, small = scaled_pair(mx.zeros((0, 5)), mx.array(w.numpy()))
    assert tuple(big.shape) == (0, 5)
    torch.testing.assert_close(to_torch(small), w * 2 + 1)
