"""Correctness checks the kernel sweep runs before it times anything: every op against its fp32
reference on random ragged bf16 inputs, with poisoned allocations (``kernels.timing``). A
mismatch or a NaN raises ``CorrectnessError`` and the sweep times nothing.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.kernel_grid import NSA_TILE_ROWS
from ssvkit.kernels import timing as tm
from ssvkit.kernels.select_reference import reference_select_blocks

TOL = {"o": (3e-2, 3e-2), "lse": (2e-2, 2e-2)}  # bf16


class CorrectnessError(RuntimeError):
    """An op disagreed with its reference (or produced NaN): the run must not time it."""


def check(name: str, actual: torch.Tensor, expected: torch.Tensor, kind: str) -> None:
    """Raise ``CorrectnessError`` unless ``actual`` matches ``expected`` within the bf16
    tolerance of ``kind`` (``o`` or ``lse``) and holds no NaN."""
    atol, rtol = TOL[kind]
    if torch.isnan(actual.float()).any():
        raise CorrectnessError(f"{name}: NaN in {kind}")
    try:
        torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)
    except AssertionError as e:
        raise CorrectnessError(f"{name}: {kind} mismatch\n{e}") from None


def check_dense() -> None:
    from ssvkit.kernels.dense_verify import dense_verify, reference_dense_verify

    gen = ki.generator(1)
    for t in (1, 5, 16, 64):
        args = ki.attention_inputs(3, t, 4200, [4093, 0, 1777], gen)
        for splits in (None, 1, 7):
            with tm.poisoned_allocations():
                o, lse = dense_verify(*args, num_splits=splits)
            ro, rlse = reference_dense_verify(*args)
            check(f"dense_verify t={t} splits={splits}", lse, rlse, "lse")
            check(f"dense_verify t={t} splits={splits}", o, ro, "o")


def check_repair() -> None:
    from ssvkit.kernels.repair import reference_repair, repair

    gen = ki.generator(2)
    rng = np.random.default_rng(2)
    q, k, v, lens, _ = ki.attention_inputs(2, 8, 4200, [4100, 1000], gen)
    nb = [math.ceil(n / 64) for n in (4100, 1000)]
    full = ki.random_block_idx(nb, 8, 12, rng)
    pred = torch.from_numpy(full[..., :7].copy()).to(ki.DEVICE)
    missed = torch.from_numpy(full[..., 7:].copy()).to(ki.DEVICE)
    missed[0, :, :, 3:] = -1  # ragged
    o0 = torch.full_like(q, float("nan"))
    lse0 = torch.full((2, ki.NUM_Q_HEADS, 8), float("-inf"), device=ki.DEVICE)
    kw = dict(prefix_lens=lens, block_size=64)
    with tm.poisoned_allocations():
        o_p, lse_p = repair(q, k, v, o0, lse0, pred, **kw)
        o_u, lse_u = repair(q, k, v, o_p, lse_p, missed, **kw)
    union = torch.cat([pred, missed], dim=-1).contiguous()
    ro, rlse = reference_repair(q, k, v, o0, lse0, union, **kw)
    check("repair(partial) + repair(missed) vs union", lse_u, rlse, "lse")
    check("repair(partial) + repair(missed) vs union", o_u, ro, "o")


def check_sparse(mod) -> None:
    gen = ki.generator(3)
    rng = np.random.default_rng(3)
    lens = [4100, 1000]
    q, k, v, lens_t, mask = ki.attention_inputs(2, 8, 4200, lens, gen)
    idx_np = ki.overlap_block_idx([n // 64 for n in lens], 8, 8, 0.7, rng)
    idx = torch.from_numpy(idx_np).to(ki.DEVICE)
    for mode, group in (("per_query", 1), ("union", 2), ("union", 4), ("shared", 4)):
        kw = dict(mode=mode, group_size=group, block_size=64)
        with tm.poisoned_allocations():
            out = mod.sparse_verify(q, k, v, lens_t, mask, idx, **kw)
        ref = mod.reference_sparse_verify(q, k, v, lens_t, mask, idx, **kw)
        check(f"sparse_verify {mode} C={group}", out[0], ref[0], "o")
        if isinstance(out, tuple) and isinstance(ref, tuple) and len(out) > 1 and len(ref) > 1:
            check(f"sparse_verify {mode} C={group}", out[1], ref[1], "lse")


def check_nsa(mod) -> None:
    gen = ki.generator(4)
    args = ki.nsa_inputs(mod, 2, 8, [4100, 1500], 4200, gen)
    for name, fn in (
        ("nsa_verify", mod.nsa_verify),
        ("nsa_verify_unfused", mod.nsa_verify_unfused),
    ):
        with tm.poisoned_allocations():
            o, idx = fn(*args, **ki.NSA_KW)  # refresh: computes the indices
            o2, _ = fn(*args, block_idx=idx, **ki.NSA_KW)  # reuse: given the indices
        ro, _ = mod.reference_nsa_verify(*args, block_idx=idx, **ki.NSA_KW)
        check(f"{name} refresh", o, ro, "o")
        check(f"{name} reuse", o2, ro, "o")


def check_nsa_tiles(mod) -> None:
    """Each row schedule of the ``nsa_tiles`` step (``kernel_grid.NSA_TILE_ROWS``): refresh and
    reuse calls, fused and unfused, against the fp32 reference on ragged inputs."""
    gen = ki.generator(6)
    args = ki.nsa_inputs(mod, 2, 9, [4100, 1500], 4200, gen)
    for rows in NSA_TILE_ROWS:
        kw = dict(ki.NSA_KW, config=mod.NsaVerifyConfig(rows_per_tile=rows))
        for name, fn in (
            ("nsa_verify", mod.nsa_verify),
            ("nsa_verify_unfused", mod.nsa_verify_unfused),
        ):
            with tm.poisoned_allocations():
                o, idx = fn(*args, **kw)
                o2, _ = fn(*args, block_idx=idx, **kw)
            ro, _ = mod.reference_nsa_verify(*args, block_idx=idx, **ki.NSA_KW)
            check(f"{name} rows_per_tile={rows} refresh", o, ro, "o")
            check(f"{name} rows_per_tile={rows} reuse", o2, ro, "o")


def check_select(mod) -> None:
    gen = ki.generator(5)
    q, k, _, lens, _ = ki.attention_inputs(2, 8, 4200, [4100, 1500], gen)
    for method in ("mean", "quest"):
        meta = mod.BlockMetadata.build(k, lens, 64, kinds=(method,))
        idx = mod.select_blocks(q, meta, lens, top_n=16, method=method, fused=False)
        one = mod.select_blocks(q, meta, lens, top_n=16, method=method, fused=True)
        if not torch.equal(idx, one):
            raise CorrectnessError(f"select_blocks {method}: one launch and two launches differ")
        ref = reference_select_blocks(q, k, lens, 64, top_n=16, method=method)
        # bf16 scores reorder near-ties: require almost every selected block to agree.
        hits = sum(
            len(set(a.tolist()) & set(b.tolist()))
            for a, b in zip(idx.reshape(-1, 16).cpu(), ref.reshape(-1, 16).cpu(), strict=True)
        )
        agree = hits / idx.numel()
        if agree < 0.97:
            raise CorrectnessError(f"select_blocks {method}: only {agree:.3f} of blocks agree")


def check_geometry(sparse_mod) -> None:
    """The verification kernels at the geometry in use: dense verification at t = 5 split 3
    ways, sparse verification per query and in groups of 3 (the sweeps' other head geometries
    pack their rows differently: GQA 5 and 16, head dim 64)."""
    from ssvkit.kernels.dense_verify import dense_verify, reference_dense_verify

    gen = ki.generator(6)
    args = ki.attention_inputs(2, 5, 2200, [2100, 700], gen)
    with tm.poisoned_allocations():
        o, lse = dense_verify(*args, num_splits=3)
    ro, rlse = reference_dense_verify(*args)
    check("dense_verify t=5 splits=3", lse, rlse, "lse")
    check("dense_verify t=5 splits=3", o, ro, "o")
    if sparse_mod is None:
        return
    rng = np.random.default_rng(6)
    idx_np = ki.overlap_block_idx([n // 64 for n in (2100, 700)], 5, 8, 0.7, rng)
    idx = torch.from_numpy(idx_np).to(ki.DEVICE)
    for mode, group in (("per_query", 1), ("union", 3), ("shared", 3)):
        kw = dict(mode=mode, group_size=group, block_size=64)
        with tm.poisoned_allocations():
            o, lse = sparse_mod.sparse_verify(*args, idx, **kw)
        ro, rlse = sparse_mod.reference_sparse_verify(*args, idx, **kw)
        check(f"sparse_verify {mode} C={group}", o, ro, "o")
        check(f"sparse_verify {mode} C={group}", lse, rlse, "lse")
