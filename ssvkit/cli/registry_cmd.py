"""``ssvkit gpus`` and ``ssvkit models``: the hardware and model registries, with sources."""

from __future__ import annotations

import dataclasses
import json

from ssvkit.perfmodel.hardware import get_gpu, gpu_names
from ssvkit.perfmodel.models import get_model, model_names


def _si(v, unit: str) -> str:
    if v is None:
        return "-"
    for scale, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= scale:
            return f"{v / scale:.4g} {p}{unit}"
    return f"{v:.4g} {unit}"


class Gpus:
    """ssvkit gpus --sources                # every number with its source
    ssvkit gpus --json"""

    HELP = "list the GPU registry (datasheet ceilings, measured overlays, sources)"

    @staticmethod
    def add_arguments(p) -> None:
        p.add_argument("--json", action="store_true", help="print JSON")
        p.add_argument("--sources", action="store_true", help="print each number's source")
        p.add_argument("--datasheet", action="store_true", help="ignore measured overlays")

    @staticmethod
    def run(args) -> int:
        specs = [get_gpu(n, measured=not args.datasheet) for n in gpu_names()]
        if args.json:
            print(json.dumps([dataclasses.asdict(s) for s in specs], indent=2))
            return 0
        print(
            f"{'gpu':10s} {'arch':9s} {'HBM':>11s} {'bf16':>12s} {'fp8':>12s} {'SMs':>4s} "
            f"{'L2':>8s} {'link/dir':>10s} {'memory':>8s}  provenance"
        )
        for s in specs:
            l2 = f"{s.l2_bytes / 2**20:.0f} MiB" if s.l2_bytes else "-"
            print(
                f"{s.name:10s} {s.architecture:9s} {_si(s.hbm_bytes_per_s, 'B/s'):>11s} "
                f"{_si(s.bf16_flops_per_s, 'FLOP/s'):>12s} "
                f"{_si(s.fp8_flops_per_s, 'FLOP/s'):>12s} {s.num_sms:>4d} {l2:>8s} "
                f"{_si(s.link_bytes_per_s, 'B/s'):>10s} {s.memory_bytes / 1e9:>5.0f} GB  "
                f"{s.provenance}"
            )
            if args.sources:
                for k, v in s.sources.items():
                    print(f"    {k}: {v}")
        return 0


class Models:
    """ssvkit models
    ssvkit models --model path/to/config.json --json"""

    HELP = "list the model registry (geometry read from the shipped config.json files)"

    @staticmethod
    def add_arguments(p) -> None:
        p.add_argument("--json", action="store_true", help="print JSON")
        p.add_argument("--model", help="show one model (registry name or config.json path)")

    @staticmethod
    def run(args) -> int:
        specs = [get_model(args.model)] if args.model else [get_model(n) for n in model_names()]
        if args.json:
            out = []
            for s in specs:
                d = dataclasses.asdict(s)
                d.pop("moe_layers")
                d["num_moe_layers"] = s.num_moe_layers
                d["num_params"] = s.num_params()
                d["num_active_params"] = s.num_active_params()
                d["kv_bytes_per_token_per_layer"] = s.kv_bytes_per_token()
                out.append(d)
            print(json.dumps(out, indent=2))
            return 0
        print(
            f"{'model':15s} {'family':12s} {'L':>3s} {'d':>5s} {'H/Hkv':>7s} {'d_h':>4s} "
            f"{'d_f':>6s} {'experts':>9s} {'params':>8s} {'active':>7s} {'KV/token':>9s}"
        )
        for s in specs:
            experts = f"{s.experts_per_token}/{s.num_experts}" if s.is_moe else "-"
            kv = s.kv_bytes_per_token() * s.num_layers
            print(
                f"{s.name:15s} {s.family:12s} {s.num_layers:>3d} {s.hidden_size:>5d} "
                f"{s.num_q_heads:>3d}/{s.num_kv_heads:<3d} {s.head_dim:>4d} "
                f"{s.intermediate_size:>6d} {experts:>9s} {s.num_params() / 1e9:>7.2f}B "
                f"{s.num_active_params() / 1e9:>6.2f}B {kv / 1024:>6.0f} KiB"
            )
        return 0
