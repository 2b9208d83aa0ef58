"""The tolerance policy lives in `metalforge.tolerance` (the autotuner uses it too); this name
stays for code that imports it from the testing package."""
from ..tolerance import (
                         ACCUMULATING,
                         ACCUMULATION,
                         BASE,
                         TINY,
                         Breach,
                         Tolerance,
                         compare,
                         lowest_precision,
                         magnitude,
                         reduction_length,
                         tolerance,
)

__all__ = ["ACCUMULATING", "ACCUMULATION", "BASE", "TINY", "Breach", "Tolerance", "compare",
           "lowest_precision", "magnitude", "reduction_length", "tolerance"]
