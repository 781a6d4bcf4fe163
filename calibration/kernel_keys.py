"""The Triton specialisations a kernel sweep's row asks for (``compile_keys``), from the launch
plans its kernels' wrappers make: what ``calibration.kernel_plan`` counts as compilations.

Triton compiles a kernel again for every new tuple of its constexprs and of its integer
arguments' classes (equal to 1, divisible by 16, other: ``_cls``).
"""

from __future__ import annotations

from ssvkit.calibration import kernel_inputs as ki
from ssvkit.calibration.kernel_grid import KernelConfig, Variant
from ssvkit.perfmodel.attention_plan import dense_verify_plan, next_pow2
from ssvkit.perfmodel.nsa_plan import tile_packing
from ssvkit.perfmodel.pick_work import row_layout, threshold_warps
from ssvkit.perfmodel.select_work import score_tile, score_tiles
from ssvkit.perfmodel.sparse_plan import (
    DEFAULT_SPARSE_CONFIG,
    choose_sparse_splits,
    list_entries,
    sparse_tile_shape,
)

# Kernels an NSA call launches per path and implementation (compressed pass, scoring, top-n
# pick, selected + window pass, merges; the unfused path launches each branch apart).
NSA_KERNELS = {("refresh", "fused"): 5, ("reuse", "fused"): 2}
NSA_KERNELS |= {("refresh", "unfused"): 7, ("reuse", "unfused"): 4}
# Short kernels (the merge, the union plan, the selection's metadata build and top-n pick):
# ``small_compile_s`` each. The selection's score launch and its one launch (scores and pick)
# unroll three bf16 MMAs a product in a pipelined loop: ``select_compile_s`` each.
SMALL_KERNELS = ("merge", "union_plan", "select_meta", "select_pick")
SELECT_MMA_KERNELS = ("select_scores", "select_fused")


def _cls(x: int) -> str:
    """Triton's class of an integer argument: ``1``, divisible by 16 (``D``) or other."""
    return "1" if x == 1 else "D" if x % 16 == 0 else "N"


def _heads(geometry: str) -> tuple[int, int, int]:
    return ki.GEOMETRIES[geometry]


def compile_keys(cfg: KernelConfig, v: Variant, num_sms: int) -> set[tuple]:
    """The specialisations (kernel name first) the launch of variant ``v`` asks for.

    Triton compiles a kernel again for every new tuple of its constexprs and of its integer
    arguments' classes (equal to 1, divisible by 16, other: ``_cls``); the keys follow from the
    launch plans the wrappers use (``perfmodel.attention_plan``). That naming is close for the
    dense, sparse and repair kernels, whose constexprs follow from the plan; the NSA and
    selection calls launch several kernels: NSA's are counted per (geometry, row tile, path)
    with a kernel count (``NSA_KERNELS``), the selection's follow its launch plan
    (``select_keys``)."""
    hq, hkv, d = _heads(cfg.geometry)
    p = v.params
    t, bsz, ctx = p["num_query_tokens"], p["batch"], p["context_len"]
    if v.op == "dense_verify":
        plan = dense_verify_plan(bsz, t, hq, hkv, d, ctx + t, num_sms)
        s = plan.num_splits
        keys = {("dense_verify", d, plan.block_m, plan.num_warps, hq // hkv, _cls(t), _cls(s))}
        return keys | ({("merge", d, max(16, next_pow2(s)), _cls(s), _cls(t))} if s > 1 else set())
    if v.op == "sparse_verify":
        mode, group = v.knob
        top_n, bs = p["top_n"], p["block_size"]
        c = 1 if mode == "per_query" else min(group, t)
        groups = -(-t // c)
        m_pad, warps, stages = sparse_tile_shape(DEFAULT_SPARSE_CONFIG, c, hq, hkv, bs, d)
        lists = mode == "union" and c > 1
        width = list_entries(mode, c, top_n)
        s = choose_sparse_splits(DEFAULT_SPARSE_CONFIG, bsz * hkv * groups, width, warps, num_sms)
        keys = {
            (
                "sparse_verify",
                *(hq // hkv, c, m_pad, d, bs, max(16, next_pow2(t)), lists, warps, stages),
                *(_cls(t), _cls(width), _cls(groups), _cls(s)),
            )
        }
        if lists:
            keys.add(("union_plan", c, max(16, next_pow2(top_n)), _cls(t), _cls(top_n)))
        return keys | ({("merge", d, max(16, next_pow2(s)), _cls(s), _cls(t))} if s > 1 else set())
    if v.op == "repair":
        width = p["top_n"] if v.knob[0] == "recompute" else round(v.knob[1] * p["top_n"])
        slots = max(16, next_pow2(width))
        return {("repair", d, max(16, next_pow2(hq // hkv)), slots, _cls(t), _cls(width))}
    if v.op == "nsa_verify":
        tile = tile_packing(t, hq // hkv, p.get("rows_per_tile") or 0, head_dim=d)[0]
        mode, impl = v.knob
        return {("nsa", cfg.geometry, tile, mode, impl, i) for i in range(NSA_KERNELS[v.knob])}
    if v.op == "select_blocks":
        return select_keys(p, hq, hkv, d, num_sms)
    return set()


def select_keys(p: dict, hq: int, hkv: int, d: int, num_sms: int) -> set[tuple]:
    """The specialisations of one ``select_blocks`` call of params ``p``, from the launch plan
    ``perfmodel.select_work`` counts: the metadata build (per head dimension and method), and
    either the score launch (its tile, the tiles a program walks, the group size) and the pick
    (its row layout, ``top_n`` and warps), or the one launch holding both (``impl``)."""
    kinds = 2 if p["method"] == "quest" else 1
    t, nb = p["num_query_tokens"], -(-(p["context_len"] + p["num_query_tokens"]) // p["block_size"])
    t_pad, block_nb, warps = score_tile(t, kinds, d)
    pairs = p["batch"] * hkv
    tiles = score_tiles(-(-nb // block_nb) * pairs, num_sms)
    layout = row_layout(nb)
    pick_warps = threshold_warps(pairs * t, layout[0], num_sms)
    score = (hq // hkv, t_pad, block_nb, tiles, d, p["method"], warps)
    pick = (hkv, p["top_n"], *layout, pick_warps)
    keys = {("select_meta", d, p["method"])}
    if p.get("impl") == "one_launch":
        return keys | {("select_fused", *score, *pick)}
    return keys | {("select_scores", *score), ("select_pick", *pick)}
