"""Bad arguments named by a MetalforgeError before any launch, from the kernel call and from
`.reference` alike (issue #48): tensors that are not dense and strided, and max/min/argmax/argmin
over an empty axis."""
import sys
import warnings
from pathlib import Path

import pytest
import torch

import metalforge as mf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from attention import attention  # noqa: E402


@mf.kernel
def scaled(x: "T[R, D]", w: "T[D]"):
    return x * w


def _not_dense():
    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # torch's beta / prototype warnings
        return [("sparse COO", x.to_sparse()), ("sparse CSR", x.to_sparse_csr()),
                ("sparse CSC", x.to_sparse_csc()), ("sparse BSR", x.to_sparse_bsr((2, 2))),
                ("MKL-DNN", x.to_mkldnn()),
                ("nested", torch.nested.nested_tensor([x[0], x[1, :5]]))]


@pytest.mark.parametrize("what,t", _not_dense(), ids=[w for w, _ in _not_dense()])
@pytest.mark.parametrize("call", ["kernel", "reference", "source", "warm"])
def test_tensors_that_are_not_dense(what, t, call):
    w = torch.randn(8)
    if call == "warm":                           # a warm fast path first, then the bad call
        scaled(torch.randn(4, 8), w)
        scaled(torch.randn(4, 8), w)
    fn = {"kernel": scaled, "warm": scaled, "reference": scaled.reference,
          "source": scaled.source}[call]
    with pytest.raises(mf.BindingError, match=rf"kernel 'scaled' \(.*test_bad_arguments\.py:\d+\), "
                                              rf"argument 'x' is (a|an) {what} tensor") as e:
        fn(t, w)
    assert isinstance(e.value, TypeError)
    assert "to_dense()" in str(e.value) or "to_padded_tensor" in str(e.value)
    with pytest.raises(mf.BindingError, match="argument 'w' is a sparse COO"):   # any argument
        fn(torch.randn(4, 8), w.to_sparse())


@mf.kernel
def extremes(x: "T[R, D]"):
    return mf.max(x, axis="D"), mf.min(x, axis="D"), mf.argmax(x, axis="D")


@mf.kernel
def argmin_rows(x: "T[R, D]"):
    return mf.argmin(x, axis="R")


@mf.kernel
def softmax(x: "T[R, D]"):
    return mf.softmax(x, axis="D")


@pytest.mark.parametrize("kernel,shape,kind,axis", [
    (extremes, (3, 0), "max", "D"), (argmin_rows, (0, 5), "argmin", "R"),
    (attention, None, "max", "L")])
@pytest.mark.parametrize("reference", [False, True])
def test_extremes_over_an_empty_axis(kernel, shape, kind, axis, reference):
    """A ShapeError (still a ValueError) naming the reduction, its line and the axis, from the
    kernel and from its reference."""
    if shape is None:
        args = (torch.randn(1, 2, 1, 8), torch.randn(1, 2, 0, 8), torch.randn(1, 2, 0, 8), 0.1)
    else:
        args = (torch.randn(*shape),)
    fn = kernel.reference if reference else kernel
    pattern = (rf"mf\.{kind}\(\.\.\., axis='{axis}'\) at .*:\d+ over an empty axis"
               if reference or shape else rf"softmax over an empty axis \({axis} = 0\)")
    with pytest.raises(mf.ShapeError, match=pattern) as e:
        fn(*args)
    assert isinstance(e.value, ValueError)


def test_empty_results_need_no_extreme():
    """Where no output element reads the reduction, the reference gives the empty result, as
    the kernel does."""
    x = torch.randn(3, 0)
    assert softmax(x).shape == softmax.reference(x).shape == (3, 0)
    assert [t.shape for t in extremes.reference(torch.randn(0, 0))] == [(0,)] * 3


def test_runtime_checks_layout_too():
    """A graph run directly (the torch op wrappers, autodiff) is checked by the launcher."""
    from metalforge import runtime
    x, w = torch.randn(4, 8), torch.randn(8)
    with pytest.raises(mf.BindingError, match=r"kernel 'scaled' .*argument 'x' is a sparse COO"):
        runtime.run(scaled.graph(x, w), {"x": x.to_sparse(), "w": w})
