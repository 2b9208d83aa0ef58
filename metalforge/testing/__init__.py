"""metalforge.testing: every kernel gets a property-based test against its reference.

    from metalforge.testing import check
    check(my_kernel)                      # hypothesis: sizes, dtypes, values, layouts, scalars
    check(my_kernel, dims={"D": 4096}, dtypes={"T": ["f16"]}, max_examples=50)

Modules: `check` (the check: running each example and comparing, the failure report),
`variants` (the dtype/Const variants compiled), `coverage` (every kernel instantiation, boundary
sizes, launches counted), `strategies` (hypothesis strategies: sizes, value families, layouts,
scalars, whole examples), `tensors` (values from a family and seed, memory layouts), `slack`
(what a schedule's reordered sums allow, `Schedule.reordering`), `gradients` (check's grad=),
`tolerance` (the tolerance policy), `profiles` (the CI / thorough hypothesis profiles), `gen`
(`metalforge gen-tests`), `faults` (planted-fault test seam), `mutate` (mutation testing),
`plugin` (pytest).
Without hypothesis installed, `metalforge gen-tests` still works; `check` says what to install.
"""
from __future__ import annotations

from .gen import load_module

__all__ = ["check", "load_module", "Report"]

try:
    from .check import Report, check
except ModuleNotFoundError as _e:          # hypothesis is a test extra; gen-tests works without
    if _e.name != "hypothesis":
        raise

    def __getattr__(name: str):
        if name in ("check", "Report"):
            raise ModuleNotFoundError("metalforge.testing.check needs hypothesis: "
                                      "pip install 'metalforge[test]'", name="hypothesis")
        raise AttributeError(f"module 'metalforge.testing' has no attribute '{name}'")
