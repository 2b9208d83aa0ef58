"""The errors metalforge raises for a user's mistake, all in one place.

Each derives from `MetalforgeError` (catch every metalforge error with it) and from the builtin
class that says what kind of mistake it is, so `except ValueError` / `except TypeError` keep
working. Messages name the kernel, the user's file:line, the argument or buffer, and what would
be right. (`KernelError` is a kernel's fault at run time on the simulator or the cuda backend;
the simulator's `CompilerNotFound`, metalforge.msl's `ParseError` and the test generator's
`GenError` derive from `MetalforgeError` too.)
"""
from __future__ import annotations

from typing import Optional

Loc = tuple[str, int]                  # (the user's file, line)


def at(loc: Optional[Loc]) -> str:
    """How messages point into the user's code: " at file.py:12" (nothing when unknown)."""
    return f" at {loc[0]}:{loc[1]}" if loc else ""


def kernel_at(name: str, loc: Optional[Loc]) -> str:
    """How messages name a kernel: "kernel 'silu' (file.py:12)"."""
    return f"kernel '{name}'" + (f" ({loc[0]}:{loc[1]})" if loc else "")



class MetalforgeError(Exception):
    """Base of every error metalforge raises for a user's mistake."""


class AnnotationError(MetalforgeError, ValueError):
    """A malformed or unsupported annotation. `column` is the offending character's offset."""
    column: int = 0
    annotation: str = ""


class TraceError(MetalforgeError, TypeError):
    """The kernel body does something the DSL cannot trace (data-dependent control flow,
    unknown function, bad axis, type promotion torch refuses, ...)."""


class BindingError(MetalforgeError, TypeError):
    """Arguments that do not fit the kernel's signature or annotations."""


class ShapeError(MetalforgeError, ValueError):
    """A tensor argument's shape does not fit its annotation (or other arguments)."""


def empty_extreme(kernel: str, kind: str, axis: str, loc: Optional[Loc]) -> ShapeError:
    """mf.max/min/argmax/argmin over an axis of size 0: the same error from the kernel's
    host-side checks and from `.reference` (torch refuses them too)."""
    return ShapeError(f"kernel '{kernel}': mf.{kind}(..., axis={axis!r}){at(loc)} over an empty "
                      f"axis ({axis} = 0) has no value (torch raises too); sum, prod and mean "
                      f"of an empty axis give 0, 1 and NaN")


class DeviceError(MetalforgeError, ValueError):
    """Tensor arguments on a device metalforge cannot run on, or on different devices."""


class UnsupportedConstruct(MetalforgeError, ValueError):
    """A graph construct this schedule cannot lower (names the construct and the user's line)."""


class LaunchError(MetalforgeError, ValueError):
    """A launch configuration that cannot run (checked on the host before any launch)."""


class BackendUnavailable(DeviceError, RuntimeError):
    """A backend this machine cannot run (mps without a Mac, cuda without an NVIDIA GPU, mlx
    without Metal)."""


class UnsupportedOnBackend(UnsupportedConstruct, NotImplementedError):
    """A kernel a backend cannot run (names the construct and the backend that can)."""


class GatherIndexError(MetalforgeError, IndexError):
    """An index of `mf.take` outside its axis (names kernel, tensor, axis size and value): the
    same class from the kernels' report and from the reference."""


class QuantizationError(MetalforgeError, ValueError):
    """Weights or packed words `metalforge.quant` cannot quantize or unpack (non-finite values,
    codes outside the bit range)."""


class CandidateMismatch(MetalforgeError, AssertionError):
    """Launch configurations that gave a result different from the reference (a metalforge
    bug: please report it with the message)."""


class KernelError(MetalforgeError, RuntimeError):
    """A kernel failed when launched or run: the simulator caught a fault (out-of-bounds access,
    barrier divergence, threadgroup-memory race, crash), or the CUDA driver refused to load or
    launch a translated kernel. Importable as ``metalforge.sim.KernelError`` and
    ``metalforge.cuda.KernelError`` too."""
