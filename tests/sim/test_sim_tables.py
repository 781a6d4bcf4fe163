import numpy as np
import pytest
from ssvkit.perfmodel.strategy import Strategy
from ssvkit.sim.setup import analytic_round
from ssvkit.sim.tables import CostContext, Grid, context_grid, loop_table


def test_grid_interpolates_linear_data_exactly():
    ctx = np.array([1000.0, 2000.0, 3000.0])
    ovl = np.array([0.0, 0.5, 1.0])
    b = np.array([1.0, 2.0])
    vals = (b[:, None, None] * (3 * ctx[None, :, None] + 7 * ovl[None, None, :]))[..., None]
    g = Grid(["x"], ctx, ovl, vals)
    for bb, T, o in [(1, 1500.0, 0.25), (2, 2999.0, 0.9), (2, 3500.0, 0.1)]:
        assert g.get("x", bb, T, o) == pytest.approx(bb * (3 * T + 7 * o))


def test_context_grid_covers_range():
    c = context_grid(8192, 9000, 1024)
    assert c[0] == 8192 and c[-1] >= 9000 and np.all(np.diff(c) == 1024)


@pytest.mark.parametrize("loop", ["serial", "pipelined"])
@pytest.mark.parametrize("name", ["ar_dense", "sd_sparse_naive", "ssv"])
def test_loop_table_sums_to_perfmodel_round(name, loop):
    ctx = CostContext.build("llama-3.1-8b", "h100-sxm", 1, 2, 0.7, roofline=True, loop=loop)
    strategy = Strategy.from_name(name)
    grid, levels = loop_table(ctx, strategy, context_grid(8192, 12000, 1024), 2, [0.75])

    class S:  # the bits of sim.setup.Setup that analytic_round reads
        cfg = type("C", (), dict(tp=1, acceptance=0.7, overlap=0.75, kv_bytes=2))

    S.ctx, S.strategy = ctx, strategy
    for b, T in [(1, 8192), (2, 10240)]:
        q = grid.at(b, T, 0.75)
        pred = analytic_round(S, T, b)
        # draft, select, verify, accept and the loop's host time (``perfmodel.loop_host``)
        assert sum(q[:5]) == pytest.approx(float(pred.round_s[0]), rel=1e-12)
        assert q[4] == pytest.approx(float(pred.loop_s[0]))
        # A pipelined autoregressive round hides the host's time behind its GPU work (which
        # takes milliseconds at these contexts); a serial loop, or a drafter the engine
        # cannot pipeline, adds it.
        assert q[4] == 0 if (loop, name) == ("pipelined", "ar_dense") else q[4] > 0
        assert sum(levels.at(b, T, 0.75)) == pytest.approx(float(pred.draft_s[0]), rel=1e-12)
