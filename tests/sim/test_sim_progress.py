"""The progress bar of long simulations: counts the simulated tokens, shows only where asked,
and leaves the run's figures as they are."""

from __future__ import annotations

import io

from ssvkit.sim.config import SimConfig
from ssvkit.sim.progress import Progress
from ssvkit.sim.scenarios import simulate


def test_bar_counts_tokens_up_to_the_total_and_shows_its_label():
    out = io.StringIO()
    p = Progress("simulate ssv", file=out, enabled=True, delay_s=0.0)
    p.start(1000)
    for _ in range(600):
        p.advance(3)  # more than the total: the bar stops at it
    assert p.done >= 1000 and p._bar.n == 1000
    p.close()
    assert "simulate ssv" in out.getvalue() and "tok" in out.getvalue()


def test_a_bar_not_on_a_terminal_draws_nothing():
    out = io.StringIO()  # not a terminal
    p = Progress("x", file=out, delay_s=0.0)
    p.start(10)
    p.advance(10)
    p.close()
    assert out.getvalue() == "" and p.done == 0


def test_progress_leaves_the_figures_unchanged():
    cfg = SimConfig(scenario="ssv", num_tokens=300, timeline_rounds=0)
    a = simulate(cfg).figures
    b = simulate(cfg, progress=True).figures
    for name in ("simulated_tokens_per_s", "tokens", "rounds", "simulated_time_s"):
        assert a[name] == b[name]
