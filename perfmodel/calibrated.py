"""The calibrated predictor: ops priced by the fitted classes of a GPU's profile
(``perfmodel.profiles``; each class's model, ``perfmodel.class_fit``), the roofline for the
rest; and ``make_predictor``, the predictor perfmodel uses for a GPU.

An op's kernel names its class; a per-size family (``rmsnorm/d4096``) without its size falls
back to its nearest measured size, an L2-resident kernel (``gemm@l2``) without a resident class
to the cold one (``CalibratedPredictor._resolve``). A class the profile has no rows of may be
priced by a *stand-in*, a measured class of a kernel that does the same work another way
(``STAND_INS``; the rules: ``stand_in``): the call keeps its own counts (bytes, FLOPs, launch
geometry), only the fitted rates are the stand-in's, and every figure priced so is labelled
``stand-in`` (``CalibratedPredictor.stood_in``); its interval takes the stand-in's
leave-one-out residuals too, as an extrapolation's does (``perfmodel.intervals``).
"""

from __future__ import annotations

import numpy as np
from ssvkit.perfmodel import profiles
from ssvkit.perfmodel.class_fit import ClassFit
from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.intervals import IntervalSource, kernel_family
from ssvkit.perfmodel.nsa_plan import PER_QUERY
from ssvkit.perfmodel.ops import FUSED_CLASSES
from ssvkit.perfmodel.predictor import RESIDENT_SUFFIX, Op, RooflinePredictor
from ssvkit.perfmodel.profiles import Profile
from ssvkit.perfmodel.select_work import TWO_LAUNCH

# (Family, suffix) of a class whose rates, while a profile has no rows of it, are those of the
# class without the suffix (the module docstring).
STAND_INS = (("nsa_verify/", "/" + PER_QUERY), ("select_blocks/", "/" + TWO_LAUNCH))
# The class that prices a fused element-wise op while the profile has none of its family.
ONE_LAUNCH_STAND_IN = "residual_add"


def stand_in(kernel: str) -> str | None:
    """The class that prices ``kernel`` when the profile has no class of it; None when none
    may. Two rules:

    - the NSA kernels' one-row path (``nsa_verify/<mode>/<impl>/per_query``, one draft row per
      row tile) stands in with the packed class of its call until a profile has per-query rows;
    - block selection in two launches (``select_blocks/<method>/two_launch``) stands in with
      its method's class where a profile timed only one form (the H100's rows: the scoring,
      then the pick in torch, priced by the op's torch-pick counts);
    - the fused path's element-wise ops (``perfmodel.ops.FUSED_CLASSES``: ``add_rms_norm/d{d}``,
      ``rope_kv_write``, ``silu_mul_fused``, ``embed``), while a profile has no class of their
      family, stand in with ``residual_add`` (``ONE_LAUNCH_STAND_IN``): the one class of a
      single element-wise launch that streams its rows once, fitted over the same row counts
      and widths (t0 is its launch and ramp, its efficiencies the streaming of a few kilobytes
      to tens of megabytes), while the torch path's other classes time several launches a call
      (a norm, SiLU and multiply, rotary with its copies). Each fused op keeps its own bytes.
    """
    for family, suffix in STAND_INS:
        if kernel.startswith(family) and kernel.endswith(suffix):
            return kernel.removesuffix(suffix)
    if kernel.split("/")[0] in FUSED_CLASSES:
        return ONE_LAUNCH_STAND_IN
    return None


class CalibratedPredictor(RooflinePredictor):
    """``op_time_s`` from a fitted profile for ops tagged with a measured class; the roofline
    (on the same GPU spec) for the rest. ``outside`` flags the points where some op was
    evaluated outside its class's measured range (accumulated over calls)."""

    def __init__(self, gpu: GpuSpec, profile: Profile, dtype: str = "bf16", tp=1, provenance=None):
        super().__init__(gpu, dtype, tp)
        if profile.gpu != gpu.name:
            raise ValueError(
                f"profile {profile.profile_id} is for {profile.gpu!r}, not {gpu.name!r}"
            )
        self.profile = profile
        # A transferred profile carries its own label (``profiles.transfer``).
        self.provenance = provenance or f"calibrated:{profile.profile_id}"
        self.outside = None  # per point, see op_time_s
        self.stood_in = None  # per point: some op priced by a stand-in class
        self.stand_ins: dict[str, str] = {}  # kernel -> the class that stood in for it

    def at(self, idx: np.ndarray) -> CalibratedPredictor:
        tp = self.tp[idx] if self.tp.ndim else self.tp
        return CalibratedPredictor(self.gpu, self.profile, self.dtype, tp, self.provenance)

    def _resolve(self, kernel: str | None) -> tuple[ClassFit | None, bool, str | None]:
        """The class for ``kernel``, whether it is an extrapolation, and the stand-in's name
        when one prices it: a per-size class family (``rmsnorm/d4096``) falls back to its
        nearest measured size, flagged as an extrapolation; an L2-resident kernel (``gemm@l2``)
        without a resident class falls back to the cold one; a kernel of no measured class (nor
        size of its family) to its stand-in (``stand_in``), resident when the kernel is and the
        profile has it."""
        if not kernel:
            return None, False, None
        resident = kernel.endswith(RESIDENT_SUFFIX)
        if resident:
            if kernel in self.profile.classes:
                return self.profile.classes[kernel], False, None
            kernel = kernel.removesuffix(RESIDENT_SUFFIX)  # not timed resident: the cold class
        if kernel in self.profile.classes:
            return self.profile.classes[kernel], False, None
        nearest = self._nearest_size(kernel)
        if nearest is not None:
            return self.profile.classes[nearest], True, None
        sub = stand_in(kernel)
        for name in (sub + RESIDENT_SUFFIX if resident and sub else None, sub):
            if name in self.profile.classes:
                return self.profile.classes[name], False, name
        return None, False, None

    def _nearest_size(self, kernel: str) -> str | None:
        """The measured class of ``kernel``'s per-size family (``rmsnorm/d4096``) nearest in
        size; None when it has no size or its family no class."""
        family, _, size = kernel.rpartition("/")
        digits = size.lstrip("dv")
        if not family or not digits.isdigit():
            return None
        cands = [
            (abs(int(k.rpartition("/")[2].lstrip("dv")) - int(digits)), k)
            for k in self.profile.classes
            if k.rpartition("/")[0] == family and k.rpartition("/")[2].lstrip("dv").isdigit()
        ]
        return min(cands)[1] if cands else None

    @property
    def interval_source(self) -> IntervalSource | None:
        return self.profile.interval_source()

    @property
    def interval_note(self) -> str:
        return self.profile.interval_note

    def op_time_s(self, op: Op) -> np.ndarray:
        return self.price(op)[0]

    def price(self, op: Op) -> tuple[np.ndarray, str | None, np.ndarray | None]:
        """``op``'s seconds, the kernel family of the class that priced it (None: the roofline
        did) and the points where that class was evaluated outside its measured range or stood
        in for another kernel (whose intervals so take the leave-one-out residuals too)."""
        cls, nearest, sub = self._resolve(op.kernel)
        if cls is None or op.kind == "comm":
            return super().op_time_s(op), None, None
        if sub is not None and np.any(np.asarray(op.calls) > 0):
            self.stand_ins[op.kernel] = sub  # only where some point runs the op
        head_dim = op.head_dim
        if cls.slot_plan and op.slot_plan is not None:
            op = op.slot_plan
        calls = np.asarray(op.calls, dtype=float)
        per = np.maximum(calls, 1e-12)
        nbytes, flops = op.bytes / per, op.flops / per
        dedup = None if op.dedup_bytes is None else op.dedup_bytes / per
        depth = np.asarray(op.depth, dtype=float) / per
        steps = np.asarray(op.serial_steps, dtype=float) / per
        rows = np.asarray(op.tile_rows, dtype=float) / per
        stages = tuple(np.asarray(x, dtype=float) / per for x in op.stage_counts)
        t = calls * cls.call_time_s(
            nbytes,
            flops,
            self.profile.copy_bytes_per_s,
            self.profile.gemm_flops_per_s,
            dedup,
            depth,
            steps,
            rows,
            stages,
        )
        # Points evaluated outside the class's measured range keep the edge efficiency; they are
        # remembered so that their figures can be labelled "extrapolated".
        bw, peak = self.profile.copy_bytes_per_s, self.profile.gemm_flops_per_s
        inside = cls.in_range(nbytes, flops, bw, peak, depth, head_dim, steps)
        outside = (calls > 0) & (~inside | nearest)
        stood_in = (calls > 0) & (sub is not None)
        self.outside = _accumulate(self.outside, outside)
        self.stood_in = _accumulate(self.stood_in, stood_in)
        return np.where(calls > 0, t, 0.0), kernel_family(cls.name), outside | stood_in


def _accumulate(flags, new) -> np.ndarray:
    """Per-point flags or-ed over the ops of one evaluation (reset when the shape changes)."""
    same = flags is not None and np.shape(flags) == np.shape(new)
    return flags | new if same else new


def make_predictor(gpu: GpuSpec, dtype: str = "bf16", tp=1):
    """The predictor perfmodel uses for ``gpu``, by ``gpu.pricing``: ``roofline`` (the spec of
    ``get_gpu(..., measured=False)``) gives the bare roofline on its ceilings; otherwise the
    GPU's own fitted profile (``calibrated:<id>``), else one transferred from the nearest
    profile of its architecture (``transferred:<id>-><gpu>``), or of another architecture when
    the pricing allows it; ``ValueError`` when no profile may price it."""
    if gpu.pricing == "roofline":
        return RooflinePredictor(gpu, dtype, tp)
    if profiles.profile_path(gpu.name) is not None:
        return CalibratedPredictor(gpu, profiles.shipped_profile(gpu.name), dtype, tp)
    moved, label = profiles.transfer(
        profiles.shipped_profile(profiles.nearest_profile_gpu(gpu)), gpu
    )
    return CalibratedPredictor(gpu, moved, dtype, tp, label)
