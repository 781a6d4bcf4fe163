"""The calibrated predictor: fitted per-op-class efficiencies over the measured ceilings.

Model of one call (one wrapper invocation, e.g. one ``dense_verify`` including its merge) of an
op class, fitted by ``calibration.fit`` on GPU measurements:

    t = t0 + t_s * S + t_r * R + sum_i t_x,i * X_i
          + max(t_k * K, bytes_eff / (e_b(bytes) * BW), flops / (e_c(flops) * PEAK))

- ``BW``, ``PEAK``: the profile's measured copy bandwidth and bf16 GEMM rate;
- ``e_b``, ``e_c``: efficiencies, piecewise linear in log10(bytes) and log10(FLOPs) between the
  fitted knots, held constant outside the measured range (such a figure is labelled
  ``extrapolated``);
- ``t0``: fixed cost per call (launches, host-free graph replay);
- ``t_k * K``: the latency of a call's serial reduction of depth K (a GEMM's inner dimension),
  fitted for GEMMs and repair (K: the tiles one SM slot walks in series,
  ``perfmodel.repair_plan``; 32 programs of the tiny pair's batch-1 call walk 32 missed blocks
  in 24.6 us, 0.7 TB/s): a small GEMM's time grows with K at equal bytes (one CTA walks the
  whole K loop; measured 3.7 us at K = 256 and 6.0 us at K = 2048 for ~0.5 MB calls). The
  loop's loads are the call's memory traffic, so the chain overlaps the streaming: a third
  bound beside the roofline's two, not a cost on top (added, it made every large GEMM pay it
  too and the fit shrank t_k until the small ones missed by 20%: 6.0 us predicted 4.8);
- ``t_s * S``: the latency of the S dependent steps a call runs after its parallel part,
  fitted for NSA verification only: a split call's merge walks its tile's partial slots one by
  one (``perfmodel.nsa_plan``), so at 8 q / 2 KV heads t = 17 (two row tiles, 33 splits each)
  runs faster than t = 12 (one tile, 64 splits) although it does more work;
- ``t_r * R``: the latency of a program's row tile of R MMA rows (padding included), fitted for
  NSA and dense verification: every program computes, loads and writes ``BLOCK_M`` rows
  whatever the draft rows, and ``BLOCK_M`` steps 16 / 32 / 64 (/ 128 dense) with t
  (``perfmodel.nsa_plan``, ``perfmodel.attention_work.dense_verify_tiles``); R counts
  ``mma.sync`` rows, a 64-row tile's ``wgmma`` rows at half (``nsa_plan.mma_row_cost``). Dense
  verification's FLOPs are its padded tiles' too: at 32 q / 8 KV heads, t = 17 runs the
  128-row tile of t = 32 (H200, batch 16, 32K: 495 us at t = 16, 665 us at t = 32);
- ``t_x,i * X_i``: the stages a call runs after its streaming part that neither stream bytes nor
  walk one chain, one fitted rate per count X_i, fitted for block selection only: its top-n
  stage (``torch.topk`` + two sorts, ``perfmodel.torch_plan.topn_counts``) scans the R x NB
  scores (R = B x Hkv x t rows), orders R x top_n keys, and a row's sort lengthens with top_n:
  at equal bytes top_n = 64 costs 4-5 us more than 16 at R = 32 and 34-45 us more at R = 2048,
  whatever the context;
- ``bytes_eff = G + h (U - G)`` for classes whose kernels re-read blocks other programs of the
  same call also read (``per_query`` sparse verification): U is the bytes the algorithm requests,
  G the deduplicated bytes of the call, h the fitted share of repeated reads that miss L2. Other
  classes use U. For sparse verification also ``bytes_eff = max(G + h (U - G), U / r)``: every
  requested byte, hit or miss, crosses the L2-to-SM path, whose throughput is r x BW (fitted,
  1 to 4). With it the big-batch calls are what the two levels say: at overlap 0.9 the
  8B-geometry call streams its 4.3 GB of requests in 587-596 us (7.2-7.3 TB/s, L2-bound,
  G = 0.6 GB) while at overlap 0.5 and 64K context its 2.0 GB of distinct blocks set 866 us;
  without it the one share h (0.48) had to serve both (with it h = 0.12, r = 2.4).

A class the profile has no rows of may be priced by a *stand-in*, a measured class of a kernel
that does the same work another way (``STAND_INS``): the call keeps its own counts (bytes, FLOPs,
launch geometry), only the fitted rates are the stand-in's, and every figure priced so is
labelled ``stand-in`` (``CalibratedPredictor.stood_in``); its interval takes the stand-in's
leave-one-out residuals too, as an extrapolation's does (``perfmodel.intervals``). Two rules:

- the NSA kernels' one-row path (``nsa_verify/<mode>/<impl>/per_query``, one draft row per row
  tile) stands in with the packed class of its call until a profile has per-query rows;
- the fused path's element-wise ops (``perfmodel.ops.FUSED_CLASSES``: ``add_rms_norm/d{d}``,
  ``rope_kv_write``, ``silu_mul_fused``, ``embed``), while a profile has no class of their
  family, stand in with ``residual_add`` (``ONE_LAUNCH_STAND_IN``): the one class of a single
  element-wise launch that streams its rows once, fitted over the same row counts and widths
  (t0 is its launch and ramp, its efficiencies the streaming of a few kilobytes to tens of
  megabytes), while the torch path's other classes time several launches a call (a norm, SiLU
  and multiply, rotary with its copies). Each fused op keeps its own bytes.

Calibration's idea, after Calculon and AIConfigurator: the roofline's shape with size-dependent
efficiency. It ignores contention between concurrent kernels and clock variation.

A GPU without a fitted profile is priced by a transferred one (``transfer``): the source
profile's fitted parameters evaluated with the target's ceilings. What transfers: ``BW`` and
``PEAK`` become the target's copy bandwidth and bf16 tensor rate (its measured ``ceilings.json``
when committed, else its datasheet figures), and the op counts come from the target's spec (SM
count for the NSA and repair launch plans, L2 size for L2-resident classes), so a call's roofline
terms scale with the target. What is assumed to carry over unchanged: the efficiencies ``e_b``,
``e_c`` at a given call size (same memory system and tensor cores, so the same fraction of the
ceiling), the fixed and per-unit latencies ``t0``, ``t_k``, ``t_s``, ``t_r``, ``t_x`` (launch,
synchronisation and SM clock costs), and the L2 terms ``h`` and ``r``. Datasheet ceilings are
peaks that copies and GEMMs do not reach, so a transfer onto them is optimistic by the source
GPU's gap between measured and datasheet ceilings. The source is the GPU's own profile, else the
profile of its architecture whose GPU is closest in datasheet copy bandwidth; another
architecture's only when the spec asks for it (``GpuSpec.pricing``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ssvkit.perfmodel import hardware
from ssvkit.perfmodel.hardware import GpuSpec, get_gpu, gpu_names
from ssvkit.perfmodel.intervals import IntervalSource, IntervalTable, kernel_family
from ssvkit.perfmodel.nsa_plan import PER_QUERY
from ssvkit.perfmodel.ops import FUSED_CLASSES
from ssvkit.perfmodel.predictor import RESIDENT_SUFFIX, Op, RooflinePredictor

PROFILE_VERSION = 1
# Suffix of a class whose rates, while a profile has no rows of it, are those of the class
# without it (the module docstring).
STAND_INS = ("/" + PER_QUERY,)
# The class that prices a fused element-wise op while the profile has none of its family.
ONE_LAUNCH_STAND_IN = "residual_add"


def stand_in(kernel: str) -> str | None:
    """The class that prices ``kernel`` when the profile has no class of it (the module
    docstring's rules); None when none may."""
    for suffix in STAND_INS:
        if kernel.startswith("nsa_verify/") and kernel.endswith(suffix):
            return kernel.removesuffix(suffix)
    if kernel.split("/")[0] in FUSED_CLASSES:
        return ONE_LAUNCH_STAND_IN
    return None


@dataclass(frozen=True, slots=True)
class ClassFit:
    """Fitted parameters of one op class."""

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
    t_depth_s: float = 0.0  # t_k: seconds per unit of reduction depth
    t_step_s: float = 0.0  # t_s: seconds per serial step after the parallel part
    t_row_s: float = 0.0  # t_r: seconds per padded MMA row of the row tiles
    t_stage_s: tuple[float, ...] = ()  # t_x,i: seconds per unit of each stage count
    l2_ratio: float = 0.0  # r: L2-to-SM throughput over BW, for classes with a dedup term

    def efficiencies(self, nbytes, flops):
        lb = np.log10(np.maximum(np.asarray(nbytes, dtype=float), 1.0))
        lf = np.log10(np.maximum(np.asarray(flops, dtype=float), 1.0))
        eb = np.interp(lb, self.bytes_knots, self.bytes_eff)
        ef = np.interp(lf, self.flops_knots, self.flops_eff)
        return eb, ef

    def in_range(self, nbytes, flops, bw, peak):
        """True where the binding term of the model lies inside the measured range: bytes
        always (the fixed cost and memory term), FLOPs where the compute term binds."""
        nbytes, flops = np.asarray(nbytes, dtype=float), np.asarray(flops, dtype=float)
        lb = np.log10(np.maximum(nbytes, 1.0))
        lf = np.log10(np.maximum(flops, 1.0))
        tol = 1e-9
        ok_b = (lb >= self.bytes_range[0] - tol) & (lb <= self.bytes_range[1] + tol)
        ok_f = (lf >= self.flops_range[0] - tol) & (lf <= self.flops_range[1] + tol)
        eb, ef = self.efficiencies(nbytes, flops)
        compute_bound = flops / (ef * peak) > nbytes / (eb * bw)
        return ok_b & (ok_f | ~compute_bound)

    def call_time_s(
        self, nbytes, flops, bw, peak, dedup_bytes=None, depth=0.0, steps=0.0, rows=0.0, stages=()
    ):
        """Seconds of one call moving ``nbytes`` (requested) and doing ``flops`` in a serial
        chain of ``depth``, followed by ``steps`` serial steps, over row tiles of ``rows``
        padded rows, with extra stages of ``stages`` counts (the model in the module
        docstring)."""
        nbytes = np.asarray(nbytes, dtype=float)
        eff_bytes = nbytes
        if self.l2_miss is not None and dedup_bytes is not None:
            g = np.minimum(np.asarray(dedup_bytes, dtype=float), nbytes)
            eff_bytes = g + self.l2_miss * (nbytes - g)
            if self.l2_ratio > 0:
                eff_bytes = np.maximum(eff_bytes, nbytes / self.l2_ratio)
        eb, ef = self.efficiencies(nbytes, flops)
        fixed = (
            self.t0_s
            + self.t_step_s * np.asarray(steps, dtype=float)
            + self.t_row_s * np.asarray(rows, dtype=float)
        )
        for rate, count in zip(self.t_stage_s, stages, strict=False):
            fixed = fixed + rate * np.asarray(count, dtype=float)
        chain = self.t_depth_s * np.asarray(depth, dtype=float)
        roof = np.maximum(eff_bytes / (eb * bw), np.asarray(flops) / (ef * peak))
        return fixed + np.maximum(chain, roof)

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
            "t_depth_s": self.t_depth_s,
            "t_step_s": self.t_step_s,
            "t_row_s": self.t_row_s,
            "t_stage_s": list(self.t_stage_s),
            "l2_ratio": self.l2_ratio,
        }

    @classmethod
    def from_json(cls, name: str, d: dict) -> ClassFit:
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
            t_depth_s=float(d.get("t_depth_s", 0.0)),
            t_step_s=float(d.get("t_step_s", 0.0)),
            t_row_s=float(d.get("t_row_s", 0.0)),
            t_stage_s=tuple(float(x) for x in d.get("t_stage_s", ())),
            l2_ratio=float(d.get("l2_ratio", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class Profile:
    """A fitted profile: which GPU and device, its ceilings and its classes; the residuals its
    prediction intervals come from (``perfmodel.intervals``; None: the profile has none); for
    one moved to another GPU by ``transfer``, the GPU it was fitted on and the interval
    source's datasheet-ceiling gap."""

    profile_id: str
    gpu: str
    device_name: str
    copy_bytes_per_s: float
    gemm_flops_per_s: float
    classes: dict[str, ClassFit]
    intervals: IntervalTable | None = None
    fit_gpu: str = ""  # "" : the profile's own GPU
    interval_note: str = ""  # why a transferred profile has no intervals
    gap_bytes: float = 0.0
    gap_flops: float = 0.0

    def interval_source(self) -> IntervalSource | None:
        """The intervals of predictions priced with this profile (None: it has none)."""
        if self.intervals is None:
            return None
        transferred = bool(self.fit_gpu) and self.fit_gpu != self.gpu
        return IntervalSource(self.intervals, transferred, self.gap_bytes, self.gap_flops)

    @classmethod
    def load(cls, path: str | Path, gpu: str | None = None) -> Profile:
        return cls.from_json(json.loads(Path(path).read_text()), gpu, source=str(path))

    @classmethod
    def from_json(cls, d: dict, gpu: str | None = None, *, source: str = "profile") -> Profile:
        """A profile from its JSON document; ``gpu`` refuses one measured on another GPU."""
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"{source} has version {d.get('version')!r}, expected 1")
        if gpu is not None and d["gpu"] != gpu:
            raise ValueError(
                f"profile {d['profile_id']} was measured on {d['gpu']!r} "
                f"({d['device_name']}), not {gpu!r}: refusing it"
            )
        return cls(
            profile_id=d["profile_id"],
            gpu=d["gpu"],
            device_name=d["device_name"],
            copy_bytes_per_s=float(d["ceilings"]["copy_bytes_per_s"]),
            gemm_flops_per_s=float(d["ceilings"]["gemm_flops_per_s"]),
            classes={k: ClassFit.from_json(k, v["fit"]) for k, v in d["classes"].items()},
            intervals=IntervalTable.from_json(d["intervals"]) if "intervals" in d else None,
            interval_note="" if "intervals" in d else f"profile {d['profile_id']} has no residuals",
        )

    def call_time_s(
        self, cls: str, nbytes, flops, dedup_bytes=None, depth=0.0, steps=0.0, rows=0.0, stages=()
    ):
        c = self.classes[cls]
        bw, peak = self.copy_bytes_per_s, self.gemm_flops_per_s
        return c.call_time_s(nbytes, flops, bw, peak, dedup_bytes, depth, steps, rows, stages)


def profile_path(gpu: str) -> Path | None:
    """``calibration/profiles/<gpu>/profile.json`` when the calibration data ships one."""
    root = hardware.profiles_dir()  # looked up at call time: one root for ceilings and profiles
    p = None if root is None else root / gpu / "profile.json"
    return p if p is not None and p.is_file() else None


@functools.cache
def shipped_profile(gpu: str) -> Profile:
    """The fitted profile the calibration data ships for ``gpu`` (read once per process)."""
    path = profile_path(gpu)
    if path is None:
        raise ValueError(f"no fitted profile ships for {gpu!r}")
    return Profile.load(path, gpu=gpu)


def profile_gpus() -> list[str]:
    """Registry keys of the GPUs with a fitted profile, in registry order."""
    return [g for g in gpu_names() if profile_path(g) is not None]


def transfer(profile: Profile, gpu: GpuSpec) -> tuple[Profile, str]:
    """``profile`` evaluated with ``gpu``'s ceilings (module docstring), and the provenance of
    the figures priced with it: ``transferred:<profile id>-><gpu>``, or
    ``transferred-cross-arch:...`` when the architectures differ, which ``gpu.pricing`` must
    allow (``any-architecture``); else ``ValueError`` naming both GPUs and architectures."""
    source_arch = get_gpu(profile.gpu, measured=False).architecture
    cross = source_arch != gpu.architecture
    if cross and gpu.pricing != "any-architecture":
        raise ValueError(
            f"profile {profile.profile_id} is for {profile.gpu} ({source_arch}), not "
            f"{gpu.name} ({gpu.architecture}): a transfer across architectures is refused "
            "unless asked for (--transfer-across-architectures)"
        )
    source = get_gpu(profile.gpu, measured=False)

    def gap(field: str, measured: float) -> float:
        # A datasheet ceiling of the target is optimistic by what the source's is.
        if gpu.sources.get(field, "").startswith("measured"):
            return 0.0
        return max(getattr(source, field) / measured - 1.0, 0.0)

    moved = dataclasses.replace(
        profile,
        gpu=gpu.name,
        copy_bytes_per_s=gpu.hbm_bytes_per_s,
        gemm_flops_per_s=gpu.tensor_flops_per_s("bf16"),
        fit_gpu=profile.fit_gpu or profile.gpu,
        gap_bytes=gap("hbm_bytes_per_s", profile.copy_bytes_per_s),
        gap_flops=gap("bf16_flops_per_s", profile.gemm_flops_per_s),
    )
    if cross:  # no residuals measure a transfer across architectures
        note = f"no residuals measure a transfer from {source_arch} to {gpu.architecture}"
        moved = dataclasses.replace(moved, intervals=None, interval_note=note)
    kind = "transferred-cross-arch" if cross else "transferred"
    return moved, f"{kind}:{profile.profile_id}->{gpu.name}"


def nearest_profile_gpu(gpu: GpuSpec) -> str:
    """The GPU whose profile prices ``gpu`` when it has none: among the GPUs with a profile of
    its architecture (of any, when ``gpu.pricing`` is ``any-architecture``), the closest in
    datasheet copy bandwidth (ratio), ties to registry order. ``ValueError`` when none may."""
    have = profile_gpus()
    specs = {g: get_gpu(g, measured=False) for g in have}
    same = [g for g in have if specs[g].architecture == gpu.architecture]
    cands = same or (have if gpu.pricing == "any-architecture" else [])
    if not cands:
        archs = ", ".join(f"{specs[g].architecture} ({g})" for g in have) or "none"
        raise ValueError(
            f"no calibrated profile for {gpu.name} or its architecture ({gpu.architecture}); "
            f"profiles exist for {archs}: --roofline gives its datasheet roofline, "
            "--transfer-across-architectures borrows another architecture's profile"
        )
    own_bw = get_gpu(gpu.name, measured=False).hbm_bytes_per_s
    return min(cands, key=lambda g: abs(math.log(specs[g].hbm_bytes_per_s / own_bw)))


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
        # A transferred profile carries its own label (``transfer``).
        self.provenance = provenance or f"calibrated:{profile.profile_id}"
        self.outside = None  # per point, see op_time_s
        self.stood_in = None  # per point: some op priced by a stand-in class
        self.stand_ins: dict[str, str] = {}  # kernel -> the class that stood in for it

    def at(self, idx: np.ndarray) -> CalibratedPredictor:
        tp = self.tp[idx] if self.tp.ndim else self.tp
        return CalibratedPredictor(self.gpu, self.profile, self.dtype, tp, self.provenance)

    def _resolve(self, kernel: str | None) -> tuple[ClassFit | None, bool]:
        """The class for ``kernel``; a per-size class family (``rmsnorm/d4096``) falls back to
        its nearest measured size, flagged as an extrapolation; an L2-resident kernel
        (``gemm@l2``) without a resident class falls back to the cold one; a kernel of no
        measured class (nor size of its family) to its stand-in (``stand_in``), resident when
        the kernel is and the profile has it."""
        if not kernel:
            return None, False
        asked, resident = kernel, kernel.endswith(RESIDENT_SUFFIX)
        if resident:
            if kernel in self.profile.classes:
                return self.profile.classes[kernel], False
            kernel = kernel.removesuffix(RESIDENT_SUFFIX)  # not timed resident: the cold class
        if kernel in self.profile.classes:
            return self.profile.classes[kernel], False
        nearest = self._nearest_size(kernel)
        if nearest is not None:
            return self.profile.classes[nearest], True
        sub = stand_in(kernel)
        for name in (sub + RESIDENT_SUFFIX if resident and sub else None, sub):
            if name in self.profile.classes:
                self.stand_ins[asked] = name
                return self.profile.classes[name], False
        return None, False

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
        cls, nearest = self._resolve(op.kernel)
        if cls is None or op.kind == "comm":
            return super().op_time_s(op), None, None
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
        outside = (calls > 0) & (~cls.in_range(nbytes, flops, bw, peak) | nearest)
        stood_in = (calls > 0) & (op.kernel in self.stand_ins)
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
    if profile_path(gpu.name) is not None:
        return CalibratedPredictor(gpu, shipped_profile(gpu.name), dtype, tp)
    moved, label = transfer(shipped_profile(nearest_profile_gpu(gpu)), gpu)
    return CalibratedPredictor(gpu, moved, dtype, tp, label)
