"""Launch configuration: overrides, the default sweep and the autotune cache.

    kernel.with_launch(threads_per_group=128)              a call-site override (launch)
    SWEEP / grid(family)                                   the default candidates (sweep)
    metalforge.tuning.cache                                the per-device JSON cache

`mf.autotune`, which sweeps, checks, times and stores, is `metalforge.autotuner` (it runs
kernels, so it sits above the runtime; this package sits below it).

Precedence, key by key: call site > `@mf.kernel(launch=...)` > autotune cache > the family's
policy table (`metalforge.schedule.policy.POLICIES`).
"""
from .cache import CacheWarning, TuneCache, TuneKey, cache_path, default_cache, key_for
from .launch import check_options, known_options
from .sweep import SWEEP, grid

__all__ = ["TuneCache", "TuneKey", "CacheWarning", "cache_path", "default_cache", "key_for",
           "check_options", "known_options", "SWEEP", "grid"]
