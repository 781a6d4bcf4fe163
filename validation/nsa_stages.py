"""NSA verification on the GPU, whole calls and their stages, against the byte floor.

    python -m ssvkit.validation.nsa_stages --out validation/data/nsa-stages-h200.json \
        [--resume build/nsa-stages.jsonl] [--stop-after 480]

Llama-3.1-8B attention (32 query / 8 KV heads, D = 128, bf16), NSA's published geometry (top_n
16, blocks of 64, window 512, compression 32 / 16). Each case first checks the fused calls (merge
separate and folded) and the unfused one against the fp32 reference (reuse with the reference's
indices; a mismatch or NaN stops the run), then times with ``kernels.timing`` (CUDA graphs, L2
flushed per sample, median):

- ``reuse`` / ``reuse_unfused`` / ``refresh`` / ``refresh_unfused``: whole calls (``reuse`` with
  the union plan passed in, as the engine's reuse layers do) with the default config: the merge
  and the refresh path's top-n pick each a launch of its own;
- ``*_folded``: the same calls with ``NsaVerifyConfig(merge="auto", pick="folded")``: the merge
  folded into the forward launch and the pick into the block scoring; the difference is what
  folding them saves (negative: the fold is slower);
- ``reuse_last`` / ``reuse_parallel``: the reuse call with the merge folded each way
  (``merge="last"``: a row tile's last program merges it; ``"parallel"``: merge programs, one
  per draft row), which ``auto`` chooses between;
- ``stage_*``: one launch each of the forward over one branch's slots (no merge), the merge, the
  union plan, the refresh path's steps (1)-(3), its block importance alone, the top-n kernel
  alone, and importance and pick in one launch (``stage_select_folded``). ``reuse`` minus
  ``stage_fwd_all`` is what the merge launch adds.

Reuse indices have an exact adjacent-row overlap of 0.7
(``calibration.kernel_inputs.overlap_block_idx``, the regime SSV measured); input sets rotate so
each launch reads cold data. ``floor_s`` is the call's unique bytes (compressed K/V, each
(sequence, KV head)'s union of selected blocks and the window, the tail, q and o) over the copy
bandwidth measured in the same run.

``--resume FILE`` keeps each finished case in a run cache (``validation.bench.RunCache``), so a
run cut off goes on where it stopped; ``--stop-after S`` starts no case after S seconds (the
JSON then says ``complete: false``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time

import numpy as np
import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.kernels import nsa_selection as selection
from ssvkit.kernels import nsa_steps as steps
from ssvkit.kernels import nsa_verify as nv
from ssvkit.kernels import timing as tm
from ssvkit.kernels.nsa_launch import DEFAULT_CONFIG, make_plan, plan_slots, refresh_slots
from ssvkit.perfmodel.files import atomic_write
from ssvkit.validation.bench import RunCache

KW = dict(top_n=16, block_size=64, window=512, comp_block=32, comp_stride=16)
TIMING = tm.TimingConfig(warmup=3, graph_launches=10, graph_reps=8, max_total_s=0.3)
# (batch, draft rows t, context, cache capacity or None for context + t): the 32K case in a
# 128K cache shows that a call's cost follows the prefix, not the capacity.
CASES = (
    (1, 16, 131072, None),
    (1, 4, 131072, None),
    (1, 1, 131072, None),
    (1, 16, 32768, None),
    (1, 16, 32768, 131072 + 17),
    (16, 16, 65536, None),
    (16, 1, 65536, None),
)
OVERLAP = 0.7
K = 1024
# The calls with their dependent launches folded: the merge into the forward, the refresh path's
# top-n pick into its block importance.
FOLDED = dataclasses.replace(DEFAULT_CONFIG, merge="auto", pick="folded")
# The merge folded either way ``auto`` chooses between (kernels.nsa_steps.merge_layout).
MERGE_LAST = dataclasses.replace(DEFAULT_CONFIG, merge="last")
MERGE_PARALLEL = dataclasses.replace(DEFAULT_CONFIG, merge="parallel")


def input_sets(
    bsz: int, t: int, ctx: int, capacity: int, num_sets: int
) -> list[tuple[tuple, torch.Tensor]]:
    """Rotation sets sharing one K/V cache: fresh q, compressed K/V and block indices each."""
    gen = ki.generator(1 + ctx + bsz)
    rng = np.random.default_rng(ctx + bsz)
    q, k, v, lens, mask = ki.attention_inputs(bsz, t, capacity, [ctx] * bsz, gen)
    ck, cv, _ = nv.compress_kv(k, v, lens, comp_block=KW["comp_block"], comp_stride=16)
    gates = torch.full((bsz, t, ki.NUM_Q_HEADS, 3), 1 / 3, device=ki.DEVICE)
    nb = [ctx // KW["block_size"]] * bsz
    out = []
    for s in range(num_sets):
        ck_s, cv_s = (ck, cv) if s == 0 else (torch.randn_like(ck), torch.randn_like(cv))
        if t > 1:
            idx = ki.overlap_block_idx(nb, t, KW["top_n"], OVERLAP, rng)
        else:
            idx = ki.random_block_idx(nb, t, KW["top_n"], rng)
        args = (torch.randn_like(q), k, v, lens, mask, ck_s, cv_s, gates)
        out.append((args, torch.from_numpy(idx).to(ki.DEVICE)))
    return out


def floor_bytes(bsz: int, t: int, ctx: int, idx: torch.Tensor) -> int:
    idx_np = idx.cpu().numpy()
    bs = KW["block_size"]
    window = set(range((ctx - KW["window"]) // bs, ctx // bs))
    tokens = 0
    for b in range(bsz):
        for h in range(ki.NUM_KV_HEADS):
            tokens += len((set(idx_np[b, h].ravel().tolist()) - {-1}) | window) * bs + t
    comp = bsz * ki.NUM_KV_HEADS * ((ctx - KW["comp_block"]) // KW["comp_stride"] + 1)
    return ki.kv_bytes(tokens + comp) + ki.qol_bytes(bsz, t)


def check(sets) -> None:
    args, _ = sets[0]
    ro, ridx = nv.reference_nsa_verify(*args, **KW)
    variants = (
        ("fused", nv.nsa_verify, DEFAULT_CONFIG),
        ("fused, steps folded", nv.nsa_verify, FOLDED),
        ("fused, merge in the last program", nv.nsa_verify, MERGE_LAST),
        ("fused, merge programs", nv.nsa_verify, MERGE_PARALLEL),
        ("unfused", nv.nsa_verify_unfused, DEFAULT_CONFIG),
    )
    with tm.poisoned_allocations():
        for name, fn, config in variants:
            o, _ = fn(*args, block_idx=ridx.int(), config=config, **KW)
            if torch.isnan(o).any():
                raise SystemExit(f"nsa_verify {name}: NaN in the output")
            torch.testing.assert_close(o.float(), ro.float(), atol=3e-2, rtol=3e-2)


def calls(sets, plan, slots, rslots, unions, parts):
    """``name -> fn(i)`` of every timed call and stage (``rslots``: a refresh call's slots)."""
    out = {
        "reuse": lambda i: nv.nsa_verify(
            *sets[i][0], block_idx=sets[i][1], union=unions[i], **KW, validate=False
        ),
        "reuse_unfused": lambda i: nv.nsa_verify_unfused(
            *sets[i][0], block_idx=sets[i][1], **KW, validate=False
        ),
        "refresh": lambda i: nv.nsa_verify(*sets[i][0], **KW, validate=False),
        "refresh_unfused": lambda i: nv.nsa_verify_unfused(*sets[i][0], **KW, validate=False),
        "reuse_folded": lambda i: nv.nsa_verify(
            *sets[i][0],
            block_idx=sets[i][1],
            union=unions[i],
            **KW,
            validate=False,
            config=FOLDED,
        ),
        "reuse_unfused_folded": lambda i: nv.nsa_verify_unfused(
            *sets[i][0], block_idx=sets[i][1], **KW, validate=False, config=FOLDED
        ),
        "refresh_folded": lambda i: nv.nsa_verify(*sets[i][0], **KW, validate=False, config=FOLDED),
    }
    for name, config in (("reuse_last", MERGE_LAST), ("reuse_parallel", MERGE_PARALLEL)):
        out[name] = lambda i, config=config: nv.nsa_verify(
            *sets[i][0],
            block_idx=sets[i][1],
            union=unions[i],
            **KW,
            validate=False,
            config=config,
        )
    branch = {"comp": (slots[0], 0, 0), "sel": (0, slots[1], 0), "win": (0, 0, slots[2])}
    for name, sl in {**branch, "all": slots}.items():
        out[f"stage_fwd_{name}"] = lambda i, sl=sl: steps.launch_fwd(
            plan, sets[i][0], unions[i], parts[i], slots=sl
        )
    ck = sets[0][0][5]
    stored = selection.stores_comp_scores(plan, ck.shape[-1] * ck.element_size())
    cscores = [selection.alloc_comp_scores(plan, ki.DEVICE) if stored else None for _ in sets]
    out["stage_fwd_refresh_comp"] = lambda i: steps.launch_fwd(
        plan, sets[i][0], None, parts[i], slots=(rslots[0], 0, 0), comp_scores=cscores[i]
    )
    o = torch.empty_like(sets[0][0][0])
    out["stage_merge"] = lambda i: steps.launch_merge(
        plan, sets[i][0], unions[i], parts[i], o, slots
    )
    out["stage_union_plan"] = lambda i: steps.union_plan(sets[i][1], plan.rows, plan.nb_max)
    out["stage_refresh_select"] = lambda i: selection.refresh_indices(
        plan, sets[i][0], parts[i], rslots
    )
    out["stage_scores"] = lambda i: selection.compressed_block_scores(
        plan, sets[i][0], parts[i], rslots[0], cscores[i]
    )
    scores = torch.randn((plan.batch, plan.num_kv_heads, plan.num_t, plan.nb_max), device=ki.DEVICE)
    out["stage_topk"] = lambda i: selection.select_top_blocks(scores, sets[i][0][3], plan)
    out["stage_select_folded"] = lambda i: selection.picked_blocks(
        plan, sets[i][0], parts[i], rslots[0], cscores[i]
    )
    return out


def prepare(bsz: int, t: int, ctx: int, capacity: int, num_sets: int):
    """A case's input sets (checked against the fp32 reference), launch plan, slots of a reuse
    and of a refresh call, union plans and partial buffers: what ``calls`` takes."""
    sets = input_sets(bsz, t, ctx, capacity, num_sets)
    check(sets)
    kw = dict(KW, num_sink=1, num_local=1, sm_scale=None)
    plan = make_plan(sets[0][0][0], sets[0][0][1], sets[0][0][5], config=DEFAULT_CONFIG, **kw)
    device = torch.device(ki.DEVICE)
    slots = plan_slots(plan, device, DEFAULT_CONFIG)
    rslots = refresh_slots(plan, device, DEFAULT_CONFIG)
    unions = [steps.union_plan(idx, plan.rows, plan.nb_max) for _, idx in sets]
    parts = [steps.alloc_partials(plan, max(sum(slots), sum(rslots)), device) for _ in sets]
    return sets, plan, slots, rslots, unions, parts


def run_case(bsz: int, t: int, ctx: int, capacity: int | None, copy_bps: float) -> dict:
    num_sets = 4 if bsz == 1 else 2
    capacity = capacity or ctx + t
    sets, plan, slots, rslots, unions, parts = prepare(bsz, t, ctx, capacity, num_sets)
    floor = floor_bytes(bsz, t, ctx, sets[0][1])
    row = dict(
        batch=bsz,
        num_query_tokens=t,
        context_len=ctx,
        capacity=capacity,
        overlap=OVERLAP,
        slots=slots,
        refresh_slots=rslots,
        unique_bytes=floor,
        copy_bytes_per_s=copy_bps,
        floor_s=floor / copy_bps,
        times_s={},
    )
    for name, fn in calls(sets, plan, slots, rslots, unions, parts).items():
        row["times_s"][name] = tm.bench(fn, "graph", num_inputs=num_sets, config=TIMING).median_s
    torch.cuda.empty_cache()
    return row


def case_key(bsz: int, t: int, ctx: int, capacity: int | None) -> str:
    return f"b{bsz}-t{t}-{ctx}-{capacity or ctx + t}"


def measure(cache: RunCache | None, stop_at: float) -> tuple[list[dict], bool]:
    """Every case's row (from the cache when it holds it); stops starting cases at
    ``stop_at`` (``time.perf_counter``). Returns the rows and whether every case is in."""
    copy_bps = None
    rows = []
    for case in CASES:
        key = case_key(*case)
        if cache is not None and key in cache.runs:
            rows.append(cache.runs[key])
            continue
        if time.perf_counter() >= stop_at:
            return rows, False
        copy_bps = copy_bps or tm.copy_bytes_per_s()
        if cache is None:
            row = run_case(*case, copy_bps)
        else:
            row = cache.get(key, functools.partial(run_case, *case, copy_bps))
        rows.append(row)
    return rows, True


COLUMNS = {
    "reuse": "reuse",
    "reuse_folded": "reuse_fold",
    "reuse_last": "reuse_last",
    "reuse_parallel": "reuse_par",
    "reuse_unfused": "reuse_unf",
    "refresh": "refresh",
    "refresh_folded": "refr_fold",
    "refresh_unfused": "refr_unf",
    "stage_fwd_all": "fwd_all",
    "stage_merge": "merge",
    "stage_fwd_refresh_comp": "r_comp",
    "stage_scores": "scores",
    "stage_topk": "topk",
    "stage_select_folded": "sel_fold",
    "stage_union_plan": "union",
}


def print_table(rows: list[dict]) -> None:
    """One line per case: the floor, the times (us), each call's ratio to the floor and what
    folding the merge and the pick saved (negative: the fold is slower)."""
    print(
        f"{'case':>18s} {'floor':>7s}"
        + "".join(f" {n:>9s}" for n in COLUMNS.values())
        + "  reuse/floor  refresh/floor  fused/unfused  fold saves reuse, refresh (us)"
    )
    for r in rows:
        ts = {k: v * 1e6 for k, v in r["times_s"].items()}
        floor_us = r["floor_s"] * 1e6
        case = f"b{r['batch']} t{r['num_query_tokens']} {r['context_len'] // K}K"
        if r["capacity"] > r["context_len"] + r["num_query_tokens"]:
            case += f"/{r['capacity'] // K}K"
        print(
            f"{case:>18s} {floor_us:7.1f}"
            + "".join(f" {ts[c]:9.1f}" for c in COLUMNS)
            + f"  {ts['reuse'] / floor_us:11.2f}  {ts['refresh'] / floor_us:13.2f}"
            + f"  {ts['reuse_unfused'] / ts['reuse']:13.2f}"
            + f"  {ts['reuse'] - ts['reuse_folded']:10.1f}, "
            + f"{ts['refresh'] - ts['refresh_folded']:.1f}"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write the JSON document here")
    p.add_argument("--resume", default=None, metavar="FILE", help="run cache (JSONL)")
    p.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="S",
        help="start no case after S seconds; a later call with --resume goes on",
    )
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    cache = None
    if args.resume:
        prov = {k: v for k, v in tm.provenance().items() if k != "timestamp"}
        settings = dict(kwargs=KW, config=str(DEFAULT_CONFIG), timing=str(TIMING), **prov)
        try:
            cache = RunCache(args.resume, settings)
        except ValueError as e:
            p.exit(2, f"nsa_stages: {e}\n")
    stop_at = t0 + args.stop_after if args.stop_after is not None else float("inf")
    rows, complete = measure(cache, stop_at)
    doc = {
        "benchmark": "nsa_stages",
        "complete": complete,
        "kwargs": KW,
        "config": str(DEFAULT_CONFIG),
        "provenance": tm.provenance(),
        "rows": rows,
    }
    if args.out:
        atomic_write(args.out, json.dumps(doc, indent=1) + "\n")
    print_table(rows)
    if not complete:
        left = f"{len(rows)} of {len(CASES)} cases"
        print(f"stopped by --stop-after after {left}: run again with --resume")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
