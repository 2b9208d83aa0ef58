"""Launch overrides: checking a user's launch options and the order in which they combine.

A kernel's launch policy is, key by key, the first of

    call site     kernel.with_launch(threads_per_group=128)(x)
    kernel        @mf.kernel(launch={"threads_per_group": 128})
    tuned         the autotune cache entry for this device, kernel, dtypes and shape bucket
    backend       metalforge.schedule.policy.BACKEND_POLICIES[backend][family], what a backend
                  changes in the table (cuda: no simdgroup_matrix prefill)
    table         metalforge.schedule.policy.POLICIES[family]

`check_options` runs where an override is written (decorator or `with_launch`), so a typo or an
impossible value fails there, naming the kernel, before anything is traced or launched. What
depends on the kernel's schedule family (whether a key applies, simd multiples) is checked by
`schedule.policy.resolve` when the kernel is planned, and the compiled pipeline's own limit by
`validate_for_kernel`; both run before the first launch of a configuration.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Optional

from ..schedule import policy as _policy
from ..schedule.policy import LaunchError, LaunchPolicy

# chosen by size for correctness / by the user for error reporting; never swept, never cached
NOT_TUNED = ("index64", "index_check")


def known_options() -> tuple[str, ...]:
    """Every launch option some schedule family accepts."""
    return tuple(sorted({k for keys in _policy.TUNABLE.values() for k in keys}))


def check_options(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`options` as a plain dict, or a LaunchError naming `where` and the bad option."""
    if not isinstance(options, Mapping):
        raise LaunchError(f"{where}: launch options must be a dict like "
                          f"{{'threads_per_group': 128}}, got {type(options).__name__}")
    opts = dict(options)
    known = known_options()
    bad = sorted(k for k in opts if k not in known)
    if bad:
        raise LaunchError(f"{where}: unknown launch option(s) {', '.join(map(repr, bad))}; the "
                          f"options are: {', '.join(known)}")
    probe = replace(LaunchPolicy("override"), **opts)
    try:
        _policy.validate(probe)
    except LaunchError as e:
        msg = str(e).replace("override launch policy: ", "")
        raise LaunchError(f"{where}: {msg}") from None
    return opts


def merge(*layers: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """Later layers win key by key; None when every layer is empty."""
    out: dict[str, Any] = {}
    for layer in layers:
        if layer:
            out.update(layer)
    return out or None
