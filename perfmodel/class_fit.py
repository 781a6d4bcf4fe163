"""The fitted model of one op class (``ClassFit``): per-op-class efficiencies and latencies
over the measured ceilings, as ``calibration.fit`` fits them and ``perfmodel.calibrated``
prices ops with them. One call (one wrapper invocation, e.g. one ``dense_verify`` including
its merge) takes

    t = t0 + t_s * S + t_r * R + sum_i t_x,i * X_i
          + max((t_k + t_kr * R + t_km * G / U) * K, bytes_eff / (e_b(bytes) * BW),
                flops / (e_c(flops) * PEAK))

(the terms: ``ClassFit``; on a GPU other than the fit's the memory term splits into the part
HBM bounds and the part the SMs bound, ``ClassFit._memory_s``; a class with an overlap
exponent p, ``overlap_p``, takes the p-norm of the three bounds in place of their maximum).
Calibration's idea, after Calculon and AIConfigurator: the roofline's shape with
size-dependent efficiency, a serial chain as a third bound beside the roofline's two. It
ignores contention between concurrent kernels and clock variation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _log_size(x) -> np.ndarray:
    """log10 of a byte or FLOP count, at least 0: where the efficiency curves read it."""
    return np.log10(np.maximum(np.asarray(x, dtype=float), 1.0))


@dataclass(frozen=True, slots=True)
class CallInputs:
    """The calls ``ClassFit.time_of`` prices, as float arrays, with what the model derives
    from them alone (log sizes, the L2 share of the requested bytes): built once where the
    same calls are priced under many parameters (a fit's residuals)."""

    nbytes: np.ndarray
    flops: np.ndarray
    log_bytes: np.ndarray
    log_flops: np.ndarray
    dedup: np.ndarray | None  # distinct bytes, at most the requested ones
    reread: np.ndarray | None  # requested bytes beyond the distinct ones
    miss: np.ndarray | float  # distinct over requested bytes (1 without a dedup term)
    depth: np.ndarray
    steps: np.ndarray
    rows: np.ndarray
    stages: tuple[np.ndarray, ...]

    @classmethod
    def of(
        cls, nbytes, flops, dedup_bytes=None, depth=0.0, steps=0.0, rows=0.0, stages=()
    ) -> CallInputs:
        nbytes, flops = np.asarray(nbytes, dtype=float), np.asarray(flops, dtype=float)
        dedup = reread = None
        miss = 1.0
        if dedup_bytes is not None:
            dedup = np.minimum(np.asarray(dedup_bytes, dtype=float), nbytes)
            reread = nbytes - dedup
            miss = dedup / np.maximum(nbytes, 1.0)
        return cls(
            nbytes,
            flops,
            _log_size(nbytes),
            _log_size(flops),
            dedup,
            reread,
            miss,
            np.asarray(depth, dtype=float),
            np.asarray(steps, dtype=float),
            np.asarray(rows, dtype=float),
            tuple(np.asarray(x, dtype=float) for x in stages),
        )


# The share of a class's fixed cost ``t0`` under which its memory term at the smallest measured
# bytes counts as launch-bound (``ClassFit.in_range``).
LAUNCH_BOUND_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class ClassFit:
    """Fitted parameters of one op class, the terms of the module docstring's model (the
    measurements behind them: docs/results/calibration.md):

    - ``BW``, ``PEAK``: the profile's measured copy bandwidth and bf16 GEMM rate;
    - ``e_b``, ``e_c`` (``bytes_eff``, ``flops_eff`` at ``bytes_knots``, ``flops_knots``):
      efficiencies, piecewise linear in log10(bytes) and log10(FLOPs) between the fitted
      knots, held constant outside the measured range (``bytes_range``, ``flops_range``; such
      a figure is labelled ``extrapolated``);
    - ``t0``: fixed cost per call (launches, host-free graph replay);
    - ``t_k * K`` (``t_depth_s``): the latency of a call's serial reduction of depth K (a
      GEMM's inner dimension), fitted for GEMMs and repair (K: the tiles one program walks in
      series times its waves, ``perfmodel.repair_work``): a small GEMM's time grows with K at
      equal bytes (one CTA walks the whole K loop). The loop's loads are the call's memory
      traffic, so the chain overlaps the streaming: a third bound beside the roofline's two,
      not a cost on top (added on top, it made every large GEMM pay it too, and the fit shrank
      ``t_k`` until the small GEMMs missed);
    - ``t_kr`` (``t_depth_row_s``): for NSA, sparse and dense verification the chain is the key
      tiles one program walks in series (``perfmodel.nsa_work``, ``perfmodel.sparse_work``,
      ``perfmodel.dense_work``), each at ``t_k + t_kr x R``: a tile's load latency over the
      pipeline's depth plus its MMAs and softmax over the R padded rows (a 64-row union tile
      with its member masks takes longer per key tile than a 16-row one; a dense call's R
      counts the rows its SM holds at once); block selection's chain is its score tiles in
      series, R one tile's MMA work a warp issues (``perfmodel.select_work``);
    - ``t_km`` (``t_depth_miss_s``): for repair a chain tile also waits ``t_km x G / U``, the
      share of its bytes that misses L2 (``G`` the call's distinct bytes, ``U`` its requested
      ones);
    - ``t_s * S`` (``t_step_s``): the latency of the S dependent steps a call runs after its
      parallel part, fitted for NSA and dense verification: a split call's merge walks its
      tile's partial slots one by one (``perfmodel.nsa_plan``; 16 at a time for dense,
      ``perfmodel.dense_work``);
    - ``t_r * R`` (``t_row_s``): the latency of a program's row tile of R MMA rows (padding
      included), fitted for NSA and dense verification: every program computes, loads and
      writes ``BLOCK_M`` rows whatever the draft rows, and ``BLOCK_M`` steps 16 / 32 / 64
      (/ 128 dense) with t (``perfmodel.nsa_plan``, ``perfmodel.dense_work``: a dense call's R
      is the rows its busiest SM holds at once, weighted by the key tile's work at its head
      dimension); R counts ``mma.sync`` rows, a 64-row tile's ``wgmma`` rows at half
      (``nsa_plan.mma_row_cost``). Dense verification's FLOPs are its padded tiles' too;
    - ``t_x,i * X_i`` (``t_stage_s``): the stages a call runs after its streaming part that
      neither stream bytes nor walk one chain, one fitted rate per count X_i: block
      selection's top-n stage (``torch.topk`` + two sorts, ``perfmodel.torch_plan.topn_counts``,
      or the threshold pick's counts, ``perfmodel.select_work``), which scans the R x NB scores
      (R = B x Hkv x t rows) and orders R x top_n keys, a row's sort lengthening with top_n;
      NSA's and repair's program waves (each loads its programs' queries and writes their
      outputs); a dense call's merge launch and the bytes its busiest SMs stream past an even
      share (``perfmodel.dense_work``'s ``tail_bytes``);
    - ``bytes_eff = G + h (U - G)`` (h: ``l2_miss``) for classes whose kernels re-read blocks
      other programs of the same call also read (``per_query`` sparse verification, repair, a
      dense call's row tiles of one KV head): U is the bytes the algorithm requests, G the
      deduplicated bytes of the call, h the fitted share of repeated reads that miss L2. Other
      classes use U. For sparse verification (and repair) also ``bytes_eff = max(G + h (U - G),
      U x BW / (r_p x PEAK))`` (r_p: ``l2_bytes_per_flop``): every requested byte, hit or miss,
      crosses the L2-to-SM path, whose throughput r_p x PEAK scales with the SMs' clock and
      count, which the GEMM rate measures, not with HBM bandwidth: on another GPU of the same
      chip a call bound by that path keeps its time where its HBM bytes follow the copy rate.
      Fitted as r x BW with r in [1, 4] on the GPU of the fit, r_p = r x BW / PEAK there,
      and e_b of such a class at most what a read-only HBM stream reaches over the copy rate
      (``calibration.fit_class.HBM_READ_EFF_MAX``): its memory term counts HBM bytes, so the
      repeats that hit L2 take the L2-to-SM path;
    - ``slot_plan``: the class is fitted on the current kernels' launch-plan counts, and the
      step model prices it with its op's ``slot_plan``;
    - ``overlap_p`` (p, fitted for NSA): the chain, memory and compute bounds combine as their
      p-norm, ``(chain^p + memory^p + compute^p)^(1/p)``, in place of their maximum (p -> inf;
      0 here). A program that walks its key tiles one after another overlaps a tile's loads,
      its MMAs and its softmax only in part: where the three are of like size the call takes
      longer than the largest (an NSA tile of 64 packed rows at batch 16 streams, computes and
      waits on its chain alike), and where one dominates, about that one.
    """

    name: str
    t0_s: float
    bytes_knots: tuple[float, ...]  # log10 bytes
    bytes_eff: tuple[float, ...]
    flops_knots: tuple[float, ...]  # log10 FLOPs
    flops_eff: tuple[float, ...]
    l2_miss: float | None  # h, for classes with a dedup term
    # log10 ranges of bytes and FLOPs over every measured row of the class (fit and held out):
    # a figure outside them is an extrapolation.
    bytes_range: tuple[float, float] = (0.0, 0.0)
    flops_range: tuple[float, float] = (0.0, 0.0)
    # The longest serial chain (depth) over every measured row of a class with a chain term
    # (0: none): a call's longer chain is an extrapolation of that term.
    depth_max: float = 0.0
    t_depth_s: float = 0.0  # t_k: seconds per unit of reduction depth
    t_step_s: float = 0.0  # t_s: seconds per serial step after the parallel part
    t_row_s: float = 0.0  # t_r: seconds per padded MMA row of the row tiles
    t_stage_s: tuple[float, ...] = ()  # t_x,i: seconds per unit of each stage count
    # r_p: L2-to-SM throughput over PEAK (bytes per FLOP), for classes with a dedup term.
    l2_bytes_per_flop: float = 0.0
    t_depth_row_s: float = 0.0  # t_kr: seconds per chain unit per padded MMA row of the tile
    t_depth_miss_s: float = 0.0  # t_km: seconds per chain unit that misses L2
    overlap_p: float = 0.0  # p of the bounds' p-norm; 0: their maximum
    # Fitted on the current kernels' launch-plan counts (``perfmodel.nsa_work``,
    # ``perfmodel.select_work``, ``perfmodel.sparse_work``, ``perfmodel.dense_work``,
    # ``perfmodel.repair_work``): the step model prices such a class with its op's ``slot_plan``.
    slot_plan: bool = False
    # (BW, PEAK) of the GPU the class was fitted on, from its profile (not part of the class's
    # JSON); () when unknown: the memory term then follows the copy rate alone (``_memory_s``).
    fit_ceilings: tuple[float, ...] = ()
    # The head dimensions of the class's measured rows (not part of the class's JSON: its
    # profile keeps them beside the fit); () for a class whose rows have none.
    head_dims: tuple[int, ...] = ()
    # The most serial steps of the class's measured rows (kept beside the fit like
    # ``head_dims``); None for a class whose rows have none, or a profile that keeps none.
    steps_max: float | None = None

    def in_range(self, nbytes, flops, bw, peak, depth=None, head_dim=0, steps=None):
        """True where the binding term of the model lies inside the measured range: bytes
        always (the fixed cost and memory term), FLOPs where the compute term binds, the
        serial chain (``depth``, when given) no longer than the longest measured one, the
        serial steps after the parallel part (``steps``, when given) no more than the most any
        measured row ran (a longer merge than any timed prices its steps at a rate fitted
        elsewhere), and the head dimension (``head_dim``, 0: none) one the class's rows were
        measured at: the
        kernels' tile shapes, register use and the cost of their fp32 score tiles change with
        it in ways no fitted term of bytes or FLOPs follows. Below the smallest measured bytes
        of a class whose smallest rows are launch-bound (their memory term under
        ``LAUNCH_BOUND_SHARE`` of ``t0``) a call is no extrapolation: fewer bytes can only take
        it from that edge's time toward ``t0``."""
        nbytes, flops = np.asarray(nbytes, dtype=float), np.asarray(flops, dtype=float)
        ok_h = True
        if self.head_dims and head_dim:
            ok_h = int(head_dim) in self.head_dims
        ok_d = True
        if depth is not None and self.depth_max > 0:
            ok_d = np.asarray(depth, dtype=float) <= self.depth_max * (1 + 1e-9)
        ok_s = True
        if steps is not None and self.steps_max is not None:
            ok_s = np.asarray(steps, dtype=float) <= self.steps_max * (1 + 1e-9)
        lb, lf = _log_size(nbytes), _log_size(flops)
        tol = 1e-9
        edge = 10.0 ** self.bytes_range[0]
        launch_bound = edge / (self.bytes_eff[0] * bw) <= LAUNCH_BOUND_SHARE * self.t0_s
        low_ok = (lb >= self.bytes_range[0] - tol) | launch_bound
        ok_b = low_ok & (lb <= self.bytes_range[1] + tol)
        ok_f = (lf >= self.flops_range[0] - tol) & (lf <= self.flops_range[1] + tol)
        eb = np.interp(lb, self.bytes_knots, self.bytes_eff)
        ef = np.interp(lf, self.flops_knots, self.flops_eff)
        compute_bound = flops / (ef * peak) > nbytes / (eb * bw)
        return ok_b & (ok_f | ~compute_bound) & ok_d & ok_h & ok_s

    def call_time_s(
        self, nbytes, flops, bw, peak, dedup_bytes=None, depth=0.0, steps=0.0, rows=0.0, stages=()
    ):
        """Seconds of one call moving ``nbytes`` (requested) and doing ``flops`` in a serial
        chain of ``depth``, followed by ``steps`` serial steps, over row tiles of ``rows``
        padded rows, with extra stages of ``stages`` counts (the model in the module
        docstring, its terms in the class's)."""
        return self.time_of(
            CallInputs.of(nbytes, flops, dedup_bytes, depth, steps, rows, stages), bw, peak
        )

    def time_of(self, c: CallInputs, bw, peak):
        """``call_time_s`` of calls already in ``CallInputs`` form."""
        hbm_bytes, l2_bytes, miss = c.nbytes, None, 1.0
        if self.l2_miss is not None and c.dedup is not None:
            hbm_bytes = c.dedup + self.l2_miss * c.reread
            miss = c.miss
            if self.l2_bytes_per_flop > 0:
                l2_bytes = c.nbytes * (bw / (self.l2_bytes_per_flop * peak))
        eb = np.interp(c.log_bytes, self.bytes_knots, self.bytes_eff)
        ef = np.interp(c.log_flops, self.flops_knots, self.flops_eff)
        fixed = self.t0_s + self.t_step_s * c.steps + self.t_row_s * c.rows
        for rate, count in zip(self.t_stage_s, c.stages, strict=False):
            fixed = fixed + rate * count
        chain = c.depth * (
            self.t_depth_s + self.t_depth_row_s * c.rows + self.t_depth_miss_s * miss
        )
        memory = self._memory_s(hbm_bytes, eb, bw, peak)
        if l2_bytes is not None:
            memory = np.maximum(memory, l2_bytes / (eb * bw))
        compute = c.flops / (ef * peak)
        top = np.maximum(chain, np.maximum(memory, compute))
        if not self.overlap_p:
            return fixed + top
        p, unit = self.overlap_p, np.where(top > 0, top, 1.0)
        shares = (chain / unit) ** p + (memory / unit) ** p + (compute / unit) ** p
        return fixed + top * shares ** (1.0 / p)

    def _memory_s(self, nbytes, eb, bw, peak):
        """The memory term of ``nbytes`` at efficiency ``eb``: ``nbytes / (eb x BW)`` on the GPU
        of the fit. On another GPU (``fit_ceilings`` known and different) that time splits in
        two: the bytes at the fit GPU's copy rate, which HBM bounds and which follow the copy
        rate, and the rest of the time a call of ``eb`` < 1 takes, which the SMs' side bounds
        (bytes in flight over the memory latency) and which follows the GEMM rate (the SMs'
        clock and count). A class at its copy rate moves with the copy rate; one far under it
        keeps most of its time on a GPU with the same SMs and more bandwidth."""
        here = nbytes / (eb * bw)
        if not self.fit_ceilings or self.fit_ceilings == (bw, peak):
            return here
        bw0, peak0 = self.fit_ceilings
        at_fit = nbytes / (eb * bw0)
        hbm = np.minimum(nbytes / bw0, at_fit)
        return hbm * (bw0 / bw) + (at_fit - hbm) * (peak0 / peak)

    def to_json(self) -> dict:
        return {
            "t0_s": self.t0_s,
            "bytes_knots": list(self.bytes_knots),
            "bytes_eff": list(self.bytes_eff),
            "flops_knots": list(self.flops_knots),
            "flops_eff": list(self.flops_eff),
            "l2_miss": self.l2_miss,
            "bytes_range": list(self.bytes_range),
            "flops_range": list(self.flops_range),
            **({"depth_max": self.depth_max} if self.depth_max else {}),
            "t_depth_s": self.t_depth_s,
            "t_step_s": self.t_step_s,
            "t_row_s": self.t_row_s,
            "t_stage_s": list(self.t_stage_s),
            "l2_bytes_per_flop": self.l2_bytes_per_flop,
            **({"t_depth_row_s": self.t_depth_row_s} if self.slot_plan else {}),
            **({"t_depth_miss_s": self.t_depth_miss_s} if self.t_depth_miss_s else {}),
            **({"slot_plan": True} if self.slot_plan else {}),
            **({"overlap_p": self.overlap_p} if self.overlap_p else {}),
        }

    @classmethod
    def from_json(
        cls,
        name: str,
        d: dict,
        fit_ceilings: tuple[float, float] | None = None,
        head_dims=(),
        steps_max: float | None = None,
    ) -> ClassFit:
        """The fit of ``name`` from its JSON; ``fit_ceilings``: its profile's (BW, PEAK), which
        price it on other GPUs (``_memory_s``) and turn an older profile's L2 ratio over BW
        (``l2_ratio``) into ``l2_bytes_per_flop`` (``ValueError`` when such a fit comes
        without them); ``head_dims``, ``steps_max``: the head dimensions and the most serial
        steps of the class's measured rows, which its profile keeps beside the fit."""
        bytes_per_flop = fit_ceilings[0] / fit_ceilings[1] if fit_ceilings else None
        l2 = d.get("l2_bytes_per_flop")
        if l2 is None and "l2_ratio" in d:
            if not bytes_per_flop:
                raise ValueError(
                    f"class {name!r} keeps its L2 path as l2_ratio {d['l2_ratio']!r}: "
                    "converting it needs its profile's copy and GEMM rates"
                )
            l2 = d["l2_ratio"] * bytes_per_flop
        l2 = 0.0 if l2 is None else l2
        return cls(
            name=name,
            t0_s=float(d["t0_s"]),
            bytes_knots=tuple(d["bytes_knots"]),
            bytes_eff=tuple(d["bytes_eff"]),
            flops_knots=tuple(d["flops_knots"]),
            flops_eff=tuple(d["flops_eff"]),
            l2_miss=d.get("l2_miss"),
            bytes_range=tuple(d["bytes_range"]),
            flops_range=tuple(d["flops_range"]),
            depth_max=float(d.get("depth_max", 0.0)),
            t_depth_s=float(d.get("t_depth_s", 0.0)),
            t_step_s=float(d.get("t_step_s", 0.0)),
            t_row_s=float(d.get("t_row_s", 0.0)),
            t_stage_s=tuple(float(x) for x in d.get("t_stage_s", ())),
            l2_bytes_per_flop=float(l2),
            t_depth_row_s=float(d.get("t_depth_row_s", 0.0)),
            t_depth_miss_s=float(d.get("t_depth_miss_s", 0.0)),
            slot_plan=bool(d.get("slot_plan", False)),
            overlap_p=float(d.get("overlap_p", 0.0)),
            fit_ceilings=tuple(map(float, fit_ceilings)) if fit_ceilings else (),
            head_dims=tuple(int(x) for x in head_dims),
            steps_max=None if steps_max is None else float(steps_max),
        )
