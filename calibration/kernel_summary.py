"""The kernel sweep's summary (:mod:`calibration.kernel_sweep`): headline figures per op from the
rows of ``kernel_bench.jsonl``, and per sparse-path op and batch the rows within the floor target.
"""

from __future__ import annotations

import json

import numpy as np
from ssvkit.perfmodel.rows import DERIVED


def _dense_target(p: dict, r: dict, floor: float) -> bool | None:
    """The dense kernel's targets (T >= 32K): >= 80% of copy bandwidth for t <= 16, else
    <= 1.3 x the byte/FLOP floor; None where no target applies."""
    if p["context_len"] < 32 * 1024:
        return None
    if p["num_query_tokens"] <= 16:
        return r["achieved_bytes_per_s"] >= 0.8 * r["copy_bytes_per_s"]
    return r["median_s"] <= 1.3 * floor


SPARSE_PATH_OPS = ("sparse_verify", "select_blocks", "repair", "nsa_verify")


def floor_target_met(median_s: float, floor_s: float) -> bool:
    """The sparse path's kernel target: <= 1.5 x the floor where the floor is >= 20 us, else
    <= the floor + 8 us."""
    return median_s <= (1.5 * floor_s if floor_s >= 20e-6 else floor_s + 8e-6)


def _floor_targets(g: list[dict]) -> list[dict]:
    """Per sparse-path op and batch: rows meeting ``floor_target_met``, the median and worst
    time / floor. Selection rows timed in one launch (``impl``, the alternative ``_select``
    compares) are left out: the two launches are the selection's default path."""
    g = [r for r in g if r["params"].get("impl") != "one_launch"]
    out = []
    for op in SPARSE_PATH_OPS:
        for bsz in sorted({r["params"]["batch"] for r in g if r["op"] == op}):
            sel = [r for r in g if r["op"] == op and r["params"]["batch"] == bsz]
            floors = [_floor(r) for r in sel]
            ratios = [r["median_s"] / f for r, f in zip(sel, floors, strict=True)]
            met = sum(floor_target_met(r["median_s"], f) for r, f in zip(sel, floors, strict=True))
            out.append(
                {
                    "op": op,
                    "B": bsz,
                    "rows": len(sel),
                    "met": met,
                    "median_x": float(np.median(ratios)),
                    "worst_x": max(ratios),
                }
            )
    return out


def _floor(r: dict) -> float:
    """The row's floor: max(bytes / copy bandwidth, FLOPs / GEMM rate)."""
    return max(r["unique_bytes"] / r["copy_bytes_per_s"], r["flops"] / r["gemm_flops_per_s"])


def _heads(p: dict) -> str:
    """The row's head geometry, ``Hq/Hkv/D``: rows of several geometries share one file."""
    return "/".join(str(p.get(k)) for k in ("num_q_heads", "num_kv_heads", "head_dim"))


def _defining(p: dict) -> str:
    return json.dumps({k: v for k, v in p.items() if k not in DERIVED}, sort_keys=True)


def _dense(g: list[dict]) -> list[dict]:
    """dense_verify rows: bandwidth, time / floor, speedup over torch SDPA, target met."""
    sdpa = {_defining(r["params"]): r for r in g if r["op"] == "torch_sdpa"}
    out = []
    for r in g:
        if r["op"] != "dense_verify":
            continue
        p, floor = r["params"], _floor(r)
        base = sdpa.get(_defining(p))
        out.append(
            {
                "heads": _heads(p),
                "T": p["context_len"],
                "t": p["num_query_tokens"],
                "B": p["batch"],
                "us": r["median_s"] * 1e6,
                "TB/s": r["achieved_bytes_per_s"] / 1e12,
                "copy%": 100 * r["achieved_bytes_per_s"] / r["copy_bytes_per_s"],
                "x_floor": r["median_s"] / floor,
                "vs_sdpa": base["median_s"] / r["median_s"] if base else None,
                "target_met": _dense_target(p, r, floor),
            }
        )
    return out


def _sparse(g: list[dict]) -> list[dict]:
    """sparse_verify union rows: speedup over per_query at the same selection, its target."""

    def selection(p: dict) -> tuple:
        return (_heads(p), p["num_query_tokens"], p["context_len"], p["top_n"], p["overlap"])

    pq = {}
    for r in g:
        p = r["params"]
        if r["op"] == "sparse_verify" and p["mode"] == "per_query":
            pq[(*selection(p), p["batch"])] = r["median_s"]
    out = []
    for r in g:
        p = r["params"]
        if r["op"] != "sparse_verify" or p["mode"] != "union":
            continue
        base = pq.get((*selection(p), p["batch"]))
        out.append(
            {
                "heads": _heads(p),
                "t": p["num_query_tokens"],
                "T": p["context_len"],
                "n": p["top_n"],
                "gamma": p["overlap"],
                "B": p["batch"],
                "C": p["group_size"],
                "us": r["median_s"] * 1e6,
                "copy%": 100 * r["achieved_bytes_per_s"] / r["copy_bytes_per_s"],
                "speedup": base / r["median_s"] if base else None,
                "target": 0.85 / p["f_load"],
                "time/floor": r["median_s"] / (_floor(r) + r["launch_s"]),
            }
        )
    return out


def _repair(g: list[dict]) -> list[dict]:
    """Per head geometry, draft rows, top_n, context and batch: a line fitted to repair time over
    missed blocks, and recompute."""

    def group(p: dict) -> tuple:
        return (_heads(p), p["num_query_tokens"], p["top_n"], p["context_len"], p["batch"])

    out = []
    keys = {group(r["params"]) for r in g if r["op"] == "repair"}
    for key in sorted(keys):
        heads, t, _, ctx, bsz = key
        rep = [r for r in g if r["op"] == "repair" and group(r["params"]) == key]
        pts = [
            (r["params"]["missed_blocks"], r["median_s"])
            for r in rep
            if r["params"]["mode"] == "repair"
        ]
        rec = [r["median_s"] for r in rep if r["params"]["mode"] == "recompute"]
        if len(pts) < 3:
            continue
        x, y = np.array(sorted(pts), dtype=float).T
        slope, icept = np.polyfit(x, y, 1)
        resid = y - (slope * x + icept)
        r2 = 1 - float(resid @ resid) / float(((y - y.mean()) ** 2).sum() or 1.0)
        out.append(
            {
                "heads": heads,
                "t": t,
                "T": ctx,
                "B": bsz,
                "r2": r2,
                "us_per_block": slope * 1e6,
                "us_at_max": y[-1] * 1e6,
                "max_missed": int(x[-1]),
                "recompute_us": rec[0] * 1e6 if rec else None,
            }
        )
    return out


def _nsa(g: list[dict]) -> list[dict]:
    """nsa_verify: the fused kernel's time and its speedup over the unfused calls, those with
    their branches side by side (``params.branch_streams``, the kernels' default; ``speedup``)
    and on one stream (``speedup_one_stream``) where the rows hold them."""
    nsa = {}
    for r in g:
        if r["op"] == "nsa_verify" and not r["params"].get("rows_per_tile"):
            p = r["params"]
            gamma = p.get("overlap") or -1.0  # -1: the refresh path's own indices
            at = (_heads(p), p.get("num_query_tokens"), p["context_len"], p["batch"])
            streams = bool(p.get("branch_streams"))
            nsa[(*at, p["mode"], gamma, p["impl"], streams)] = r["median_s"]
    out = []
    for (heads, t, ctx, bsz, mode, gamma, impl, _), s in sorted(nsa.items()):
        side, one = (
            nsa.get((heads, t, ctx, bsz, mode, gamma, "unfused", x)) for x in (True, False)
        )
        if impl == "fused" and (side is not None or one is not None):
            out.append(
                {
                    "heads": heads,
                    "t": t,
                    "T": ctx,
                    "B": bsz,
                    "mode": mode,
                    "gamma": gamma if gamma >= 0 else None,
                    "fused_us": s * 1e6,
                    "speedup": None if side is None else side / s,
                    "speedup_one_stream": None if one is None else one / s,
                }
            )
    return out


def _nsa_tiles(g: list[dict]) -> list[dict]:
    """nsa_verify with a row schedule (``calibration.kernel_nsa_tiles``): its time and how much
    faster the packed schedule runs the same call. A row schedule's row keys the compressed
    branch's tiles (``context_tiles``; none: "per_tile"), a packed row does not: the two are
    the same call but for the schedule."""
    packed, out = {}, []
    schedule = ("rows_per_tile", "rotations", "context_tiles")

    def key(p):
        return tuple((k, v) for k, v in sorted(p.items()) if k not in schedule)

    nsa = [r for r in g if r["op"] == "nsa_verify"]
    for r in nsa:
        if not r["params"].get("rows_per_tile"):
            packed[key(r["params"])] = r["median_s"]
    for r in nsa:
        p = r["params"]
        if p.get("rows_per_tile") and key(p) in packed:
            out.append(
                {
                    "T": p["context_len"],
                    "B": p["batch"],
                    "t": p["num_query_tokens"],
                    "mode": p["mode"],
                    "impl": p["impl"],
                    "gamma": p.get("overlap"),
                    "rows": p["rows_per_tile"],
                    "tiles": p.get("context_tiles", "per_tile"),
                    "us": r["median_s"] * 1e6,
                    "packed_speedup": r["median_s"] / packed[key(p)],
                }
            )
    return sorted(out, key=lambda x: tuple(str(v) for v in x.values()))


def _select(g: list[dict]) -> list[dict]:
    """select_blocks rows timed in one launch and in two on the same config (head geometry
    and draft rows included): both times, the floor, the one-launch time / floor and its floor
    target."""
    by_impl = {}
    for r in g:
        if r["op"] == "select_blocks" and r["params"].get("impl"):
            p = r["params"]
            key = (_heads(p), p["context_len"], p["num_query_tokens"], p["batch"], p["top_n"])
            by_impl[(*key, p["method"], p["impl"])] = r
    out = []
    for key in sorted({k[:6] for k in by_impl}):
        one, two = by_impl.get((*key, "one_launch")), by_impl.get((*key, "two_launch"))
        if one is None or two is None:
            continue
        floor = _floor(one)
        out.append(
            {
                "heads": key[0],
                "T": key[1],
                "t": key[2],
                "B": key[3],
                "top_n": key[4],
                "method": key[5],
                "one_us": one["median_s"] * 1e6,
                "two_us": two["median_s"] * 1e6,
                "floor_us": floor * 1e6,
                "x_floor": one["median_s"] / floor,
                "target_met": floor_target_met(one["median_s"], floor),
            }
        )
    return out


def summarise(rows: list[dict]) -> dict[str, list[dict]]:
    """Graph-replay headline figures per op, from every row in the file."""
    g = [r for r in rows if r["timing"] == "graph"]
    return {
        "dense": _dense(g),
        "sparse": _sparse(g),
        "repair": _repair(g),
        "nsa": _nsa(g),
        "nsa row schedules": _nsa_tiles(g),
        "select": _select(g),
        "floor targets": _floor_targets(g),
    }


def print_summary(summary: dict[str, list[dict]]) -> None:
    """The summary as one aligned table per section (empty sections left out)."""

    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v)

    for name, items in summary.items():
        if not items:
            continue
        print(f"\n{name} (graph replay)")
        cols = list(items[0])
        print("  " + " ".join(f"{c:>9}" for c in cols))
        for it in items:
            print("  " + " ".join(f"{fmt(it[c]):>9}" for c in cols))
