"""Integer scalars and Consts outside the 64-bit range an int has in the kernel raise a
BindingError naming the parameter and the range, on the first call, on a warm call and in
`.reference`; values at the ends of the range run and match the reference."""
import pytest
import torch

import metalforge as mf
from metalforge.errors import BindingError


@mf.kernel
def add_const(x: "T[N]", c: mf.Const[int] = 1):
    return x + c


@mf.kernel
def add_scalar(x: "T[N]", c: int):
    return x * 2 + c


@mf.kernel
def scale_scalar(x: "T[N]", s: float):
    return x * s


OUT_OF_RANGE = [2**63, 2**64, 2**70, -2**63 - 1]
DTYPES = [torch.int32, torch.float32]


@pytest.mark.parametrize("value", OUT_OF_RANGE)
@pytest.mark.parametrize("dtype", DTYPES)
def test_const_out_of_range_raises(value, dtype):
    x = torch.arange(8, dtype=dtype)
    for run in (lambda: add_const(x, c=value), lambda: add_const.reference(x, c=value)):
        with pytest.raises(BindingError, match=r"argument 'c'.*64-bit signed integer.*"
                                               r"-9223372036854775808 \.\. 9223372036854775807"):
            run()


@pytest.mark.parametrize("value", OUT_OF_RANGE)
@pytest.mark.parametrize("dtype", DTYPES)
def test_runtime_int_out_of_range_raises_cold_and_warm(value, dtype):
    x = torch.arange(8, dtype=dtype)
    torch.testing.assert_close(add_scalar(x, 3), add_scalar.reference(x, 3))   # warm now
    for run in (lambda: add_scalar(x, value), lambda: add_scalar(x, c=value),
                lambda: add_scalar.reference(x, value)):
        with pytest.raises(BindingError, match=r"argument 'c'.*64-bit signed integer"):
            run()


def test_float_scalar_from_an_int_too_large_raises():
    x = torch.ones(8)
    scale_scalar(x, 2.0)
    for run in (lambda: scale_scalar(x, 10**400), lambda: scale_scalar.reference(x, 10**400)):
        with pytest.raises(BindingError, match=r"argument 's'.*too large for a float"):
            run()


@pytest.mark.parametrize("value", [2**63 - 1, -2**63, 2**40, -5])
def test_ends_of_the_range_run(value):
    x = torch.arange(8, dtype=torch.float32)
    torch.testing.assert_close(add_const(x, c=value), add_const.reference(x, c=value))
    torch.testing.assert_close(add_scalar(x, value), add_scalar.reference(x, value))
