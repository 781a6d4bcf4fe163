"""How well the n-gram shadow's fixed sample of a batch stands for the whole batch, on the CPU.

    python -m ssvkit.validation.shadow_sample --batch 32 --sample 8 --json /tmp/sample.json

The shadow scores ``S`` of a batch's ``B`` sequences (``engine.ngram.shadow_sample``); the
controller's ``ShadowTracker`` turns the sample's walks into estimates with intervals that
hold the sequences' spread the sample leaves out (``planner.shadow``). This replays batches of
texts, every text's own shadow from a batch-1 n-gram drafter on it (``sequence_rounds``), a
batch a draw of ``B`` texts from a pool of ``2 B`` of a prompt set (``check``): one tracker
takes the whole batch's counts and one the sample's (``compose``). Per walk and estimate the
table gives how often the whole batch's estimate lies within ``z`` of the sample's stated error
(``covered``; at least the two-sided level of ``z`` when the error is honest: 90% at 1.645),
beside the coverage without the sequences' spread (``naive``) and the errors (``summarise``).
"""

from __future__ import annotations

import json
import sys

import numpy as np
from ssvkit.engine.controller import SequenceWalks, ShadowAcceptance
from ssvkit.engine.ngram import SHADOW_MAX_CHAIN, NgramDrafter, shadow_sample
from ssvkit.kernels.timing import provenance
from ssvkit.perfmodel.arguments import OneLineParser
from ssvkit.perfmodel.files import atomic_write
from ssvkit.planner.shadow import ShadowTracker
from ssvkit.validation.controller_world import load_setting
from ssvkit.validation.prompts import PROMPT_SETS, prompt_tokens

KEEP = 0.95  # ControllerConfig().ema = 0.05


def sequence_rounds(text: list[int], context: int, sizes, trees) -> list[ShadowAcceptance]:
    """One text's shadow, round by round: a batch-1 n-gram drafter with ``trees``, primed on
    its first ``context`` tokens, then reading ``sizes[r]`` more in round r (a sequence's
    shadow does not depend on the others', so a batch's is composed from these)."""
    d = NgramDrafter("cpu", 3, SHADOW_MAX_CHAIN, trees)
    d.start([text[:context]])
    hist, out = text[:context], []
    for n in sizes:
        hist += text[len(hist) : len(hist) + n]
        d.sync([hist])
        out.append(d.take_shadow())
    return out


def compose(rows: list[ShadowAcceptance], tokens: list[int], slots) -> ShadowAcceptance:
    """One round of a batch whose sequences' own shadows are ``rows`` (``tokens`` read each):
    summed over all of them (``slots`` None), or over the sampled ``slots`` with each one's
    walks beside (``NgramDrafter.take_shadow``)."""
    picked = rows if slots is None else [rows[j] for j in slots]
    trees = tuple(
        (spec, *(sum(x.trees[i][k] for x in picked) for k in (1, 2, 3)))
        for i, (spec, *_) in enumerate(picked[0].trees)
    )
    sums = [
        tuple(map(sum, zip(*(getattr(x, f) for x in picked), strict=True)))
        for f in ("matched", "rounds", "drafts")
    ]
    sequences, by_sequence = None, ()
    if slots is not None:
        by_sequence = tuple(
            SequenceWalks(
                tokens[j],
                (*rows[j].rounds, *(t[1] for t in rows[j].trees)),
                (*rows[j].drafts, *(t[2] for t in rows[j].trees)),
            )
            for j in slots
        )
        sequences = sum(1 for x in by_sequence if x.tokens)
    return ShadowAcceptance(sum(x.positions for x in picked), *sums, trees, sequences, by_sequence)


def pool_texts(kind: str, count: int, context: int, rounds: int) -> list[list[int]]:
    """``count`` texts of prompt set ``kind`` (``mixed``: the four in turn), each from a window
    of its own, long enough for ``context`` tokens and ``rounds`` rounds of 5."""
    n = context + 5 * rounds
    kinds = PROMPT_SETS if kind == "mixed" else (kind,)
    return [
        prompt_tokens(kinds[i % len(kinds)], n, offset=(2 + i // len(kinds)) * context)
        for i in range(count)
    ]


def walk_keys(trees: tuple[str, ...]) -> list[tuple[str, int, str]]:
    """(label, chain length or 0, tree) of every walk the shadow scores."""
    chains = [(f"chain:{k}", k, f"chain:{k}") for k in range(1, SHADOW_MAX_CHAIN + 1)]
    return chains + [(t, 0, t) for t in trees]


def _estimate(tracker: ShadowTracker, chain: int, tree: str, z: float, naive: bool):
    """Per estimate the controller decides on -- ``accepted`` (drafts per round) and ``pair``
    (rounds per round of a sequence, ``walk_high``) --, (value, error at ``z``), or None;
    ``naive``: the error of a full batch (the sample's share taken as 1)."""
    share = tracker.share.get("ngram")
    if naive:
        tracker.share["ngram"] = 1.0
    try:
        acc = tracker.accepted("ngram", chain, tree, z)
        high = tracker.walk_high("ngram", chain, tree, z)
        mid = tracker.walk_high("ngram", chain, tree, 0.0)
    finally:
        if share is not None:
            tracker.share["ngram"] = share
    pair = None if high is None or mid is None else (mid[0], high[0] - mid[0])
    return {"accepted": acc, "pair": pair}


def replay(per_seq, sizes, draw, slots, checkpoints, keys, z: float) -> list[dict]:
    """One batch (the pool's sequences ``draw``) replayed into a tracker of the whole batch
    and one of its sample (``slots``): at each checkpoint, per walk label and estimate, (the
    whole batch's value, the sample's, its error, its naive error), or None."""
    full, sample = ShadowTracker(), ShadowTracker()
    batch, out = len(draw), []
    for r in range(max(checkpoints)):
        rows = [per_seq[p][r] for p in draw]
        toks = [int(sizes[r, p]) for p in draw]
        tokens = float(np.mean(toks))
        full.observe({"ngram": compose(rows, toks, None)}, tokens, KEEP, batch)
        sample.observe({"ngram": compose(rows, toks, slots)}, tokens, KEEP, batch)
        if r + 1 not in checkpoints:
            continue
        row = {}
        for label, chain, tree in keys:
            whole = _estimate(full, chain, tree, 0.0, False)
            part = _estimate(sample, chain, tree, z, False)
            naive = _estimate(sample, chain, tree, z, True)
            for est in ("accepted", "pair"):
                w, p, q = whole[est], part[est], naive[est]
                ok = w is not None and p is not None and q is not None
                row[label, est] = (w[0], p[0], p[1], q[1]) if ok else None
        out.append(row)
    return out


def summarise(rows: list[dict]) -> dict:
    """Per walk label and estimate over every draw and checkpoint: how often the whole batch's
    value lies within the sample's error (``covered``) and within the naive one (``naive``),
    the error's median relative to the value (``rel_error``), the 90th percentile of the miss
    (whole batch against sample) relative to it (``rel_miss_p90``), and the comparisons made
    (``n``)."""
    out = {}
    for key in dict.fromkeys(k for row in rows for k in row):
        got = np.array([row[key] for row in rows if row.get(key) is not None])
        if not len(got):
            continue
        miss = np.abs(got[:, 0] - got[:, 1])
        scale = np.maximum(np.abs(got[:, 1]), 1e-9)
        out[f"{key[0]}|{key[1]}"] = {
            "covered": float(np.mean(miss <= got[:, 2])),
            "naive": float(np.mean(miss <= got[:, 3])),
            "rel_error": float(np.median(got[:, 2] / scale)),
            "rel_miss_p90": float(np.percentile(miss / scale, 90)),
            "n": len(got),
        }
    return out


def check(
    kind: str,
    batch: int,
    sample: int,
    context: int,
    rounds: int,
    draws: int,
    trees: tuple[str, ...],
    per_round: tuple[int, int] = (1, 5),
    z: float = 1.645,
    seed: int = 0,
) -> dict:
    """``summarise`` of ``draws`` batches of ``batch`` texts drawn from a pool of ``2 batch``
    of ``kind``, their samples of ``sample``, checked every quarter of ``rounds`` past the
    first, each sequence committing a draw of ``per_round`` tokens a round (1-5 by default;
    ``(1, 1)``: autoregressive decoding), the intervals at ``z`` standard errors."""
    if not 2 <= sample < batch:
        raise ValueError(f"the sample must lie in 2..batch - 1, got {sample} of {batch}")
    rng = np.random.default_rng(seed)
    pool = pool_texts(kind, 2 * batch, context, rounds)
    sizes = rng.integers(per_round[0], per_round[1] + 1, (rounds, len(pool)))
    per_seq = [sequence_rounds(t, context, sizes[:, i], trees) for i, t in enumerate(pool)]
    slots = shadow_sample(batch, sample)
    checkpoints = {rounds * q // 4 for q in (2, 3, 4)}
    keys = walk_keys(trees)
    rows = []
    for _ in range(draws):
        draw = rng.choice(len(pool), batch, replace=False).tolist()
        rows += replay(per_seq, sizes, draw, slots, checkpoints, keys, z)
    return summarise(rows)


def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--sample", type=int, default=8, help="sequences the shadow scores")
    p.add_argument("--sets", default="code,prose,repetitive,random,mixed")
    p.add_argument("--context", type=int, default=30720, help="prompt tokens (the trees' regime)")
    p.add_argument("--rounds", type=int, default=160)
    p.add_argument("--draws", type=int, default=100, help="batches drawn per set")
    p.add_argument("--per-round", default="1-5", help="tokens a sequence commits per round")
    p.add_argument("--z", type=float, default=1.645, help="standard errors of the intervals")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    try:
        lo, _, hi = args.per_round.partition("-")
        per_round = (int(lo), int(hi or lo))
        if not 1 <= per_round[0] <= per_round[1] <= 5:
            raise ValueError(f"--per-round must be N or N-M within 1..5, got {args.per_round!r}")
        sets = [s for s in args.sets.split(",") if s]
        bad = [s for s in sets if s not in (*PROMPT_SETS, "mixed")]
        if bad:
            raise ValueError(f"unknown prompt set {bad[0]!r}")
        if min(args.rounds, args.draws, args.context) < 8 or not args.z > 0:
            raise ValueError("--rounds, --draws and --context must be >= 8 and --z > 0")
        if not 2 <= args.sample < args.batch:
            raise ValueError(f"--sample must lie in 2..{args.batch - 1}, got {args.sample}")
    except ValueError as e:
        print(f"shadow_sample: {e}", file=sys.stderr)
        return 2
    from ssvkit.planner.controller import OnlineController

    trees = OnlineController(*load_setting()[:4]).shadow_trees(args.context)
    doc = {"args": vars(args), "trees": list(trees), "provenance": provenance(), "sets": {}}
    for kind in sets:
        doc["sets"][kind] = got = check(
            kind,
            args.batch,
            args.sample,
            args.context,
            args.rounds,
            args.draws,
            trees,
            per_round,
            args.z,
        )
        print(f"-- {kind}: batch {args.batch}, sample {args.sample}, z {args.z}")
        print("walk                      estimate  covered  naive  rel.error  miss p90    n")
        for key, v in got.items():
            walk, _, est = key.rpartition("|")
            walk = walk if len(walk) <= 24 else walk[:21] + "..."
            print(
                f"{walk:24s} {est:9s} {v['covered']:8.1%} {v['naive']:6.1%} "
                f"{v['rel_error']:9.1%} {v['rel_miss_p90']:9.1%} {v['n']:5d}"
            )
    if args.json:
        atomic_write(args.json, json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
