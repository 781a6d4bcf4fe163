"""nsa_verify under ``NsaVerifyConfig(tile_plan="fit")``: row tiles of up to 128 MMA rows and 32
draft rows (member bits up to bit 31 of the union plan), against the fp32 torch reference and
against the "fixed" plan's output.

CPU: Triton interpreter, fp32 and fp16, ragged prefixes with NaN past every sequence's cache (a
correct kernel never reads it). 4 query heads on one KV head (G = 4, Llama-3.1-8B's group), so
t = 17 is one 68-row tile of 128 MMA rows under "fit" (two tiles under "fixed") and t = 33 two
tiles of 32 + 1 draft rows; ``num_splits`` 5 puts several slots on a branch.
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close
from nsa_helpers import NSA_KW, make_inputs
from ssvkit.kernels.nsa_launch import make_plan
from ssvkit.kernels.nsa_verify import (
    NsaVerifyConfig,
    nsa_union_plan,
    nsa_verify,
    nsa_verify_unfused,
    reference_nsa_verify,
)
from ssvkit.kernels.timing import poisoned_allocations

# (prefix_lens, t, dtype, rows_per_tile): the packed schedule at 17 and 33 rows (one and two
# packed tiles); one draft row a tile and tiles of 4 rows at t = 5 (five tiles, and a last tile
# of one row). A schedule of a few rows a tile packs them as the "fixed" plan does, so a few
# tiles serve it as well as many; one draft row a tile runs the same kernel path at every t.
CASES = [
    ([61, 38], 17, torch.float32, 0),
    ([45], 5, torch.float16, 1),
    ([45], 5, torch.float16, 4),
    ([70], 33, torch.float32, 0),
]


def _plan(args, config):
    kw = dict(NSA_KW, num_sink=1, num_local=1, sm_scale=None)
    return make_plan(args[0], args[1], args[5], config=config, **kw)


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"L{c[0]}-t{c[1]}-{c[2]}-r{c[3]}".replace(" ", "")
)
def test_fit_plan_reuse_matches_reference(case):
    prefix_lens, t, dtype, rows_per_tile = case
    args, idx = make_inputs(prefix_lens, t, 4, 1, 16, dtype, tree="tree", seed=t + rows_per_tile)
    ro, _ = reference_nsa_verify(*args, block_idx=idx, **NSA_KW)
    assert torch.isfinite(ro).all()
    fit = NsaVerifyConfig(tile_plan="fit", rows_per_tile=rows_per_tile)
    split = NsaVerifyConfig(tile_plan="fit", rows_per_tile=rows_per_tile, num_splits=5)
    plan = _plan(args, fit)
    if rows_per_tile == 0:  # the packed tile holds up to 32 draft rows in 128 MMA rows
        assert (plan.block_m, plan.num_tiles) == ((128, 1) if t <= 32 else (128, 2))
        assert plan.num_warps == 8
        assert _plan(args, NsaVerifyConfig()).num_tiles == -(-t // 16)  # "fixed": 16 a tile
    else:
        assert (plan.rows, plan.num_tiles) == (rows_per_tile, -(-t // rows_per_tile))
    with poisoned_allocations():
        union = nsa_union_plan(args[0], args[1], idx, block_size=NSA_KW["block_size"], config=fit)
        o, _ = nsa_verify(*args, block_idx=idx, config=fit, union=union, **NSA_KW)
        o_split, _ = nsa_verify(*args, block_idx=idx, config=split, **NSA_KW)
        o_unfused, _ = nsa_verify_unfused(*args, block_idx=idx, config=fit, **NSA_KW)
        o_fixed, _ = nsa_verify(*args, block_idx=idx, **NSA_KW)
    for out in (o, o_split, o_unfused):
        assert not torch.isnan(out).any()
        assert_close(out, ro, dtype, "o")
    assert_close(o, o_fixed, dtype, "o")


def test_fit_plan_refresh_selects_reference_blocks():
    """Random data has no ties: the refresh path's indices under "fit" (one 128-row tile at
    t = 17) must equal the reference's exactly, fused and unfused. Tiles of 4 rows pack as the
    "fixed" plan's 16-row tiles at G = 4, whose refresh ``test_nsa_verify`` checks."""
    args, _ = make_inputs([90], 17, 4, 1, 16, torch.float32, tree="tree", seed=5)
    ro, ridx = reference_nsa_verify(*args, **NSA_KW)
    cfg = NsaVerifyConfig(tile_plan="fit", num_splits=4)
    assert _plan(args, cfg).num_tiles == 1
    with poisoned_allocations():
        o, idx = nsa_verify(*args, config=cfg, **NSA_KW)
        o_unfused, idx_unfused = nsa_verify_unfused(*args, config=cfg, **NSA_KW)
    assert torch.equal(idx.cpu(), ridx.cpu()) and torch.equal(idx_unfused.cpu(), ridx.cpu())
    for out in (o, o_unfused):
        assert not torch.isnan(out).any()
        assert_close(out, ro, torch.float32, "o")


def test_fit_plan_member_bit_31_is_a_member():
    """Under "fit" a tile's draft row 31 is member bit 31, the int32 sign bit: a block only
    that row chose must reach it and no other row."""
    args, idx = make_inputs([64], 32, 4, 1, 16, torch.float32, tree="chain", seed=9)
    idx[:] = -1
    idx[0, 0, :, 0] = 0  # every row: block 0
    idx[0, 0, 31, 1] = 2  # only the last row: block 2
    ro, _ = reference_nsa_verify(*args, block_idx=idx, **NSA_KW)
    fit = NsaVerifyConfig(tile_plan="fit")
    assert _plan(args, fit).num_tiles == 1
    with poisoned_allocations():
        o, _ = nsa_verify(*args, block_idx=idx, config=fit, **NSA_KW)
    assert not torch.isnan(o).any()
    assert_close(o, ro, torch.float32, "o")
