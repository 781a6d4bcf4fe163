"""validation.l2_flush's timing configs: each flush method maps onto kernels.timing's fields,
the launch count is the one asked for, and the rest is the default timing."""

from __future__ import annotations

import dataclasses

from ssvkit.kernels import timing as tm
from ssvkit.validation.l2_flush import FLUSHES, LAUNCHES, timing_config


def test_each_flush_method_sets_the_timer_fields():
    fields = {f: (timing_config(f, 10).flush_l2, timing_config(f, 10).flush_write) for f in FLUSHES}
    assert fields == {"read": (True, False), "write": (True, True), "none": (False, False)}
    for n in LAUNCHES:
        cfg = timing_config("read", n)
        assert cfg.graph_launches == n
        assert dataclasses.replace(cfg, graph_launches=tm.DEFAULT_TIMING.graph_launches) == (
            tm.DEFAULT_TIMING
        )
    assert tm.DEFAULT_TIMING.flush_l2 and not tm.DEFAULT_TIMING.flush_write
