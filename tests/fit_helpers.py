"""Helpers of the tests that fit profiles."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from ssvkit.calibration import ceilings, intervals, physical_sets, transfer_sets
from ssvkit.perfmodel import hardware
from ssvkit.perfmodel.profiles import shipped_profile


def without_leave_one_out(mp: pytest.MonkeyPatch) -> None:
    """Fits under ``mp`` store interval residuals of the held-out and cross-GPU rows alone:
    ``calibration.intervals.residual_rows`` skips the leave-one-out refits, most of a fit's
    time. CI checks the committed profiles' intervals, leave-one-out sets included
    (``python -m ssvkit.calibration.intervals --check``)."""
    residuals = intervals.residual_rows
    mp.setattr(intervals, "residual_rows", lambda *a, loo=None: residuals(*a[:4], loo=[]))


def _clear_profile_caches() -> None:
    shipped_profile.cache_clear()
    for cached in (transfer_sets._committed, transfer_sets._committed_set, physical_sets.committed):
        cached.cache_clear()


@contextlib.contextmanager
def profiles_from(mp: pytest.MonkeyPatch, root: Path) -> Iterator[Path]:
    """Price, fit and validate from the profiles folder ``root`` instead of the shipped one,
    inside the block (``mp`` undoes the patches; the profile caches are cleared on both
    sides)."""
    mp.setattr(hardware, "profiles_dir", lambda: root)
    mp.setattr(ceilings, "PROFILES", root)
    _clear_profile_caches()
    try:
        yield root
    finally:
        _clear_profile_caches()
