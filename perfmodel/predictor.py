"""One predictor interface: op counts in, seconds out, with a provenance label.

An ``Op`` carries FLOPs, device-memory bytes, kernel launches and link bytes (numpy arrays, one
entry per evaluated point). A predictor maps each op to seconds. ``RooflinePredictor`` is the
floor: ``max(FLOPs / rate, bytes / bandwidth) + launches * launch overhead`` with the GPU's
datasheet ceilings (or measured ones, when a calibration overlay is present). The calibrated
predictor of ``calibration`` implements the same ``op_time_s`` with fitted efficiencies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.hardware import GpuSpec

OP_KINDS = ("gemm", "attention", "elementwise", "selection", "comm", "host")
# Kernel-name suffix of a GEMM or element-wise op of a model whose weights fit in the GPU's L2
# (``weights_fit_l2``): across a forward its weights stay in L2 and every op reads activations
# the op before it just wrote. A calibrated predictor prices such an op with its class timed
# L2-resident (``validation.engine_op_sweep --ops resident``) when the profile has one, else
# with the cold class; the roofline ignores it.
RESIDENT_SUFFIX = "@l2"
RESIDENT_KINDS = ("gemm", "elementwise")


def weights_fit_l2(model, gpu: GpuSpec) -> bool:
    """Whether all of ``model``'s weights fit in ``gpu``'s L2 (False when it is unpublished)."""
    l2 = gpu.l2_bytes
    return l2 is not None and model.num_params() * model.weight_bytes <= l2


@dataclass(slots=True)
class Op:
    """Counts of one op summed over the layers that run it (arrays broadcast to one shape).

    ``kernel`` names the measured op class a calibrated predictor may use for it (e.g.
    ``gemm``, ``dense_verify``); ``calls`` counts its wrapper invocations (default: one per
    launch); ``dedup_bytes`` is the deduplicated share of ``bytes`` where kernels re-read data
    (sparse per-query loads), else None; ``depth`` sums each call's serial reduction length (K of
    a GEMM), whose latency a small call cannot hide; ``serial_steps`` sums each call's dependent
    steps that run after its parallel part (the partial slots an NSA split's merge walks one by
    one, ``perfmodel.nsa_plan``), whose latency adds to the call's time; ``tile_rows`` sums each
    call's MMA rows per program, padded to the kernel's row tile (an NSA or dense verification
    call's ``BLOCK_M``, in ``mma.sync`` rows: ``perfmodel.nsa_plan.mma_row_cost``,
    ``perfmodel.attention_work.dense_verify_tiles``);
    ``stage_counts`` sums each call's counts of the units its extra stages work through, one
    array per count (block selection's top-n stage, ``perfmodel.torch_plan.topn_counts``);
    ``head_dim`` is the head dimension of the attention an attention or selection kernel computes
    (0: none), which tells a calibrated predictor whether its class was measured at it
    (``ClassFit.in_range``).
    """

    kind: str
    flops: np.ndarray
    bytes: np.ndarray
    launches: np.ndarray
    comm_bytes: np.ndarray | float = 0.0
    kernel: str | None = None
    calls: np.ndarray | float | None = None
    dedup_bytes: np.ndarray | None = None
    depth: np.ndarray | float = 0.0
    serial_steps: np.ndarray | float = 0.0
    tile_rows: np.ndarray | float = 0.0
    stage_counts: tuple = ()
    # The same calls counted by the NSA kernels' slot plan (``perfmodel.nsa_work``), which the
    # classes fitted on that plan's counts price (``ClassFit.slot_plan``).
    slot_plan: Op | None = None
    head_dim: int = 0

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise ValueError(f"op kind must be one of {', '.join(OP_KINDS)}, got {self.kind!r}")
        if self.calls is None:
            self.calls = self.launches

    def __add__(self, other: Op) -> Op:
        if other.kind != self.kind or other.kernel != self.kernel:
            raise ValueError(
                f"cannot add a {other.kind}/{other.kernel} op to a {self.kind}/{self.kernel} op"
            )
        dedup = None
        if self.dedup_bytes is not None or other.dedup_bytes is not None:
            dedup = (self.bytes if self.dedup_bytes is None else self.dedup_bytes) + (
                other.bytes if other.dedup_bytes is None else other.dedup_bytes
            )
        return Op(
            self.kind,
            self.flops + other.flops,
            self.bytes + other.bytes,
            self.launches + other.launches,
            self.comm_bytes + other.comm_bytes,
            self.kernel,
            self.calls + other.calls,
            dedup,
            self.depth + other.depth,
            self.serial_steps + other.serial_steps,
            self.tile_rows + other.tile_rows,
            _add_counts(self.stage_counts, other.stage_counts),
            _add_plans(self.slot_plan, other.slot_plan),
            max(self.head_dim, other.head_dim),
        )

    def scaled(self, factor) -> Op:
        """The op repeated ``factor`` times (e.g. over layers)."""
        return Op(
            self.kind,
            self.flops * factor,
            self.bytes * factor,
            self.launches * factor,
            self.comm_bytes * factor,
            self.kernel,
            self.calls * factor,
            None if self.dedup_bytes is None else self.dedup_bytes * factor,
            self.depth * factor,
            self.serial_steps * factor,
            self.tile_rows * factor,
            tuple(x * factor for x in self.stage_counts),
            None if self.slot_plan is None else self.slot_plan.scaled(factor),
            self.head_dim,
        )


def _add_plans(a: Op | None, b: Op | None) -> Op | None:
    """Sum of two ``slot_plan`` ops (a missing one counts nothing)."""
    if a is None or b is None:
        return a if b is None else b
    return a + b


def _add_counts(a: tuple, b: tuple) -> tuple:
    """Element-wise sum of two ``stage_counts`` tuples (a missing count is 0)."""
    n = max(len(a), len(b))
    return tuple((a[i] if i < len(a) else 0.0) + (b[i] if i < len(b) else 0.0) for i in range(n))


class RooflinePredictor:
    """Roofline times on a GPU's ceilings (datasheet, or measured when overlaid).

    Tensor-core ops (``gemm``, ``attention``) run at the dense tensor rate of ``dtype``; other
    ops at the fp32 vector rate. ``comm`` ops are ring all-reduces over the GPU link:
    ``2 (p - 1) / p * bytes / link_bandwidth`` for p = ``tp`` ranks (Patarasuk and Yuan, 2009).
    """

    def __init__(self, gpu: GpuSpec, dtype: str = "bf16", tp: np.ndarray | int = 1):
        self.gpu = gpu
        self.dtype = dtype
        self.tp = np.asarray(tp, dtype=float)
        self.provenance = gpu.provenance

    # The roofline is a floor, not a fit: no residuals, so its figures carry no interval.
    interval_source = None
    interval_note = "the datasheet roofline is a floor with no residuals"

    def at(self, idx: np.ndarray) -> RooflinePredictor:
        """The same predictor restricted to the points ``idx`` (for per-point ``tp``)."""
        tp = self.tp[idx] if self.tp.ndim else self.tp
        return RooflinePredictor(self.gpu, self.dtype, tp)

    def price(self, op: Op) -> tuple[np.ndarray, str | None, np.ndarray | None]:
        """``op``'s seconds, and (as ``perfmodel.calibrated``'s) no kernel family: the roofline
        priced it."""
        return self.op_time_s(op), None, None

    def op_time_s(self, op: Op) -> np.ndarray:
        g = self.gpu
        if op.kind == "comm":
            p = self.tp
            link = np.where(p > 1, 2 * (p - 1) / np.maximum(p, 1), 0.0) * op.comm_bytes
            return link / g.link_bytes_per_s + op.launches * g.launch_overhead_s
        rate = (
            g.tensor_flops_per_s(self.dtype)
            if op.kind in ("gemm", "attention")
            else g.fp32_flops_per_s
        )
        return (
            np.maximum(op.flops / rate, op.bytes / g.hbm_bytes_per_s)
            + op.launches * g.launch_overhead_s
        )

    def floor_s(self, op: Op) -> np.ndarray:
        """The op's floor without launch overhead (used for % of floor reports)."""
        rate = (
            self.gpu.tensor_flops_per_s(self.dtype)
            if op.kind in ("gemm", "attention")
            else self.gpu.fp32_flops_per_s
        )
        return np.maximum(op.flops / rate, op.bytes / self.gpu.hbm_bytes_per_s)
