"""Fitted profiles (``Profile``): one GPU's measured ceilings and its op classes' fits
(``perfmodel.class_fit``), read from the calibration data (``calibration/profiles/<gpu>/``,
written by ``calibration.fit``) and checked against the GPU asked for; the profile that prices
a GPU without one of its own (``nearest_profile_gpu``, ``transfer``).

A GPU without a fitted profile is priced by a transferred one: the source profile's fitted
parameters evaluated with the target's ceilings (``transfer``: what transfers and what is
assumed to carry over). The source is the profile of its architecture whose GPU is closest in
datasheet copy bandwidth; another architecture's only when the spec asks for it
(``GpuSpec.pricing``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ssvkit.perfmodel import hardware
from ssvkit.perfmodel.class_fit import ClassFit
from ssvkit.perfmodel.hardware import GpuSpec, get_gpu, gpu_names
from ssvkit.perfmodel.intervals import IntervalSource, IntervalTable

PROFILE_VERSION = 1


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
        bw = float(d["ceilings"]["copy_bytes_per_s"])
        peak = float(d["ceilings"]["gemm_flops_per_s"])
        return cls(
            profile_id=d["profile_id"],
            gpu=d["gpu"],
            device_name=d["device_name"],
            copy_bytes_per_s=bw,
            gemm_flops_per_s=peak,
            classes={
                k: ClassFit.from_json(
                    k, v["fit"], (bw, peak), v.get("head_dims", ()), v.get("steps_max")
                )
                for k, v in d["classes"].items()
            },
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
    """``profile`` evaluated with ``gpu``'s ceilings, and the provenance of the figures priced
    with it: ``transferred:<profile id>-><gpu>``, or ``transferred-cross-arch:...`` when the
    architectures differ, which ``gpu.pricing`` must allow (``any-architecture``); else
    ``ValueError`` naming both GPUs and architectures.

    What transfers: ``BW`` and ``PEAK`` become the target's copy bandwidth and bf16 tensor rate
    (its measured ``ceilings.json`` when committed, else its datasheet figures), and the op
    counts come from the target's spec (SM count for the NSA and repair launch plans, L2 size
    for L2-resident classes), so a call's roofline terms scale with the target. What is
    assumed to carry over unchanged: the efficiency ``e_c`` at a given call size (same tensor
    cores, so the same fraction of the GEMM rate), the memory term's split at ``e_b``: its
    bytes at the source's copy rate follow the copy rate, the rest of its time (a call under
    the copy rate waits on the SMs' side) follows the GEMM rate (``ClassFit._memory_s``), the
    fixed and
    per-unit latencies ``t0``, ``t_k``, ``t_s``, ``t_r``, ``t_x`` (launch, synchronisation and
    SM clock costs), and the L2 terms ``h`` and ``r``. Datasheet ceilings are peaks that copies
    and GEMMs do not reach, so a transfer onto them is optimistic by the source GPU's gap
    between measured and datasheet ceilings (the profile's ``gap_bytes``, ``gap_flops``); a
    transfer across architectures carries no residuals."""
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
