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

from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration import kernel_ops
from ssvkit.calibration.kernel_checks import check
from ssvkit.calibration.runner import Runner
from ssvkit.kernels import timing as tm

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


def nsa_tile_sweep(r: Runner, sw, seed: int, mod) -> None:
    """The NSA configs of ``sw`` under each schedule of ``NSA_TILE_ROWS``."""
    for rows in NSA_TILE_ROWS:
        kernel_ops.nsa_sweep(r, sw, seed, mod, rows_per_tile=rows)
        if r.stopped:
            return
