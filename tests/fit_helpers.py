"""Helpers of the tests that fit profiles."""

from __future__ import annotations

import pytest
from ssvkit.calibration import intervals


def without_leave_one_out(mp: pytest.MonkeyPatch) -> None:
    """Fits under ``mp`` store interval residuals of the held-out and cross-GPU rows alone:
    ``calibration.intervals.residual_rows`` skips the leave-one-out refits, most of a fit's
    time. CI checks the committed profiles' intervals, leave-one-out sets included
    (``python -m ssvkit.calibration.intervals --check``)."""
    residuals = intervals.residual_rows
    mp.setattr(intervals, "residual_rows", lambda *a, loo=None: residuals(*a[:4], loo=[]))
