"""The same mistake raises the same metalforge class everywhere, keeping the builtin base that
says what kind of mistake it is (`except ValueError` and friends keep working)."""
import pytest
import torch

import metalforge as mf
from metalforge import quant
from metalforge.runtime.backends import _compile


def test_every_public_error_is_a_metalforge_error():
    for name in ("AnnotationError", "TraceError", "BindingError", "ShapeError", "DeviceError",
                 "LaunchError", "UnsupportedConstruct", "CandidateMismatch",
                 "BackendUnavailable", "UnsupportedOnBackend", "GatherIndexError",
                 "QuantizationError"):
        assert issubclass(getattr(mf, name), mf.MetalforgeError), name


def test_unknown_and_unavailable_backends():
    with pytest.raises(mf.DeviceError, match="unknown metalforge backend 'metal'"):
        mf.backend("metal")
    if not torch.backends.mps.is_available():
        with pytest.raises(mf.BackendUnavailable, match="needs an Apple-silicon Mac") as e:
            _compile("mps", "kernel void k() {}")
        assert isinstance(e.value, RuntimeError)          # the builtin base it had


def test_decorating_and_naming_mistakes():
    with pytest.raises(mf.TraceError, match="decorates a function"):
        mf.kernel(42)
    with pytest.raises(mf.TraceError, match=r"mf.Const\[list\]"):
        mf.Const[list]


def test_quantization_mistakes():
    with pytest.raises(mf.QuantizationError, match="NaN or inf"):
        quant.quantize(torch.full((1, 64), float("nan")))
    with pytest.raises(mf.ShapeError, match="multiple of group_size=64"):
        quant.quantize(torch.randn(1, 65))
    with pytest.raises(mf.UnsupportedConstruct, match="bits=7 is not supported"):
        quant.quantize(torch.randn(1, 64), bits=7)
    with pytest.raises(mf.BindingError, match="must be a torch.Tensor"):
        quant.quantize([[1.0] * 64])
