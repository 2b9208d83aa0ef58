"""Kernel names end up in generated MSL (function names, host names, comments): only plain
identifiers are accepted, so no user string can change the generated program."""
import pytest
import torch

import metalforge as mf


def double(x: "T[*B, D]"):
    return x * 2


@pytest.mark.parametrize("bad", [
    "a*/ kernel void evil() {} /*", "x\n#define float int", "has space", "9lives",
    "dash-ed", "naïve", "a__b", "_x", "x_", "", "k" * 65, 'q"uote'])
def test_bad_explicit_names_are_rejected(bad):
    with pytest.raises(ValueError, match=r"name=.*cannot name a Metal kernel.*plain identifier"):
        mf.kernel(double, name=bad)


def test_bad_function_names_are_rejected():
    def f(x: "T[*B, D]"):
        return x + 1
    f.__name__ = "f */ #include <evil>"
    with pytest.raises(ValueError, match=r"test_kernel_names\.py:\d+: the function's __name__ "
                                         r"'f \*/ #include <evil>' cannot name"):
        mf.kernel(f)
    with pytest.raises(ValueError, match="cannot name a Metal kernel"):
        mf.kernel(name=42)(double)


@pytest.mark.parametrize("good", ["k2", "Mixed_Case_9", "k" * 64])
def test_plain_identifiers_run(good):
    k = mf.kernel(double, name=good)
    x = torch.randn(3, 5)
    torch.testing.assert_close(k(x), x * 2)
    assert k.name == good
