"""metalforge.testing: every kernel gets a property-based test against its reference.

    from metalforge.testing import check
    check(my_kernel)                      # hypothesis: sizes, dtypes, values, layouts, scalars
    check(my_kernel, dims={"D": 4096}, dtypes={"T": ["f16"]}, max_examples=50)

Modules: `check` (the check and its failure report), `strategies` (hypothesis strategies from a
kernel's params), `tolerance` (the tolerance policy), `profiles` (the CI / thorough hypothesis
profiles), `gen` (`metalforge gen-tests`), `faults` (planted-fault test seam), `plugin` (pytest).
`check` is imported on first use, so `metalforge gen-tests` does not need hypothesis.
"""
from __future__ import annotations

from .gen import load_module

__all__ = ["check", "load_module", "Report"]


def __getattr__(name: str):
    if name in ("check", "Report"):
        from . import check as _check_mod
        return getattr(_check_mod, name)
    raise AttributeError(f"module 'metalforge.testing' has no attribute '{name}'")
