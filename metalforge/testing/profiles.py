"""Hypothesis profiles for `check`: a fast one for CI and a thorough one.

The profile is chosen by the environment variable ``METALFORGE_HYPOTHESIS_PROFILE``
(``metalforge-ci``, the default, or ``metalforge-thorough``), or per call by
``check(..., profile=...)``. A profile is hypothesis settings plus the metalforge knobs that
decide the cost of a check: examples per compiled variant, the memory budget for drawn inputs,
the threads an example may launch, and how many compiled variants (dtype x Const combinations)
are tried.

Cost model: every variant is one compile (seconds on the simulator); every example is one launch
(milliseconds to a second, growing with the sizes drawn). So the CI profile caps the variants and
keeps inputs small; the thorough one tries every variant with large inputs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings

ENV = "METALFORGE_HYPOTHESIS_PROFILE"
DEFAULT = "metalforge-ci"

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
           HealthCheck.differing_executors]


@dataclass(frozen=True)
class Profile:
    name: str
    settings: settings            # max_examples is per compiled variant
    memory_budget: int            # bytes of inputs + outputs one example may allocate
    max_variants: int | None      # compiled dtype x Const variants per check (None: all)
    boundary_examples: int = 1    # examples per boundary size and index width (see check)
    launch_budget: int = 1 << 18  # threads one example's launches may run (the simulator runs
                                  # each: attention launches a 256-thread group per 2 rows)
    work_budget: int = 1 << 23    # the product of the sizes of the axes an example iterates
                                  # (the reference's loop nest; attention's B G R S L E): the
                                  # simulator runs each thread's loops too, ~0.3 us an
                                  # attention iteration on a 2-core box (2^23: ~3 s, as 2^18
                                  # threads take)


PROFILES = {
    "metalforge-ci": Profile(
        "metalforge-ci",
        settings(max_examples=8, deadline=None, database=None, derandomize=True,
                 suppress_health_check=_HEALTH, print_blob=False, report_multiple_bugs=False,
                 phases=(Phase.explicit, Phase.generate, Phase.shrink)),
        memory_budget=1 << 20, max_variants=3, boundary_examples=2),
    "metalforge-thorough": Profile(
        "metalforge-thorough",
        settings(max_examples=150, deadline=None, database=None, derandomize=False,
                 suppress_health_check=_HEALTH, print_blob=True, report_multiple_bugs=False),
        memory_budget=64 << 20, max_variants=None, launch_budget=1 << 22, work_budget=1 << 29),
}

for _p in PROFILES.values():          # also usable as plain hypothesis profiles
    settings.register_profile(_p.name, _p.settings)


def profile(name: str | None = None) -> Profile:
    """The named profile, else the one ``$METALFORGE_HYPOTHESIS_PROFILE`` names, else CI's."""
    chosen = name or os.environ.get(ENV) or DEFAULT
    try:
        return PROFILES[chosen]
    except KeyError:
        where = "profile=" if name else f"${ENV}"
        raise ValueError(f"{where} names unknown hypothesis profile '{chosen}' (known: "
                         f"{', '.join(PROFILES)})") from None
