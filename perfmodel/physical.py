"""The physical cost model of the attention kernel families: a call's work from its launch plan
(``perfmodel.attention_work``) priced by a few GPU-level constants shared by every family and
configuration (``PhysicalFit``: the formula, its constants and what it ignores), over the GPU's
measured copy bandwidth ``BW`` and GEMM rate ``PEAK``.

Group size, head geometry, head dimension, draft width, block size, top-n, batch and context
are all points of this one model: they change the work, never the constants.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from ssvkit.perfmodel.attention_work import AttentionWork

PARAMS = (
    "launch_s",
    "wave_s",
    "hbm_eff",
    "l2_miss",
    "l2_bytes_per_flop",
    "mma_eff",
    "latency_s",
    "row_s",
    "compare_s",
)


@dataclass(frozen=True, slots=True)
class PhysicalFit:
    """The GPU-level constants of the physical model. One call takes

        t = L x launches + p x waves + k x compare steps
            + max((G + h (U - G) + M) / (e BW),     HBM: distinct bytes, repeats that miss
                                                    L2, merge partials;
                  U / (r_p PEAK),                   L2-to-SM: every request;
                  F / (e_mma PEAK),                 MMA: padded tile FLOPs;
                  waves x tiles x max(lat / stages, c x row_cost))   a program's K/V chain

    with ``G``, ``U``, ``M``, ``F`` the work's ``unique_bytes``, ``requested_bytes``,
    ``merge_bytes`` and ``mma_flops``, and ``tiles`` its ``tiles_per_program``:

    - ``L``: seconds per kernel launch in a graph (the call, its merge, a union plan);
    - ``p``: seconds per wave of programs (prologue: query tile, masks; epilogue: output
      write);
    - ``e``: the share of ``BW`` that streaming reaches with enough bytes in flight;
    - ``h``: the share of repeated requests (``U - G``) that miss L2; ``r_p``: L2-to-SM
      throughput over ``PEAK`` (bytes per FLOP): it scales with the SMs' clock and count, as
      the GEMM rate does, not with HBM bandwidth (``perfmodel.class_fit``'s term);
    - ``e_mma``: the share of ``PEAK`` the padded MMA tiles reach;
    - ``lat``: the latency of one K/V tile's load: a program keeps ``stages`` tiles in flight,
      so it streams at ``stages x tile bytes / lat`` -- the bytes in flight per SM set the
      bandwidth a small grid reaches (Little's law);
    - ``c``: seconds per ``mma.sync`` row of a K/V tile's MMAs and softmax (the row tile's
      cost, ``row_cost``);
    - ``k``: seconds per compare step of the union plan kernel's busiest SM slot, which
      runs before the attention.

    It ignores concurrency between kernels, clock variation and the spread of work across
    programs beyond the busiest program's tiles.
    """

    launch_s: float  # L
    wave_s: float  # p
    hbm_eff: float  # e
    l2_miss: float  # h
    l2_bytes_per_flop: float  # r_p
    mma_eff: float  # e_mma
    latency_s: float  # lat
    row_s: float  # c
    compare_s: float  # k

    def call_time_s(self, w: AttentionWork | dict, bw: float, peak: float):
        """Seconds of one call of work ``w`` (an ``AttentionWork`` or a dict of arrays with
        its field names) on a GPU of copy bandwidth ``bw`` and GEMM rate ``peak``."""
        g = _field(w, "unique_bytes")
        u = _field(w, "requested_bytes")
        waves = _field(w, "waves")
        hbm = (g + self.l2_miss * np.maximum(u - g, 0.0) + _field(w, "merge_bytes")) / (
            self.hbm_eff * bw
        )
        l2 = u / (self.l2_bytes_per_flop * peak)
        mma = _field(w, "mma_flops") / (self.mma_eff * peak)
        per_tile = np.maximum(
            self.latency_s / _field(w, "stages"), self.row_s * _field(w, "row_cost")
        )
        chain = waves * _field(w, "tiles_per_program") * per_tile
        fixed = self.launch_s * _field(w, "launches") + self.wave_s * waves
        fixed = fixed + self.compare_s * _field(w, "plan_compares")
        return fixed + np.maximum(np.maximum(hbm, l2), np.maximum(mma, chain))

    def to_json(self) -> dict:
        return {"model": "physical", **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_json(cls, d: dict) -> PhysicalFit:
        return cls(**{k: float(d[k]) for k in PARAMS})


def _field(w, name: str) -> np.ndarray:
    return np.asarray(w[name] if isinstance(w, dict) else getattr(w, name), dtype=float)


def stack(works: list[AttentionWork]) -> dict[str, np.ndarray]:
    """Many calls' work as one dict of arrays (``PhysicalFit.call_time_s`` evaluates it at
    once)."""
    return {f.name: np.array([getattr(w, f.name) for w in works]) for f in fields(AttentionWork)}
