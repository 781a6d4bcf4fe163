"""GPU registry: datasheet ceilings with a source for every number, and a measured overlay.

Every throughput is stored in SI units (bytes/s, FLOP/s). Datasheet tensor rates are the
*dense* figures (NVIDIA quotes 2:4-sparse rates first; those are halved here and the source
says so). A ``measured`` overlay from ``calibration/profiles/<gpu>/ceilings.json`` replaces the
datasheet ceilings when present; the figures computed from it are then labelled with the
overlay's provenance instead of ``datasheet``. Each GPU names its architecture: a GPU without a
fitted profile is priced with a profile of its architecture (``perfmodel.profiles``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path

GB = 1e9
TB = 1e12
MIB = 1024**2
KIB = 1024

_NV_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023), SXM5 column"
_NV_H100_PCIE = "NVIDIA H100 Tensor Core GPU datasheet (2023), PCIe column"
_NV_HOPPER_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022)"
_NV_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column"
_NV_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021), 80GB SXM column"
_NV_AMPERE_WP = "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020)"
_NV_HGX_B200 = "NVIDIA HGX B200 specifications (nvidia.com/hgx, 2024), per GPU of 8"
_NV_DGX_B200 = "NVIDIA DGX B200 datasheet (2024), per GPU of 8"
_AMD_MI300X = "AMD Instinct MI300X accelerator data sheet (2023)"
_AMD_CDNA3_WP = "AMD CDNA 3 architecture whitepaper (2023)"
_HALF_SPARSE = " (2:4-sparse figure halved to the dense rate)"
_LAUNCH = (
    "assumption, not a datasheet figure: a few microseconds per CUDA kernel launch (NVIDIA "
    "Technical Blog, 'Getting Started with CUDA Graphs', 2019); calibrated profiles replace it"
)


# How a GpuSpec's ops are priced (``perfmodel.calibrated.make_predictor``).
PRICINGS = ("profile", "any-architecture", "roofline")
# GpuSpec fields that are labels, not figures: no positivity check, no source.
LABEL_FIELDS = ("name", "description", "architecture", "sources", "provenance", "pricing")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator's ceilings. Rates are dense; link bandwidths are per direction."""

    name: str = field(metadata={"help": "registry key, e.g. h100-sxm"})
    description: str = field(metadata={"help": "marketing name of the part"})
    architecture: str = field(metadata={"help": "architecture family, e.g. hopper, ampere"})
    hbm_bytes_per_s: float = field(metadata={"help": "peak device-memory bandwidth"})
    bf16_flops_per_s: float = field(metadata={"help": "dense bf16 tensor-core rate"})
    fp16_flops_per_s: float = field(metadata={"help": "dense fp16 tensor-core rate"})
    fp8_flops_per_s: float | None = field(metadata={"help": "dense fp8 rate; None if absent"})
    fp32_flops_per_s: float = field(metadata={"help": "non-tensor fp32 rate (elementwise ops)"})
    num_sms: int = field(metadata={"help": "streaming multiprocessors (AMD: compute units)"})
    smem_per_sm_bytes: int = field(metadata={"help": "shared memory (AMD: LDS) per SM"})
    smem_per_block_bytes: int = field(metadata={"help": "largest opt-in shared memory per block"})
    l2_bytes: int | None = field(metadata={"help": "last-level on-chip cache; None if unpublished"})
    link_bytes_per_s: float = field(metadata={"help": "GPU-GPU link bandwidth per direction"})
    pcie_bytes_per_s: float = field(metadata={"help": "host link bandwidth per direction"})
    memory_bytes: float = field(metadata={"help": "device memory capacity"})
    launch_overhead_s: float = field(metadata={"help": "fixed cost per kernel launch"})
    sources: dict[str, str] = field(metadata={"help": "field name -> where the number comes from"})
    provenance: str = field(default="datasheet", metadata={"help": "datasheet or calibrated:<id>"})
    pricing: str = field(
        default="profile",
        metadata={
            "help": "how predictors price ops on it: profile (its own or one of its "
            "architecture), any-architecture (also a profile of another architecture), roofline"
        },
    )

    def __post_init__(self) -> None:
        if self.pricing not in PRICINGS:
            raise ValueError(
                f"GpuSpec.pricing must be one of {', '.join(PRICINGS)}, got {self.pricing!r}"
            )
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in LABEL_FIELDS or v is None:
                continue
            if not v > 0:
                raise ValueError(f"GpuSpec.{f.name} must be > 0, got {v!r}")
        missing = [
            f.name
            for f in dataclasses.fields(self)
            if f.name not in LABEL_FIELDS and f.name not in self.sources
        ]
        if missing:
            raise ValueError(f"GpuSpec {self.name}: no source for {', '.join(missing)}")

    def tensor_flops_per_s(self, dtype: str) -> float:
        """Dense tensor-core rate for ``dtype`` in {bf16, fp16, fp8}."""
        rate = {
            "bf16": self.bf16_flops_per_s,
            "fp16": self.fp16_flops_per_s,
            "fp8": self.fp8_flops_per_s,
        }.get(dtype)
        if rate is None:
            raise ValueError(f"dtype {dtype!r} has no tensor rate on {self.name}")
        return rate

    def with_measured(self, overlay: dict) -> GpuSpec:
        """Copy with measured ceilings replacing datasheet ones.

        ``overlay`` is the parsed ``ceilings.json`` of a calibration profile: ``{"profile_id":
        ..., "device_name": ..., "ceilings": {field: value, ...}}``.
        """
        ceilings = overlay.get("ceilings", {})
        known = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(ceilings) - known)
        if bad:
            raise ValueError(f"measured overlay names unknown GpuSpec fields: {', '.join(bad)}")
        pid = overlay.get("profile_id")
        if not pid:
            raise ValueError("measured overlay has no profile_id")
        sources = dict(self.sources)
        for k in ceilings:
            sources[k] = f"measured, calibration profile {pid}"
        return dataclasses.replace(
            self, **ceilings, sources=sources, provenance=f"calibrated:{pid}"
        )


def _spec(
    name: str, description: str, architecture: str, values: dict[str, tuple[float | None, str]]
) -> GpuSpec:
    return GpuSpec(
        name=name,
        description=description,
        architecture=architecture,
        sources={k: src for k, (_, src) in values.items()},
        **{k: v for k, (v, _) in values.items()},
    )


_REGISTRY: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        _spec(
            "h100-sxm",
            "NVIDIA H100 80GB HBM3 (SXM5)",
            "hopper",
            {
                "hbm_bytes_per_s": (3.35 * TB, _NV_H100),
                "bf16_flops_per_s": (989.4e12, _NV_H100 + _HALF_SPARSE),
                "fp16_flops_per_s": (989.4e12, _NV_H100 + _HALF_SPARSE),
                "fp8_flops_per_s": (1978.9e12, _NV_H100 + _HALF_SPARSE),
                "fp32_flops_per_s": (67e12, _NV_H100),
                "num_sms": (132, _NV_HOPPER_WP + ", H100 SXM5 configuration"),
                "smem_per_sm_bytes": (228 * KIB, _NV_HOPPER_WP),
                "smem_per_block_bytes": (227 * KIB, "CUDA C++ Programming Guide, CC 9.0 table"),
                "l2_bytes": (50 * MIB, _NV_HOPPER_WP + ", H100 SXM5 configuration"),
                "link_bytes_per_s": (450 * GB, _NV_H100 + ": NVLink 900 GB/s total, halved"),
                "pcie_bytes_per_s": (64 * GB, _NV_H100 + ": PCIe Gen5 128 GB/s total, halved"),
                "memory_bytes": (80 * GB, _NV_H100),
                "launch_overhead_s": (4e-6, _LAUNCH),
            },
        ),
        _spec(
            "h100-pcie",
            "NVIDIA H100 80GB PCIe",
            "hopper",
            {
                "hbm_bytes_per_s": (2.0 * TB, _NV_H100_PCIE),
                "bf16_flops_per_s": (756.5e12, _NV_H100_PCIE + _HALF_SPARSE),
                "fp16_flops_per_s": (756.5e12, _NV_H100_PCIE + _HALF_SPARSE),
                "fp8_flops_per_s": (1513e12, _NV_H100_PCIE + _HALF_SPARSE),
                "fp32_flops_per_s": (51e12, _NV_H100_PCIE),
                "num_sms": (114, _NV_HOPPER_WP + ", H100 PCIe configuration"),
                "smem_per_sm_bytes": (228 * KIB, _NV_HOPPER_WP),
                "smem_per_block_bytes": (227 * KIB, "CUDA C++ Programming Guide, CC 9.0 table"),
                "l2_bytes": (50 * MIB, _NV_HOPPER_WP),
                "link_bytes_per_s": (300 * GB, _NV_H100_PCIE + ": NVLink bridge 600 GB/s, halved"),
                "pcie_bytes_per_s": (64 * GB, _NV_H100_PCIE + ": PCIe Gen5 128 GB/s, halved"),
                "memory_bytes": (80 * GB, _NV_H100_PCIE),
                "launch_overhead_s": (4e-6, _LAUNCH),
            },
        ),
        _spec(
            "h200",
            "NVIDIA H200 141GB HBM3e (SXM)",
            "hopper",
            {
                "hbm_bytes_per_s": (4.8 * TB, _NV_H200),
                "bf16_flops_per_s": (989.4e12, _NV_H200 + _HALF_SPARSE),
                "fp16_flops_per_s": (989.4e12, _NV_H200 + _HALF_SPARSE),
                "fp8_flops_per_s": (1978.9e12, _NV_H200 + _HALF_SPARSE),
                "fp32_flops_per_s": (67e12, _NV_H200),
                "num_sms": (132, "cudaDeviceProp.multiProcessorCount read on an H200"),
                "smem_per_sm_bytes": (228 * KIB, _NV_HOPPER_WP),
                "smem_per_block_bytes": (227 * KIB, "CUDA C++ Programming Guide, CC 9.0 table"),
                "l2_bytes": (60 * MIB, "cudaDeviceProp.l2CacheSize read on an H200 (60 MB)"),
                "link_bytes_per_s": (450 * GB, _NV_H200 + ": NVLink 900 GB/s total, halved"),
                "pcie_bytes_per_s": (64 * GB, _NV_H200 + ": PCIe Gen5 128 GB/s total, halved"),
                "memory_bytes": (141 * GB, _NV_H200),
                "launch_overhead_s": (4e-6, _LAUNCH),
            },
        ),
        _spec(
            "a100-80g",
            "NVIDIA A100 80GB (SXM4)",
            "ampere",
            {
                "hbm_bytes_per_s": (2.039 * TB, _NV_A100),
                "bf16_flops_per_s": (312e12, _NV_A100),
                "fp16_flops_per_s": (312e12, _NV_A100),
                "fp8_flops_per_s": (None, _NV_A100 + ": no fp8 tensor cores"),
                "fp32_flops_per_s": (19.5e12, _NV_A100),
                "num_sms": (108, _NV_AMPERE_WP),
                "smem_per_sm_bytes": (164 * KIB, _NV_AMPERE_WP),
                "smem_per_block_bytes": (163 * KIB, "CUDA C++ Programming Guide, CC 8.0 table"),
                "l2_bytes": (40 * MIB, _NV_AMPERE_WP),
                "link_bytes_per_s": (300 * GB, _NV_A100 + ": NVLink 600 GB/s total, halved"),
                "pcie_bytes_per_s": (32 * GB, _NV_A100 + ": PCIe Gen4 64 GB/s total, halved"),
                "memory_bytes": (80 * GB, _NV_A100),
                "launch_overhead_s": (4e-6, _LAUNCH),
            },
        ),
        _spec(
            "b200",
            "NVIDIA B200 (HGX B200, 1000 W)",
            "blackwell",
            {
                "hbm_bytes_per_s": (8.0 * TB, _NV_DGX_B200 + ": 64 TB/s aggregate / 8"),
                "bf16_flops_per_s": (2.25e15, _NV_HGX_B200 + _HALF_SPARSE),
                "fp16_flops_per_s": (2.25e15, _NV_HGX_B200 + _HALF_SPARSE),
                "fp8_flops_per_s": (4.5e15, _NV_HGX_B200 + _HALF_SPARSE),
                "fp32_flops_per_s": (80e12, _NV_HGX_B200),
                "num_sms": (148, "cudaDeviceProp.multiProcessorCount as reported for B200"),
                "smem_per_sm_bytes": (228 * KIB, "NVIDIA Blackwell Tuning Guide, CC 10.0"),
                "smem_per_block_bytes": (227 * KIB, "NVIDIA Blackwell Tuning Guide, CC 10.0"),
                "l2_bytes": (None, "not published by NVIDIA"),
                "link_bytes_per_s": (900 * GB, _NV_HGX_B200 + ": NVLink 5 1.8 TB/s, halved"),
                "pcie_bytes_per_s": (64 * GB, _NV_HGX_B200 + ": PCIe Gen5 x16, per direction"),
                "memory_bytes": (180 * GB, _NV_DGX_B200 + ": 1,440 GB / 8"),
                "launch_overhead_s": (4e-6, _LAUNCH),
            },
        ),
        _spec(
            "mi300x",
            "AMD Instinct MI300X",
            "cdna3",
            {
                "hbm_bytes_per_s": (5.3 * TB, _AMD_MI300X),
                "bf16_flops_per_s": (1307.4e12, _AMD_MI300X + ", dense"),
                "fp16_flops_per_s": (1307.4e12, _AMD_MI300X + ", dense"),
                "fp8_flops_per_s": (2614.9e12, _AMD_MI300X + ", dense"),
                "fp32_flops_per_s": (163.4e12, _AMD_MI300X + ", vector"),
                "num_sms": (304, _AMD_MI300X + ": compute units"),
                "smem_per_sm_bytes": (64 * KIB, _AMD_CDNA3_WP + ": LDS per CU"),
                "smem_per_block_bytes": (64 * KIB, _AMD_CDNA3_WP + ": LDS per workgroup"),
                "l2_bytes": (32 * MIB, _AMD_CDNA3_WP + ": 4 MB L2 per XCD x 8 (plus 256 MB IC)"),
                "link_bytes_per_s": (448 * GB, _AMD_MI300X + ": 896 GB/s Infinity Fabric, halved"),
                "pcie_bytes_per_s": (64 * GB, _AMD_MI300X + ": PCIe Gen5 x16 128 GB/s, halved"),
                "memory_bytes": (192 * GB, _AMD_MI300X),
                "launch_overhead_s": (4e-6, _LAUNCH),
            },
        ),
    )
}


def gpu_names() -> list[str]:
    """Registry keys, in table order."""
    return list(_REGISTRY)


def suggest(name: str, choices: list[str]) -> str:
    """`` (did you mean: a, b?)`` for close names, else an empty string."""
    close = difflib.get_close_matches(name.lower(), choices, n=3, cutoff=0.4)
    return f" (did you mean: {', '.join(close)}?)" if close else f" (known: {', '.join(choices)})"


def profiles_dir() -> Path | None:
    """``calibration/profiles``, the folder of the measured ceilings and fitted profiles the
    calibration data ships (one folder per GPU), or None without that package."""
    try:
        from importlib.resources import files

        return Path(str(files("ssvkit.calibration"))) / "profiles"
    except ModuleNotFoundError:
        return None


def measured_overlay_path(name: str) -> Path | None:
    """``calibration/profiles/<name>/ceilings.json`` if the calibration data ships it."""
    root = profiles_dir()
    p = None if root is None else root / name / "ceilings.json"
    return p if p is not None and p.is_file() else None


def get_gpu(name: str, *, measured: bool = True, any_architecture: bool = False) -> GpuSpec:
    """Look up a GPU by registry key; overlay measured ceilings when they exist and
    ``measured`` is true. ``measured=False`` gives the datasheet spec priced by the bare
    roofline; ``any_architecture`` lets a GPU without a profile of its architecture borrow one
    of another. Raises ``ValueError`` naming the bad key and close matches."""
    key = name.lower()
    if key not in _REGISTRY:
        raise ValueError(f"unknown GPU {name!r}{suggest(name, gpu_names())}")
    spec = _REGISTRY[key]
    path = measured_overlay_path(key) if measured else None
    if path is not None:
        overlay = json.loads(path.read_text())
        if overlay.get("gpu") != key:
            raise ValueError(
                f"measured overlay {path} is for GPU {overlay.get('gpu')!r}, not {key!r}"
            )
        spec = spec.with_measured(overlay)
    if not measured:
        return dataclasses.replace(spec, pricing="roofline")
    return dataclasses.replace(spec, pricing="any-architecture") if any_architecture else spec
