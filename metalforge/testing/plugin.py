"""pytest plugin (entry point ``pytest11: metalforge``): the hypothesis profile `check` uses.

    pytest                                            # metalforge-ci: fast, deterministic
    METALFORGE_HYPOTHESIS_PROFILE=metalforge-thorough pytest
    pytest --metalforge-profile metalforge-thorough   # the same, from the command line

The chosen profile is shown in pytest's header. The ``mf_check`` fixture is `check` bound to
that profile. The plugin does not load the profiles globally, so other hypothesis tests in the
same run keep their own settings.
"""
from __future__ import annotations

import functools
import os

import pytest

from .profiles import ENV, PROFILES, profile


def pytest_addoption(parser) -> None:
    group = parser.getgroup("metalforge")
    group.addoption("--metalforge-profile", choices=sorted(PROFILES), default=None,
                    help=f"hypothesis profile for metalforge.testing.check (default: ${ENV} "
                         f"or metalforge-ci)")


def pytest_configure(config) -> None:
    chosen = config.getoption("metalforge_profile", default=None)
    if chosen:
        os.environ[ENV] = chosen             # generated tests call check() directly
    profile()                                # an unknown $METALFORGE_HYPOTHESIS_PROFILE fails now


def pytest_report_header(config) -> str:
    p = profile()
    return (f"metalforge: hypothesis profile {p.name} ({p.settings.max_examples} examples per "
            f"compiled variant, variants {p.max_variants or 'all'}, memory budget "
            f"{p.memory_budget >> 10} KiB)")


@pytest.fixture
def mf_check():
    """`metalforge.testing.check` with the session's profile."""
    from .check import check
    return functools.partial(check, profile=profile().name)
