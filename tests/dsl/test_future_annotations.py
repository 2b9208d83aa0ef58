"""Kernels defined under `from __future__ import annotations` (PEP 563), where Python keeps each
annotation as source text: the string annotation "T[N]" arrives as "'T[N]'"."""
from __future__ import annotations

import torch

import metalforge as mf


@mf.kernel
def scaled(x: "T[R, D]", w: "T[D]", k: float = 2.0, twice: mf.Const[bool] = False) -> "T[R, D]":
    y = x * w * k
    return y + y if twice else y


def test_quoted_annotations_are_read_as_written():
    assert [p.annotation for p in scaled.params[:2]] == ["T[R, D]", "T[D]"]
    x, w = torch.randn(3, 5), torch.randn(5)
    torch.testing.assert_close(scaled(x, w), x * w * 2.0)
    torch.testing.assert_close(scaled(x, w, twice=True), x * w * 4.0)
