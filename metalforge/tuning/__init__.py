"""Launch configuration: overrides, the autotuner and its cache.

    mf.autotune(kernel, *example_args, candidates=None)   sweep, check, time, remember (autotune)
    kernel.with_launch(threads_per_group=128)              a call-site override (launch)
    metalforge.tuning.cache                                the per-device JSON cache

Precedence, key by key: call site > `@mf.kernel(launch=...)` > autotune cache > the family's
policy table (`metalforge.schedule.policy.POLICIES`).
"""
from .autotune import CandidateMismatch, TuneResult, Trial, autotune, median_time
from .cache import CacheWarning, TuneCache, TuneKey, cache_path, default_cache, key_for
from .launch import check_options, known_options
from .sweep import SWEEP, grid

__all__ = ["autotune", "TuneResult", "Trial", "CandidateMismatch", "median_time", "TuneCache",
           "TuneKey", "CacheWarning", "cache_path", "default_cache", "key_for",
           "check_options", "known_options", "SWEEP", "grid"]
