"""NSA verification on the GPU, whole calls and their stages, against the byte floor.

    python -m ssvkit.validation.nsa_stages --out validation/data/nsa-stages-h200.json \\
        [--resume build/nsa-stages.jsonl] [--stop-after 480]

Llama-3.1-8B attention (32 query / 8 KV heads, D = 128, bf16), NSA's published geometry
(``KW``: top_n 16, blocks of 64, window 512, compression 32 / 16), reuse indices with an exact
adjacent-row overlap of 0.7, input sets rotating so each launch reads cold data
(``input_sets``). Each case is first checked against the fp32 reference (``check``: a mismatch
or NaN stops the run), then every call and stage of ``calls`` is timed with ``kernels.timing``
(CUDA graphs, L2 flushed per sample, median): the whole calls with the default config, folded
(``FOLDED``), with PDL (``PDL``) and with the merge folded either way, and launches alone
(``stage_*``). ``floor_s`` is the call's unique bytes (``floor_bytes``) over the copy bandwidth
measured in the same run.
"""

from __future__ import annotations

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
from ssvkit.kernels import select_blocks as sb
from ssvkit.kernels import timing as tm
from ssvkit.kernels.block_metadata import BlockMetadata
from ssvkit.kernels.nsa_config import DEFAULT_CONFIG
from ssvkit.kernels.nsa_launch import make_plan, plan_slots, refresh_slots
from ssvkit.kernels.select_reference import reference_select_blocks
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write
from ssvkit.validation.bench import RunCache
from ssvkit.validation.nsa_stages_table import print_pdl_table, print_table

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
# Every launch of a call after its first a programmatic dependent of the one before.
PDL = dataclasses.replace(DEFAULT_CONFIG, pdl=True)
# The whole calls timed with and without PDL: (function, reuse: with the set's indices).
CALLS = {
    "reuse": (nv.nsa_verify, True),
    "reuse_unfused": (nv.nsa_verify_unfused, True),
    "refresh": (nv.nsa_verify, False),
    "refresh_unfused": (nv.nsa_verify_unfused, False),
}
# select_blocks' selections that must agree with its fp32 reference's (bf16 queries reorder
# near-ties), as in the kernel sweep's check.
SELECT_AGREEMENT = 0.97


def input_sets(
    bsz: int, t: int, ctx: int, capacity: int, num_sets: int
) -> list[tuple[tuple, torch.Tensor]]:
    """Rotation sets sharing one K/V cache: fresh q, compressed K/V and block indices each, the
    indices of ``t`` > 1 rows with an exact adjacent-row overlap of ``OVERLAP``
    (``calibration.kernel_inputs.overlap_block_idx``, the regime SSV measured)."""
    gen = ki.generator(1 + ctx + bsz)
    rng = np.random.default_rng(ctx + bsz)
    q, k, v, lens, mask = ki.attention_inputs(bsz, t, capacity, [ctx] * bsz, gen)
    ck, cv, _ = nv.compress_kv(
        k, v, lens, comp_block=KW["comp_block"], comp_stride=KW["comp_stride"]
    )
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
    """A call's unique bytes: the compressed K/V, each (sequence, KV head)'s union of selected
    blocks and the window, the tail, q and o."""
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
    """On set 0: the fused calls (merge separate and folded either way, with and without PDL)
    and the unfused ones against the fp32 reference (reuse with the reference's indices), each
    whole call of ``CALLS`` with PDL against the call without (bitwise: output and indices), and
    ``check_select``; ``SystemExit`` on a NaN or a mismatch."""
    args, _ = sets[0]
    ro, ridx = nv.reference_nsa_verify(*args, **KW)
    variants = (
        ("fused", nv.nsa_verify, DEFAULT_CONFIG),
        ("fused, steps folded", nv.nsa_verify, FOLDED),
        ("fused, merge in the last program", nv.nsa_verify, MERGE_LAST),
        ("fused, merge programs", nv.nsa_verify, MERGE_PARALLEL),
        ("fused, pdl", nv.nsa_verify, PDL),
        ("unfused", nv.nsa_verify_unfused, DEFAULT_CONFIG),
        ("unfused, pdl", nv.nsa_verify_unfused, PDL),
    )
    with tm.poisoned_allocations():
        for name, fn, config in variants:
            o, _ = fn(*args, block_idx=ridx.int(), config=config, **KW)
            if torch.isnan(o).any():
                raise SystemExit(f"nsa_verify {name}: NaN in the output")
            torch.testing.assert_close(o.float(), ro.float(), atol=3e-2, rtol=3e-2)
        for name, (fn, reuse) in CALLS.items():
            kw = dict(KW, block_idx=ridx.int() if reuse else None)
            (o, idx), (o_pdl, idx_pdl) = (fn(*args, config=c, **kw) for c in (DEFAULT_CONFIG, PDL))
            if not (torch.equal(o_pdl, o) and torch.equal(idx_pdl, idx)):
                raise SystemExit(f"nsa_verify {name}: the call with pdl differs from the call")
    check_select(sets)


def select_metadata(sets) -> list[BlockMetadata]:
    """Each set's block means (the sets share their keys: a buffer each, read cold)."""
    return [BlockMetadata.build(a[1], a[3], KW["block_size"]) for a, _ in sets]


def check_select(sets) -> None:
    """select_blocks with and without PDL pick the same blocks, which agree with the fp32
    reference's on at least ``SELECT_AGREEMENT`` of the picks."""
    q, k, _, lens = sets[0][0][:4]
    meta = select_metadata(sets[:1])[0]
    with tm.poisoned_allocations():
        idx, idx_pdl = (
            sb.select_blocks(q, meta, lens, top_n=KW["top_n"], pdl=p) for p in (False, True)
        )
    if not torch.equal(idx_pdl, idx):
        raise SystemExit("select_blocks: the call with pdl differs from the call")
    ref = reference_select_blocks(q, k, lens, KW["block_size"], top_n=KW["top_n"])
    rows = zip(idx.flatten(0, 2).cpu().tolist(), ref.flatten(0, 2).cpu().tolist(), strict=True)
    agree = sum(len(set(a) & set(b) - {-1}) for a, b in rows) / max(1, int((ref >= 0).sum()))
    if agree < SELECT_AGREEMENT:
        raise SystemExit(f"select_blocks: {agree:.3f} of the reference's blocks picked")


def whole_call(sets, unions, name: str, config, i: int):
    """Call ``name`` of ``CALLS`` on set ``i`` with ``config`` (the fused reuse call with the
    set's union plan, as the engine's reuse layers)."""
    fn, reuse = CALLS[name]
    args, idx = sets[i]
    kw = dict(KW, validate=False, config=config)
    if reuse:
        kw["block_idx"] = idx
        if fn is nv.nsa_verify:
            kw["union"] = unions[i]
    return fn(*args, **kw)


def calls(sets, plan, slots, rslots, unions, parts):
    """``name -> fn(i)`` of every timed call and stage (``rslots``: a refresh call's slots).

    - ``reuse`` / ``reuse_unfused`` / ``refresh`` / ``refresh_unfused``: whole calls (``reuse``
      with the union plan passed in, as the engine's reuse layers do) with the default config:
      the merge and the refresh path's top-n pick each a launch of its own;
    - ``*_folded``: the same calls with ``FOLDED``, the merge folded into the forward launch and
      the pick into the block scoring; the difference is what folding them saves (negative: the
      fold is slower);
    - ``*_pdl``: the whole calls with ``PDL``, every launch of a call after its first a
      programmatic dependent of the one before (``kernels.pdl``); the difference is what
      starting a launch while the one before drains saves; ``stage_refresh_select_pdl``
      the refresh path's steps (1)-(3) so, ``stage_fwd_all_pdl`` / ``stage_merge_pdl`` the two
      reuse launches' PDL kernels launched on their own (what the wait and its prologue cost);
    - ``select`` / ``select_pdl``: ``kernels.select_blocks`` (block means, the case's top_n and
      blocks, scoring and pick in two launches) without and with PDL;
    - ``reuse_last`` / ``reuse_parallel``: the reuse call with the merge folded each way
      (``merge="last"``: a row tile's last program merges it; ``"parallel"``: merge programs,
      one per draft row), which ``auto`` chooses between;
    - ``stage_*``: one launch each of the forward over one branch's slots or all of them (no
      merge), the merge, the union plan, the refresh path's steps (1)-(3), its compressed pass,
      its block importance alone, the top-n kernel alone, and importance and pick in one launch
      (``stage_select_folded``). ``reuse`` minus ``stage_fwd_all`` is what the merge launch adds.
    """
    out = _whole_calls(sets, unions)
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
    pdl_plan = dataclasses.replace(plan, pdl=True)
    out["stage_refresh_select_pdl"] = lambda i: selection.refresh_indices(
        pdl_plan, sets[i][0], parts[i], rslots
    )
    out["stage_fwd_all_pdl"] = lambda i: steps.launch_fwd(
        pdl_plan, sets[i][0], unions[i], parts[i], slots=slots
    )
    out["stage_merge_pdl"] = lambda i: steps.launch_merge(
        pdl_plan, sets[i][0], unions[i], parts[i], o, slots
    )
    metas = select_metadata(sets)
    for name, on in (("select", False), ("select_pdl", True)):
        out[name] = lambda i, on=on: sb.select_blocks(
            sets[i][0][0], metas[i], sets[i][0][3], top_n=KW["top_n"], pdl=on
        )
    return out


def _whole_calls(sets, unions) -> dict:
    """``calls``' whole calls: the default ones, folded, with each folded merge and with PDL."""
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
    for name in CALLS:
        out[f"{name}_pdl"] = functools.partial(whole_call, sets, unions, name, PDL)
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


def main(argv=None) -> int:
    """Measure every case of ``CASES``, write ``--out`` when given and print both tables.

    ``--resume FILE`` keeps each finished case in a run cache (``validation.bench.RunCache``),
    so a run cut off goes on where it stopped; ``--stop-after S`` starts no case after S
    seconds (the document then says ``complete: false``).
    """
    p = OneLineParser(description=__doc__.splitlines()[0])
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
    print_pdl_table(rows)
    if not complete:
        left = f"{len(rows)} of {len(CASES)} cases"
        print(f"stopped by --stop-after after {left}: run again with --resume")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
