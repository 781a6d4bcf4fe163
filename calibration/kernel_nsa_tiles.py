"""The kernel sweep's NSA row-schedule configs (op ``nsa_tiles``): ``nsa_verify`` with
``rows_per_tile`` draft rows a row tile, on the NSA configs' grid (``kernel_ops.nsa_sweep``).

- 1 row a tile: seed 000's naive baseline (``sd_sparse_naive``, every row streams its own
  blocks), the kernels' one-row path; ``calibration.fit`` classes these rows as
  ``nsa_verify/<mode>/<impl>/per_query``, the class the step model prices that schedule with
  (until they exist, a stand-in prices it: ``perfmodel.calibrated.STAND_INS``);
- 4 rows a tile: SSV's default grouping (``ssv``, union C = 4), fitted with the packed class,
  whose features carry each row's tile geometry.

Their rows carry ``params.rows_per_tile``; the packed configs' rows carry no such key, so they
keep their keys and the file's earlier rows stay valid. A config whose tiles are the packed
ones (its ``t`` rows fit one tile) is left out: the packed rows time it. Correctness first
(``check_nsa_tiles``), as for every op of the sweep::

    python -m ssvkit.calibration.kernel_sweep --out calibration/profiles/h200 --ops nsa_tiles
"""

from __future__ import annotations

import itertools

from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration import kernel_ops
from ssvkit.calibration.kernel_checks import check
from ssvkit.calibration.runner import Runner
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.nsa_plan import is_packed

NSA_TILE_ROWS = (1, 4)


def check_nsa_tiles(mod) -> None:
    """Each schedule's refresh and reuse calls, fused and unfused, against the fp32 reference
    on ragged bf16 inputs (``kernel_checks.check``: a mismatch or a NaN raises)."""
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


def tile_configs(sw, rows_per_tile: int) -> list[tuple[dict, dict, list[tuple[str, str]]]]:
    """(common params, extra params, (mode, impl) variants) of each NSA config of ``sw``
    (``kernel_ops.nsa_sweep``'s grid) under ``rows_per_tile``, those whose tiles are the
    packed ones left out."""
    out = []
    for bsz, t in itertools.product(sw.other_batches, sw.nsa_tokens):
        if is_packed(t, ki.NUM_Q_HEADS, ki.NUM_KV_HEADS, rows_per_tile):
            continue
        for ctx, overlap in itertools.product(
            sw.nsa_contexts, (None, kernel_ops.NSA_REUSE_OVERLAP)
        ):
            common = dict(context_len=ctx, num_query_tokens=t, batch=bsz, tree="binary")
            common.update(top_n=ki.NSA_KW["top_n"], block_size=ki.NSA_KW["block_size"])
            if overlap is not None:
                common["overlap"] = overlap
            extra = dict(window=ki.NSA_KW["window"], comp_block=32, comp_stride=16)
            extra["rows_per_tile"] = rows_per_tile
            modes = ("reuse", "refresh") if overlap is None else ("reuse",)
            out.append((common, extra, [(m, i) for m in modes for i in ("fused", "unfused")]))
    return out


def nsa_tile_sweep(r: Runner, sw, seed: int, mod) -> None:
    """The configs of ``tile_configs`` under each schedule of ``NSA_TILE_ROWS``, skipping those
    whose rows are all in the file; stops at the runner's budget."""
    for rows in NSA_TILE_ROWS:
        for common, extra, variants in tile_configs(sw, rows):
            todo = [
                (m, i)
                for m, i in variants
                if r.pending("nsa_verify", ki.base_params(mode=m, impl=i, **common, **extra))
            ]
            if not todo:
                continue
            if r.out_of_time():
                return
            kernel_ops._nsa_config(r, seed, mod, common, extra, todo)
            kernel_ops.free()
