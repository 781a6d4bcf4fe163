"""The planner's evaluation in the real decode loop (issue #7): does the offline ranking order
strategies the way the engine measures them, and does online adaptation pay off?

Four phases, all on one pair of model runners (target and draft) built once:

1. **profile** -- per regime, the engine decodes ``profile_prompts`` code prompts (windows of
   the validation split of the built-in corpus, each with its own seed, none of them the
   prompts of phases 3 and 4): every drafter on every tree of the space (dense) gives alpha
   per drafter and tree (the inverse of the mean tokens per round over the prompts,
   ``alpha_from_tokens``; a chain's pooled with its drafter's longer chains' first drafts,
   ``pooled_chain_tokens``); on the first prompt, each drafter on one tree with each sparse
   attention of the space gives that drafter's factor on alpha (over the same tree dense on
   that prompt);
   a union strategy per traversal order with the selection statistics on gives the group
   overlap gamma; the measured round times minus the step model's give the loop overhead per
   round (``measure_profile``).
2. **rank** -- ``planner.rank`` scores the whole space per regime with the calibrated model
   under that profile.
3. **measure** -- per regime, ``per_regime`` strategies the engine can run (the predicted top
   ones plus ranks spread evenly over the rest) are decoded once on each of ``measure_texts``
   *other* code prompts (``MEASURE_OFFSETS``; those that fit in the corpus at that context,
   ``measure_windows``), run i with seed i, and their runs pooled
   (``measure_prompts``: a regime's throughput, as the profile's acceptance is a regime's,
   not one prompt's -- n-gram acceptance moves with the prompt as much as with the strategy);
   each is scored again at the measured context. Kendall tau (predicted vs measured tokens/s) and
   the regret of the predicted best (1 - measured(predicted best) / measured best of the set).
4. **adapt** -- per prompt set (code in distribution; prose, repetitive text and random bytes
   off it): (a) a fixed default (the ``ssv`` baseline on the draft model), (b) the fixed
   offline best of the regime, (c) ``OnlineController`` starting from (b). The adaptive runs
   keep every drafter kind of the ranking's candidates warm (``OnlineController.drafter_kinds``:
   started after the prefill, outside the timing, ``warm_s``; a switch catches a drafter up
   instead of restarting it) and see the n-gram shadow acceptance every round. The adaptive run
   first goes twice untimed: the first (cold) captures the CUDA graphs and compiles the
   kernels of whatever it switches to, the second (warm, told the first's costs) switches as a
   server that has served requests before does -- the switch costs they measured per
   destination kind (the second's where it has one; ``OnlineController.switch_costs``) are
   what the timed runs' controllers know a switch costs before they make one. Then (b) and (c)
   alternate ``repeats`` times (medians), as a server that keeps its candidates' graphs would
   run them.
   ``adaptive_gain`` = (c) / (b) - 1; without a switch it is the measurement's spread. Each
   adaptive run's switches (with reasons), warm-up time and shadow estimates are recorded
   (``adaptive.runs``).

**Timing passes.** The measured and adaptive runs of phases 3 and 4 go ``timing_passes`` times
(``run_passes``): a whole pass over a phase's runs (a regime's, a prompt set's), then the next,
and each run's figure is its least disturbed pass among those that decoded the same
(``least_disturbed``). Within a pass the strategies' runs are interleaved (``interleave``: the
i-th run of every strategy in turn), so a slow stretch of the machine falls on a few runs of
every strategy instead of on one strategy's block. So do the profile's steady runs (phase 1)
for the overhead fit: after a regime's runs have measured its acceptance (strategy by
strategy), the later passes go over all of them interleaved. On the H100 machine one decode's
round time, the same tokens and rounds every time, moves by up to ~40% from run to run in slow
stretches of the shared host and never below a floor (``benchmarks/run_noise.py``): with one
pass, two strategies 3% apart trade places from one evaluation to the next. In run 30, whose
profile went once, the runs of one strategy (its prompts one after another) shared slow
stretches: the n-gram trees' profile rounds sat 20-24% above their measured ones at <=4K, and
the overhead fit's host terms took that up.

Tokens/s of every run: generated tokens over round wall time (the shadow's host time included)
plus the controller's host time (``control``, its re-scores; an overlapped controller's calls
run inside the next round's wall time, ``control_overlap``, and are counted there) and switch
time, leaving out round 0 (the first strategy's graph capture) and the later rounds that
captured a graph missing when the run began (``engine.results.RoundRecord.captured``). Those
are the first rounds after an adaptive run's switches, and whether the graphs were there is
the order of the evaluation's runs, not the controller: a server captures its strategies'
graphs before requests arrive, while here a sparse run (the default's, some of the oracle's)
drops every graph (``engine.runner.ModelRunner.retain``), so the first adaptive run of each
pass to switch to a strategy captured it again -- on the H100 (run 28) 17-31 ms of a ~200 ms
run, in the seed-0 runs of prose and random and seed 1 of prose (``steps_s["launch"]`` 99-124
us per round against 2-13 us). A capture after the run itself dropped the graphs (a switch that
changed the cache's summaries) is that switch's cost and counts. Each adaptive set also
reports its gain with those rounds counted (``adaptive_gain_captures_counted``,
``captures_counted``): in run 29 random measured +13.2% without them and about -3% with them.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import glob
import json
import math
import os
import site
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from perfmodel.files import atomic_write
from perfmodel.hardware import GpuSpec
from perfmodel.models import ModelSpec
from perfmodel.strategy import DrafterSpec, Strategy, parse_tree
from planner.controller import ControllerConfig, OnlineController
from planner.profile import (
    REGIMES,
    Profile,
    accepted_histogram,
    alpha_from_tokens,
    attention_key,
    chain_length,
    fit_overhead,
    pooled_chain_tokens,
    regime_of,
)
from planner.rank import concrete, rank, score, strategy_from_json
from planner.space import SpaceSpec, describe, strategy_id, valid_strategies

EVAL_VERSION = 1
PROMPT_SETS = ("code", "prose", "repetitive", "random")
OFF_DISTRIBUTION = ("prose", "repetitive", "random")
TARGETS = {"kendall_tau_min": 0.8, "regret_max": 0.05, "adaptive_gain_min": 0.10}


# ----------------------------------------------------------------------------- prompts


def prose_stream() -> bytes:
    """English prose from the installed packages' ``.dist-info/METADATA`` long descriptions
    (their bodies, after the header block). The training corpus skips ``.dist-info``, so the
    tiny pair never saw these bytes."""
    roots = list(dict.fromkeys(site.getsitepackages() + [site.getusersitepackages()] + sys.path))
    files = sorted({f for r in roots for f in glob.glob(f"{r}/*.dist-info/METADATA")})
    parts = []
    for f in files:
        try:
            text = Path(f).read_bytes()
        except OSError:
            continue
        _, sep, body = text.partition(b"\n\n")
        if sep and len(body.strip()) > 200:
            parts.append(body.strip())
    if not parts:
        raise ValueError("no package METADATA with a long description found for prose prompts")
    return b"\n\n".join(parts)


def prompt_tokens(kind: str, n: int, *, offset: int = 0, seed: int = 0) -> list[int]:
    """``n`` byte tokens of prompt set ``kind``; ``offset`` selects a different window of the
    same source (code and prose), so a profile prompt and a measured prompt differ."""
    from engine.corpus import corpus_sample

    if n < 1:
        raise ValueError(f"prompt length must be >= 1, got {n}")
    if kind == "code":
        return corpus_sample(offset + n)[offset:]
    if kind in ("prose", "repetitive"):
        data = prose_stream()
        if kind == "repetitive":  # one paragraph, over and over
            start = offset % max(len(data) - 256, 1)
            data = data[start : start + 256]
        else:
            data = data[offset % len(data) :] + data[: offset % len(data)]
        reps = -(-n // len(data))
        return list((data * reps)[:n])
    if kind == "random":
        return np.random.default_rng(seed + offset).integers(0, 256, n).tolist()
    raise ValueError(f"unknown prompt set {kind!r}; expected one of {', '.join(PROMPT_SETS)}")


# ----------------------------------------------------------------------------- runs


def read_runs(lines: list[str], path) -> dict[str, dict]:
    """The runs by key of a run cache's lines (the first, its settings, skipped); a last line
    cut short by a kill is dropped, any other line that is not JSON is an error."""
    runs = {}
    for i, line in enumerate(lines[1:], start=2):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                break  # the run being written when the process was killed
            raise ValueError(f"run cache {str(path)!r}: line {i} is not JSON") from None
        runs[row["key"]] = row["value"]
    return runs


class RunCache:
    """Completed runs by key, appended to a JSONL file as each finishes, so an evaluation cut
    off by a time limit resumes where it stopped (device calls are at most 10 minutes).

    The first line holds the settings the runs were measured under; a cache written under other
    settings is refused. A last line cut short by a kill is dropped (that run goes again)."""

    def __init__(self, path: str | Path, settings: dict):
        self.path = Path(path)
        self.settings = settings
        self.runs: dict[str, dict] = {}
        self.reused = 0
        if self.path.exists() and self.path.stat().st_size:
            lines = self.path.read_text().splitlines()
            try:
                head = json.loads(lines[0])
            except json.JSONDecodeError:
                raise ValueError(f"run cache {str(self.path)!r}: first line is not JSON") from None
            if head.get("settings") != settings:
                raise ValueError(
                    f"run cache {str(self.path)!r} was written for other settings "
                    f"({head.get('settings')}); give a new file or the same settings"
                )
            self.runs = read_runs(lines, self.path)
            # Rewritten without a cut-off tail, whole or not at all: a kill here keeps the runs.
            kept = [json.dumps({"settings": settings})]
            kept += [json.dumps({"key": k, "value": v}) for k, v in self.runs.items()]
            atomic_write(self.path, "\n".join(kept) + "\n")
        else:
            if self.path.parent and not self.path.parent.exists():
                raise ValueError(f"run cache folder {str(self.path.parent)!r} does not exist")
            self.path.write_text(json.dumps({"settings": settings}) + "\n")

    def get(self, key: str, fn) -> dict:
        """The cached value of ``key``, or ``fn()`` -- then appended to the file at once."""
        if key in self.runs:
            self.reused += 1
            return self.runs[key]
        value = fn()
        self.runs[key] = value
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"key": key, "value": value}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return value


@dataclass
class Bench:
    """The runners, decode settings and the models' specs (for the prediction)."""

    target: object  # engine.runner.ModelRunner
    draft: object | None
    model: ModelSpec
    gpu: GpuSpec
    draft_label: str
    max_new_tokens: int = 256
    repeats: int = 2
    # Code prompts each measured strategy decodes, one run each (``measure_windows``).
    measure_texts: int = 5
    # Passes over a phase's runs (``run_passes``): each run's figure is its least disturbed.
    timing_passes: int = 1
    log: object = print
    cache: RunCache | None = None
    temperature: float = 0.0

    def decode(self, record_stats: bool = False, seed: int = 0):
        from engine.settings import DecodeConfig

        return DecodeConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seed=seed,
            record_stats=record_stats,
        )

    def run(self, key: str, fn, *args, **kwargs) -> dict:
        """``fn(*args, **kwargs)`` (a JSON-able dict of one run's figures), through the cache
        when there is one."""
        call = functools.partial(fn, *args, **kwargs)
        return call() if self.cache is None else self.cache.get(key, call)

    def runnable(self, s: Strategy) -> str | None:
        """Why the engine cannot run ``s`` (None when it can)."""
        from engine.loop import check_strategy

        try:
            check_strategy(
                s,
                self.target.config,
                self.draft.config if self.draft is not None else None,
                self.target.backend,
            )
        except ValueError as e:
            return str(e)
        return None


def make_bench(
    model: str,
    draft_model: str,
    max_context: int,
    new_tokens: int,
    repeats: int,
    device: str = "auto",
    gpu: str = "h100-sxm",
    temperature: float = 0.0,
) -> Bench:
    """Target and draft runners (batch 1, room for ``max_context`` plus the new tokens and a
    tree), bf16 Triton kernels and CUDA graphs on the GPU, fp32 torch on the CPU."""
    import torch

    from engine.checkpoint import build_model, resolve_source
    from engine.runner import ModelRunner
    from perfmodel.hardware import get_gpu
    from perfmodel.models import get_model

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    backend = "triton" if cuda else "torch"
    t_max = max_context + new_tokens + 64 + 1
    tsrc, dsrc = resolve_source(model), resolve_source(draft_model)
    runners = []
    for src in (tsrc, dsrc):
        m = build_model(src, max_positions=t_max, device=device, dtype=dtype)
        runners.append(ModelRunner(m, batch=1, t_max=t_max, backend=backend, use_graphs=cuda))
    return Bench(
        target=runners[0],
        draft=runners[1],
        model=get_model(str(tsrc.path)),
        gpu=get_gpu(gpu),
        draft_label=str(dsrc.path),
        max_new_tokens=new_tokens,
        repeats=repeats,
        log=lambda m: print(m, flush=True),
        temperature=temperature,
    )


def regime_contexts(text: str, flag: str, new_tokens: int) -> dict[str, int]:
    """One context per regime from ``text`` (``"3584,15K"``), in regime order. A context whose
    run (plus its new tokens and a full tree) would decode past its regime's bound is refused:
    the run would be judged against the next regime's profile."""
    from perfmodel.numbers import parse_count_list
    from planner.space import MAX_KERNEL_ROWS

    contexts: dict[str, int] = {}
    for c in parse_count_list(text, flag):
        r = regime_of(c)
        if r in contexts:
            raise ValueError(f"{flag} {text}: two contexts fall in regime {r}")
        if r != "64K+" and c + new_tokens + MAX_KERNEL_ROWS > REGIMES[r]:
            raise ValueError(
                f"{flag}: {c} + {new_tokens} new tokens + a tree would grow past regime {r} "
                f"(<= {REGIMES[r]}) while decoding; measure at a smaller context"
            )
        contexts[r] = c
    return {r: contexts[r] for r in REGIMES if r in contexts}


def steady_figures(result) -> dict:
    """tokens/s, mean accepted, round count and mean step times (CUDA events on the GPU) of a
    run, without round 0 and without the later rounds that captured a CUDA graph missing when
    the run began (``RoundRecord.captured``; ``capture_rounds``, their wall time
    ``capture_s``). See the module."""
    later = result.rounds[1:]
    captured = [r for r in later if r.captured]
    rounds = [r for r in later if not r.captured] or result.rounds
    tokens = sum(r.tokens for r in rounds)
    wall = sum(r.wall_s for r in rounds)
    switch = sum(r.step_s.get("switch", 0.0) for r in rounds)
    control = sum(r.step_s.get("control", 0.0) for r in rounds)
    # An overlapped controller's calls ran inside the next round's wall time: counted there.
    overlapped = sum(r.step_s.get("control_overlap", 0.0) for r in rounds)
    return {
        "tokens_per_s": tokens / max(wall + switch + control, 1e-12),
        "tokens": tokens,
        "rounds": len(rounds),
        "wall_s": wall,
        "switch_s": switch,
        "control_s": control,
        "control_overlap_s": overlapped,
        "capture_rounds": len(captured),
        "capture_s": sum(r.wall_s for r in captured),
        "capture_tokens": sum(r.tokens for r in captured),
        "steps_s": {
            k: float(np.mean([r.step_s.get(k, 0.0) for r in rounds]))
            for k in ("draft", "launch", "verify", "accept", "shadow")
        },
        "mean_accepted": float(np.mean([np.mean(r.accepted) for r in rounds])),
        "accepted_hist": accepted_histogram(m for r in rounds for m in r.accepted),
    }


def run_once(
    bench: Bench,
    strategy: Strategy,
    prompt: list[int],
    controller=None,
    record_stats: bool = False,
    seed: int = 0,
):
    """One ``generate`` call, with Python's garbage collector held off while it runs (as a
    benchmark harness does: a collection pause of tens of ms in a 50 ms run is noise, not the
    strategy)."""
    from engine.loop import Engine

    eng = Engine(
        bench.target,
        strategy,
        bench.decode(record_stats, seed),
        draft_runner=bench.draft,
        controller=controller,
    )
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        return eng.generate([prompt])
    finally:
        if enabled:
            gc.enable()


def captures_counted(run: dict) -> float:
    """A run's tokens/s with the rounds that captured a CUDA graph inside it put back
    (``steady_figures`` leaves them out; see the module): its tokens and theirs over its time
    and theirs. Runs cached before ``capture_tokens`` was recorded count those rounds' time
    only (a few tokens of a few hundred)."""
    time_s = run["tokens"] / run["tokens_per_s"] + run.get("capture_s", 0.0)
    return (run["tokens"] + run.get("capture_tokens", 0)) / time_s


def _median_run(runs: list[dict]) -> dict:
    """The run with the median tokens/s (its figures), with every run's tokens/s beside it."""
    tps = [r["tokens_per_s"] for r in runs]
    out = dict(runs[int(np.argsort(tps)[len(tps) // 2])])
    out["runs_tokens_per_s"] = tps
    out["tokens_per_s"] = float(np.median(tps))
    return out


def _decoded(run: dict) -> tuple:
    """What a run decoded, as far as its figures tell: tokens, rounds and switches (round and
    destination). Runs of one strategy, prompt and seed decode the same (sampling is seeded);
    an adaptive run's controller may still decide otherwise where a measured switch cost sits
    at a threshold."""
    # The rounds a run captured a graph in are left out of its steady figures, not out of
    # what it decoded: a pass that captured (the first after a sparse run dropped the graphs)
    # decoded the same as one that did not (run 31: 7 passes had been left out for that).
    return (
        run["tokens"] + run.get("capture_tokens", 0),
        run["rounds"] + run.get("capture_rounds", 0),
        tuple((w["round"], w["to"]) for w in run.get("switches", ())),
    )


def least_disturbed(passes: list[dict]) -> dict:
    """One run timed in several passes (``run_passes``): the pass with the least wall time
    (most tokens/s) among those that decoded what the first pass did (``_decoded``), with
    every pass's tokens/s and the number kept beside it. Interference from the rest of a
    shared machine only ever adds time to a decode whose work is fixed (on the H100,
    ``benchmarks/run_noise.py``: the same decode's round time rises by up to ~40% in slow
    stretches of the machine and never falls below a stable floor), so the least disturbed
    pass is the estimate of what the decode costs; keeping only passes that decoded the same
    keeps an adaptive run's luckier decisions out of it."""
    first = _decoded(passes[0])
    same = [r for r in passes if _decoded(r) == first]
    out = dict(max(same, key=lambda r: r["tokens_per_s"]))
    out["passes_tokens_per_s"] = [r["tokens_per_s"] for r in passes]
    out["passes_kept"] = len(same)
    return out


def interleave(groups: list[dict]) -> dict:
    """The jobs of ``groups`` (each one strategy's runs, in order) in one order that takes the
    i-th run of every group in turn, the groups' order rotated by one each turn (group i mod n
    first): so one strategy's runs lie spread over the whole pass instead of side by side. On
    the H100 host slow stretches last several seconds -- in run 31 the ten runs of one strategy
    in one pass (one after another, ~5 s) were slowed together, by up to 15%, and a strategy's
    figure moved with the stretches its blocks met (16K: the same decodes 7-14% apart between
    runs 30 and 31 for some strategies, 1% for others). Spread out, a stretch falls on a few
    runs of every strategy instead. A key in several groups keeps its first place."""
    lists = [list(g.items()) for g in groups]
    out: dict = {}
    for i in range(max(map(len, lists), default=0)):
        for j in range(len(lists)):
            items = lists[(i + j) % len(lists)]
            if i < len(items) and items[i][0] not in out:
                out[items[i][0]] = items[i][1]
    return out


def run_passes(bench: Bench, jobs: dict[str, tuple]) -> dict[str, dict]:
    """Run every job (``key -> (fn, args, kwargs)``, one run each) ``timing_passes`` times, a
    whole pass over the jobs after another -- so the passes of one run lie apart by the time a
    pass takes, longer than a slow stretch of the machine lasts -- and keep each job's least
    disturbed pass (``least_disturbed``; with one pass, its run as it is). Pass p > 0 caches
    under ``key|t<p>``."""
    passes: dict[str, list[dict]] = {k: [] for k in jobs}
    for p in range(bench.timing_passes):
        for key, (fn, args, kwargs) in jobs.items():
            passes[key].append(bench.run(key if p == 0 else f"{key}|t{p}", fn, *args, **kwargs))
    return {k: v[0] if len(v) == 1 else least_disturbed(v) for k, v in passes.items()}


def _measure_jobs(bench: Bench, strategy: Strategy, prompt: list[int], key: str) -> dict:
    """The jobs of ``measure``: run i with seed i."""
    sid = strategy_id(strategy)
    return {
        f"{key}|{sid}|{i}": (steady_run, (bench, strategy, prompt), {"seed": i})
        for i in range(bench.repeats)
    }


def measure(bench: Bench, strategy: Strategy, prompt: list[int], key: str) -> dict:
    """Median over ``repeats`` runs (each its own generate call, seed i; each the least
    disturbed of its ``timing_passes``) of the steady figures; ``key`` names the prompt for
    the run cache."""
    done = run_passes(bench, _measure_jobs(bench, strategy, prompt, key))
    return _median_run(list(done.values()))


def _prompts_jobs(
    bench: Bench,
    strategy: Strategy,
    prompts: dict[int, list[int]],
    key: str,
    runs: int | None = None,
) -> dict:
    """The jobs of ``measure_prompts``: ``runs`` (default ``repeats``) runs, run i on the i-th
    prompt (cyclically), seed i; the window each decodes is its key's third field from the
    end."""
    sid = strategy_id(strategy)
    windows = list(prompts)
    jobs = {}
    for i in range(bench.repeats if runs is None else runs):
        w = windows[i % len(windows)]
        jobs[f"{key}|{w}|{sid}|{i}"] = (steady_run, (bench, strategy, prompts[w]), {"seed": i})
    return jobs


def pooled_prompts(done: dict[str, dict], jobs: dict) -> dict:
    """``measure_prompts``' figures from the runs (``done``, by key) of its jobs."""
    runs = [{**done[k], "window": int(k.split("|")[-3])} for k in jobs]
    out = pooled_figures(runs)
    out["runs_tokens_per_s"] = [r["tokens_per_s"] for r in runs]
    out["runs_window"] = [r["window"] for r in runs]
    return out


def measure_prompts(
    bench: Bench, strategy: Strategy, prompts: dict[int, list[int]], key: str
) -> dict:
    """``repeats`` runs, run i on the i-th prompt (cyclically; ``prompts`` by corpus window)
    with seed i, each the least disturbed of its ``timing_passes``: the figures pooled over the
    runs -- tokens/s is their tokens over their time, what the model predicts (expected tokens
    over expected round time), not one prompt's or one seed's -- with every run's tokens/s and
    window beside them."""
    jobs = _prompts_jobs(bench, strategy, prompts, key)
    return pooled_prompts(run_passes(bench, jobs), jobs)


def pooled_figures(runs: list[dict]) -> dict:
    """Steady figures of several runs as one: sums of tokens, rounds and times, tokens/s over
    them, round-weighted mean step times and mean accepted drafts."""
    rounds = sum(r["rounds"] for r in runs)
    w = np.array([r["rounds"] for r in runs], dtype=float) / max(rounds, 1)
    sums = {k: float(sum(r[k] for r in runs)) for k in ("wall_s", "switch_s", "control_s")}
    tokens = int(sum(r["tokens"] for r in runs))
    steps = {
        k: float(sum(wi * r["steps_s"].get(k, 0.0) for wi, r in zip(w, runs, strict=True)))
        for k in runs[0]["steps_s"]
    }
    return {
        "tokens_per_s": tokens / max(sum(sums.values()), 1e-12),
        "tokens": tokens,
        "rounds": rounds,
        **sums,
        "steps_s": steps,
        "mean_accepted": float(sum(wi * r["mean_accepted"] for wi, r in zip(w, runs, strict=True))),
    }


def steady_run(
    bench: Bench, strategy: Strategy, prompt: list[int], seed: int = 0, keep_text: bool = False
) -> dict:
    """One run's steady figures; with ``keep_text``, the tokens it decoded too (``text``) and
    the CRC-32 of its prompt (``prompt_crc32``: the prompts come from the installed packages'
    sources, which differ between machines, so a walk of the text elsewhere checks it)."""
    result = run_once(bench, strategy, prompt, seed=seed)
    fig = steady_figures(result)
    if keep_text:
        fig["text"] = [int(t) for t in result.tokens[0]]
        fig["prompt_crc32"] = prompt_crc32(prompt)
    return fig


def prompt_crc32(prompt: list[int]) -> int:
    """CRC-32 of a byte-token prompt."""
    return zlib.crc32(bytes(prompt))


def adaptive_run(
    bench: Bench,
    strategy: Strategy,
    prompt: list[int],
    ranking: dict,
    profile: Profile,
    config: ControllerConfig,
    seed: int = 0,
    switch_cost_s: float = 0.0,
) -> dict:
    """One run under a fresh ``OnlineController`` starting from ``strategy`` (knowing
    ``switch_cost_s`` from earlier runs: one figure, or one per destination kind): its steady
    figures, the controller's switches and the switch costs it knows at the end."""
    ctl = OnlineController(
        ranking, bench.model, bench.gpu, profile, config, switch_cost_s=switch_cost_s
    )
    ctl.warm()  # before decoding, as a server scores its candidates before requests arrive
    result = run_once(bench, strategy, prompt, controller=ctl, seed=seed)
    return {
        **steady_figures(result),
        "switches": ctl.switches,
        "warm_s": result.warm_s,
        "shadow": shadow_summary(result),
        "switch_costs": ctl.switch_costs,
    }


def shadow_summary(result) -> dict:
    """Per drafter kind, the run's shadow estimate over all its rounds: positions scored, the
    tokens per round of each chain length it scores as its walk found them (``engine.ngram``:
    1 + accepted drafts per walked round; what the controller uses) and as the average over
    positions (``1 + E[min(m, K)]``, which overstates bursty text); the branching trees it
    walked, under their specs, as their walks found them."""
    out = {}
    for kind in {k for r in result.rounds for k in (r.shadow or {})}:
        rows = [r.shadow[kind] for r in result.rounds if r.shadow and kind in r.shadow]
        n = sum(x.positions for x in rows)
        matched = np.sum([x.matched for x in rows], axis=0)
        per_position = {
            f"chain:{k}": 1.0 + float(matched[:k].sum()) / n if n else None
            for k in range(1, len(matched) + 1)
        }
        tpr = dict(per_position)
        if all(x.rounds for x in rows):
            walked = np.sum([x.rounds for x in rows], axis=0)
            drafts = np.sum([x.drafts for x in rows], axis=0)
            tpr = {
                f"chain:{k}": 1.0 + float(drafts[k - 1]) / walked[k - 1] if walked[k - 1] else None
                for k in range(1, len(matched) + 1)
            }
        # Branching trees the shadow walked: 1 + accepted drafts per walked round.
        for spec in dict.fromkeys(t[0] for x in rows for t in getattr(x, "trees", ())):
            walked = [t for x in rows for t in x.trees if t[0] == spec]
            r, d = sum(t[1] for t in walked), sum(t[2] for t in walked)
            tpr[spec] = 1.0 + d / r if r else None
        out[kind] = {
            "positions": int(n),
            "tokens_per_round": tpr,
            "tokens_per_round_per_position": per_position,
        }
    return out


# ----------------------------------------------------------------------------- phases


# Windows of the code corpus, in prompt lengths, that the profile's prompts start at; the
# measured prompts (phase 3, ``MEASURE_OFFSETS``) and the adaptive one (phase 4, window 2) are
# others, which the profile must not see. Ten: with five, the sampling error of n-gram
# acceptance over the prompts (~0.3 tokens per round from one run to the next at 8K) put the
# n-gram chain:4 at 2.05 tokens per round in runs 18-21 on the H100, where the five measured
# prompts gave 1.84, and the ranking's best at 8K 5-6% behind the measured best.
PROFILE_OFFSETS = (0, 3, 4, 5, 6, 11, 12, 13, 14, 15)
# Dense runs (seeds) on the first profile prompt that the sparse-attention factors divide by.
FACTOR_SEEDS = 3
# Phase 3's prompt windows: run i of a measured strategy decodes window i with seed i, the
# first ``measure_texts`` of them that fit (``measure_windows``). Up to twenty: the strategies
# at the top of a regime are predicted within 1-7% of each other, and on five texts their
# measured order turned with the texts (run 25: at <=4K the n-gram tree(n=8,d=4) accepted 2.04
# tokens per round where chain:7 accepted 1.87 on the same five texts, 2.12 and 2.20 on the
# profile's ten); on ten, the measured ratio of two of the five predicted best still has a
# standard error of 1.8-3.7% (run 32, windows resampled; the median pair per regime) -- at 16K
# tree(n=32,d=6) over tree(n=16,d=5) 1.094 in tokens per round on the ten measured windows,
# 1.052 walked over 30 other prompts -- close to what a 5% regret target allows.
MEASURE_OFFSETS = (1, 7, 8, 9, 10, *range(16, 31))
# Windows past every measured one whose autoregressive texts only the n-gram walks read
# (``walk_ngram``, ``walk_windows``): the walks' error is the prompts' more than the texts' --
# n-gram acceptance moves with the prompt. Run 32's walks over its ten profile prompts and 20
# such windows more (session 19's projection, docs/notes/planner.md) put every n-gram tree's
# tokens per round 2.6-4.5% lower at <=4K, 0.8-1.4% at 8K and 2.0-3.1% at 16K than the ten
# alone did. One autoregressive decode per window, outside the overhead fit.
WALK_OFFSETS = tuple(range(31, 71))


def _log_wrapped(bench: Bench, what: str, offsets, ctx: int) -> None:
    """Log the windows of ``offsets`` whose prompt of ``ctx`` tokens runs past the code
    corpus's end (and so repeats its start)."""
    from engine.corpus import validation_bytes

    size = validation_bytes((max(offsets) + 1) * ctx)
    wrapped = [o for o in offsets if (o + 1) * ctx > size]
    if wrapped:
        bench.log(
            f"{what}: prompt windows {wrapped} run past the code corpus ({size} bytes) "
            "and repeat its start"
        )


def measure_windows(ctx: int, texts: int, available=None) -> tuple[int, ...]:
    """The first ``texts`` windows of ``MEASURE_OFFSETS`` whose prompt of ``ctx`` tokens ends
    inside the code corpus (``available(limit)``: its bytes up to ``limit``, default
    ``engine.corpus.validation_bytes``): a window past its end would repeat the corpus's start,
    where the profile's prompts are."""
    if not 1 <= texts <= len(MEASURE_OFFSETS):
        raise ValueError(f"measured texts must lie in 1..{len(MEASURE_OFFSETS)}, got {texts}")
    fit, size = _in_corpus(MEASURE_OFFSETS, ctx, available)
    if not fit:
        raise ValueError(
            f"no measured prompt window of {ctx} tokens fits in the code corpus ({size} bytes)"
        )
    return fit[:texts]


def walk_windows(ctx: int, prompts: int, available=None) -> tuple[int, ...]:
    """The first ``prompts`` windows of ``WALK_OFFSETS`` whose prompt of ``ctx`` tokens ends
    inside the code corpus (``available`` as in ``measure_windows``); fewer, or none, where the
    corpus is shorter."""
    if not 0 <= prompts <= len(WALK_OFFSETS):
        raise ValueError(f"walk prompts must lie in 0..{len(WALK_OFFSETS)}, got {prompts}")
    if not prompts:
        return ()
    return _in_corpus(WALK_OFFSETS, ctx, available)[0][:prompts]


def _in_corpus(offsets: tuple[int, ...], ctx: int, available) -> tuple[tuple[int, ...], int]:
    """The windows of ``offsets`` whose prompt of ``ctx`` tokens ends inside the code corpus,
    and the corpus's size (up to the last window's end)."""
    if available is None:
        from engine.corpus import validation_bytes as available
    size = available((max(offsets) + 1) * ctx)
    return tuple(o for o in offsets if (o + 1) * ctx <= size), size


def measure_profile(
    bench: Bench,
    contexts: dict[str, int],
    space: SpaceSpec,
    ref_tree: str = "chain:4",
    attention_tree: str = "best:16:6",
    prompts: int = 3,
    walk_prompts: int = 0,
) -> tuple[Profile, dict]:
    """The profile of the space's strategies, measured per regime on ``prompts`` code prompts
    (windows ``PROFILE_OFFSETS`` of the corpus; prompt j decodes with seed j):

    - alpha of every drafter kind on every chain of the space and ``ref_tree`` (dense), from
      its tokens per round pooled over the runs of that drafter's chains at least as long
      (``pooled_chain_tokens``: a k-chain accepts min(m, k) where a longer chain accepted m),
      then on every other tree of the space (``best:N`` resolved at the drafter's alpha on
      ``ref_tree``, as the ranking resolves it) from the mean tokens per round over the
      prompts (one prompt at temperature 1 leaves near-tied strategies in an order its draws
      set); the n-gram drafter's, on each of its trees, then replaced by its walks over the
      texts of every dense profile run of the regime and of one autoregressive run on each of
      ``walk_prompts`` further windows (``walk_windows``) (``walk_ngram``: every tree on the
      same texts instead of ten of its own, each prompt weighted alike);
    - the factor sparse attention puts on alpha, per drafter kind and attention key of the
      space's valid sparse strategies: the drafter on ``attention_tree``
      (large enough for every group size; resolved at its alpha) with that attention, over the
      same tree dense (mean of ``FACTOR_SEEDS`` seeds), on the first prompt -- per drafter,
      because sparse verification takes far more of an n-gram drafter's acceptance than of a
      draft model's (``planner.profile``); the profile holds each drafter's median over the
      keys (``"ngram@sparse"``), the keys' own figures go beside it;
    - gamma per traversal that a valid sparse strategy uses: a union C4 strategy on the
      reference drafter's (``ngram`` when in the space) ``attention_tree``, with selection
      statistics;
    - autoregressive decoding (when the space has ``chain:0``) on every prompt, for the
      overhead fit;
    - the loop overhead per round: ``fit_overhead`` on every run without statistics, the
      residual being the measured round wall time minus the step model's round time, each run
      weighted by 1 / its round time (relative error); each run's round time is its least
      disturbed of ``bench.timing_passes`` whole passes over the regime's runs.

    Returns the profile, the overhead fits' figures per regime, the factor each attention
    key's run measured per regime and drafter (the profile holds their median per drafter),
    and per regime and ``kind@chain`` its own and pooled tokens per round and the runs
    pooled."""
    acc: dict[str, dict[str, float]] = {}
    att: dict[str, dict[str, float]] = {}
    ovl: dict[str, dict[str, float]] = {}
    ovh: dict[str, dict[str, float]] = {}
    fits: dict[str, dict] = {}
    per_key: dict[str, dict[str, dict[str, float]]] = {}  # regime -> drafter -> key -> factor
    chain_tokens: dict[str, dict[str, dict]] = {}  # regime -> kind@chain -> own / pooled
    if not 1 <= prompts <= len(PROFILE_OFFSETS):
        raise ValueError(f"profile prompts must lie in 1..{len(PROFILE_OFFSETS)}, got {prompts}")
    ref_kind = "ngram" if "ngram" in space.drafters else space.drafters[0]
    for regime, ctx in contexts.items():
        texts = [prompt_tokens("code", ctx, offset=o * ctx) for o in PROFILE_OFFSETS[:prompts]]
        _log_wrapped(bench, f"profile {regime}", PROFILE_OFFSETS[:prompts], ctx)
        prompt = texts[0]
        runs: list[tuple[Strategy, dict]] = []
        # The steady runs' keys and calls, in the order they ran: the later timing passes.
        jobs: list[tuple[str, tuple]] = []
        prompts_of: list[list[int]] = []  # each steady run's prompt
        own_tpr: dict[str, float] = {}  # kind@tree -> its own runs' mean tokens per round
        first: dict[str, float] = {}  # tokens per round on the first prompt, per strategy id

        def steady(
            key: str,
            s: Strategy,
            tokens: list[int],
            seed: int = 0,
            runs=runs,
            jobs=jobs,
            prompts_of=prompts_of,
        ) -> dict:
            """A steady run of the profile (its text kept for the n-gram walks), kept for the
            overhead fit's timing passes."""
            fig = bench.run(key, steady_run, bench, s, tokens, seed=seed, keep_text=True)
            runs.append((s, fig))
            prompts_of.append(tokens)
            jobs.append((key, (steady_run, (bench, s, tokens), {"seed": seed})))
            return fig

        def go(s: Strategy, tag: str, fn=steady_run, ctx=ctx, prompt=prompt) -> dict:
            key = f"{tag}|{ctx}|{strategy_id(s)}"
            if fn is steady_run:
                return steady(key, s, prompt)
            return bench.run(key, fn, bench, s, prompt)

        hists: dict[str, list[tuple[int, list[int]]]] = {}  # kind -> (K, histogram) per run
        unpooled: set[str] = set()  # kinds with a chain run lacking its histogram

        def tokens(
            s: Strategy,
            ctx=ctx,
            texts=texts,
            first=first,
            hists=hists,
            unpooled=unpooled,
            own_tpr=own_tpr,
        ) -> float:
            """Mean tokens per round of ``s`` over the profile prompts (a chain's runs kept
            for ``pooled_chain_tokens``)."""
            figs = [go(s, "profile")]
            for j, text in enumerate(texts[1:], start=1):
                figs.append(steady(f"profile|{ctx}|p{j}|{strategy_id(s)}", s, text, seed=j))
            first[strategy_id(s)] = figs[0]["mean_accepted"] + 1.0
            k = chain_length(s.tree)
            if k and s.attention == "dense":
                for f in figs:
                    if "accepted_hist" in f:
                        hists.setdefault(s.drafter.kind, []).append((k, f["accepted_hist"]))
                    else:  # a figure cached before histograms were recorded
                        unpooled.add(s.drafter.kind)
            own_tpr[f"{s.drafter.kind}@{s.tree}"] = float(
                np.mean([f["mean_accepted"] for f in figs]) + 1.0
            )
            return own_tpr[f"{s.drafter.kind}@{s.tree}"]

        # Every drafter's chains first (the reference chain among them), then each chain's
        # tokens per round pooled over its drafter's chains at least as long
        # (``pooled_chain_tokens``): a chain of k drafts read from its own runs and the
        # longer chains' first k drafts.
        a: dict[str, float] = {}
        chains = [
            t
            for t in dict.fromkeys((ref_tree, *space.trees))
            if t == ref_tree or (t.startswith("chain:") and chain_length(t))
        ]
        for kind in space.drafters:
            own = {}
            for tree in chains:
                s = Strategy(name="profile", tree=tree, drafter=_drafter(bench, kind))
                if tree == ref_tree or bench.runnable(s) is None:
                    own[tree] = tokens(s)
            for tree, tpr in own.items():
                k = chain_length(tree)
                pooled = pooled_chain_tokens(hists.get(kind, []), k) if k else None
                n = sum(big >= k for big, _ in hists.get(kind, [])) if k else len(texts)
                # Without every run's histogram, the chain's own mean.
                use = tpr if pooled is None or kind in unpooled else pooled
                a[f"{kind}@{tree}"] = alpha_from_tokens(tree, use)
                chain_tokens.setdefault(regime, {})[f"{kind}@{tree}"] = {
                    "own": tpr,
                    "pooled": pooled,
                    "runs": n,
                    "used": use,
                }
                bench.log(
                    f"profile {regime} {kind} {tree}: {tpr:.2f} tokens/round, pooled "
                    f"{use:.2f} over {n} runs, alpha={a[f'{kind}@{tree}']:.3f} "
                    f"({len(texts)} prompts)"
                )
            a[kind] = a[f"{kind}@{ref_tree}"]
        for kind in space.drafters:
            for tree in space.trees:
                s = concrete(
                    Strategy(name="profile", tree=tree, drafter=_drafter(bench, kind)), a[kind]
                )
                if f"{kind}@{s.tree}" in a or bench.runnable(s) is not None:
                    continue
                if not parse_tree(s.tree):
                    # Autoregressive: no acceptance and no drafter; its runs on every prompt
                    # are what sets the overhead of a round apart from a drafting round's
                    # (``fit_overhead``). With one run, that run's draw moved autoregressive
                    # decoding's prediction at 32K by 9% between runs 26 and 27.
                    if kind == space.drafters[0]:
                        tokens(s)
                    continue
                tpr = tokens(s)
                a[f"{kind}@{s.tree}"] = alpha_from_tokens(s.tree, tpr)
                bench.log(
                    f"profile {regime} {kind} {describe(s)}: {tpr:.2f} tokens/round, "
                    f"alpha={a[f'{kind}@{s.tree}']:.3f}"
                )
        acc[regime] = a
        valid, _ = valid_strategies(space, bench.model, bench.gpu, ctx)
        keys: dict[str, Strategy] = {}
        for v in valid:
            k = attention_key(v)
            if k is not None and k not in keys:
                keys[k] = v
        bases = {}
        for kind in space.drafters:
            base = concrete(
                Strategy(name="profile", tree=attention_tree, drafter=_drafter(bench, kind)),
                a[kind],
            )
            if bench.runnable(base) is not None or not parse_tree(base.tree):
                continue
            bases[kind] = base
            if f"{kind}@{base.tree}" not in a:
                a[f"{kind}@{base.tree}"] = alpha_from_tokens(base.tree, tokens(base))
            if strategy_id(base) not in first:
                first[strategy_id(base)] = go(base, "profile")["mean_accepted"] + 1.0
            # The sparse runs below decode the first prompt: their factor is over the same
            # tree dense on that prompt, per drafter (profile.py says why it differs), with
            # seeds 0..FACTOR_SEEDS-1 -- one dense run is the denominator of every key's
            # factor, so its draw would move them all (n-gram: 0.4-0.6 at 16K, 1.2-1.5 at 32K
            # in run 11).
            dense = [first[strategy_id(base)]]
            for j in range(1, FACTOR_SEEDS):
                fig = steady(
                    f"attention-dense|{ctx}|s{j}|{strategy_id(base)}", base, prompt, seed=j
                )
                dense.append(fig["mean_accepted"] + 1.0)
            dense_alpha = alpha_from_tokens(base.tree, float(np.mean(dense)))
            factors = {}
            for k, v in keys.items():
                s = dataclasses.replace(
                    v, name="profile", drafter=base.drafter, tree=base.tree, traversal="bfs"
                )
                if bench.runnable(s) is not None or dense_alpha <= 0:
                    continue
                fig = go(s, "attention")
                sa = alpha_from_tokens(base.tree, fig["mean_accepted"] + 1.0)
                factors[k] = sa / dense_alpha
                bench.log(f"profile {regime} {kind}@{k}: alpha={sa:.3f} (dense {dense_alpha:.3f})")
            if factors:
                # One factor per drafter, the median over the keys: the keys' runs differ by
                # no more than their draws do (run 12: a draft model's 0.43-0.50 at 8K, with
                # one key 0.80 at <=4K), and one run's draw per key would rank the strategies
                # by their luck (the predicted best at <=4K took that 0.80: regret 60%).
                att.setdefault(regime, {})[f"{kind}@sparse"] = float(
                    np.median(list(factors.values()))
                )
                per_key.setdefault(regime, {})[kind] = factors
        # gamma of the traversals the valid sparse strategies use (NSA ones keep one).
        base = bases.get(ref_kind) or next(iter(bases.values()), None)
        used = {v.traversal for v in valid if v.is_sparse}
        for trav in (x for x in space.traversals if x in used and base is not None):
            s = dataclasses.replace(
                base, traversal=trav, attention="sparse", mode="union", group_size=4
            )
            v = go(s, "overlap", _overlap_run)["gamma"]
            if v is not None:
                ovl.setdefault(regime, {})[trav] = min(max(v, 0.0), 1.0)
                bench.log(f"profile {regime} {trav}: gamma={v:.3f}")
        if "ngram" in space.drafters:
            extra = walk_texts(bench, space, ctx, walk_prompts, regime)
            walk_ngram(bench, regime, a, runs, prompts_of, own_tpr, chain_tokens, extra)
        # The loop overhead: what the step model leaves out of the measured rounds, timed as
        # the measured runs are (``run_passes``): the regime's steady runs again in whole
        # passes, each run's round time its least disturbed pass. With one pass, the runs of
        # one strategy (its prompts one after another) shared a slow stretch of the host and
        # the fit's host terms took it up (run 30: the n-gram trees' profile rounds 20-24%
        # above their measured ones at <=4K).
        if bench.timing_passes > 1:
            passes = [[fig] for _, fig in runs]
            # The later passes go over the strategies' runs interleaved (``interleave``);
            # the first went strategy by strategy, as the acceptance needed them.
            groups: dict[str, dict] = {}
            for i, ((s, _), (key, job)) in enumerate(zip(runs, jobs, strict=True)):
                groups.setdefault(strategy_id(s), {})[i] = (key, job)
            order = interleave(list(groups.values()))
            for p in range(1, bench.timing_passes):
                for i, (key, (fn, args, kwargs)) in order.items():
                    passes[i].append(bench.run(f"{key}|t{p}", fn, *args, **kwargs))
            runs = [(s, least_disturbed(ps)) for (s, _), ps in zip(runs, passes, strict=True)]
            kept = [f["passes_kept"] for _, f in runs]
            fits_note = {"timing_passes": bench.timing_passes, "passes_kept_min": min(kept)}
        else:
            fits_note = {"timing_passes": 1}
        partial = Profile(acc, ovl, "partial", att)
        strategies = [s for s, _ in runs]
        scored, _ = score(bench.model, bench.gpu, strategies, ctx, partial, regime)
        model_s = {strategy_id(x.strategy): x.round_s for x in scored}
        measured = [f["wall_s"] / f["rounds"] for _, f in runs]
        residual = [m - model_s[strategy_id(s)] for m, (s, _) in zip(measured, runs, strict=True)]
        ovh[regime], fits[regime] = fit_overhead(strategies, residual, measured)
        fits[regime]["median_model_round_s"] = float(np.median(list(model_s.values())))
        fits[regime].update(fits_note)
        terms = ", ".join(f"{t}={c * 1e6:.1f}us" for t, c in ovh[regime].items())
        rms = fits[regime]["rms_s"] * 1e6
        bench.log(f"profile {regime} loop overhead: {terms} (rms {rms:.0f} us, {len(runs)} runs)")
    profile = Profile(acc, ovl, "measured:engine-code-prompts", att, ovh)
    return profile, fits, per_key, chain_tokens


def walk_texts(
    bench: Bench, space: SpaceSpec, ctx: int, prompts: int, regime: str
) -> list[tuple[list[int], list[int]]]:
    """(prompt, text) of one autoregressive run (seed: the window) on each of the first
    ``prompts`` windows of ``walk_windows`` at ``ctx``, for ``walk_ngram``."""
    windows = walk_windows(ctx, prompts)
    if len(windows) < prompts:
        bench.log(
            f"profile {regime}: {len(windows)} of {prompts} walk prompts fit in the "
            f"corpus at {ctx} tokens"
        )
    ar = Strategy(name="walk", tree="chain:0", drafter=_drafter(bench, space.drafters[0]))
    out = []
    for o in windows:
        prompt = prompt_tokens("code", ctx, offset=o * ctx)
        fig = bench.run(
            f"walk|{ctx}|w{o}|{strategy_id(ar)}",
            steady_run,
            bench,
            ar,
            prompt,
            seed=o,
            keep_text=True,
        )
        _same_prompt(fig, prompt, f"walk|{ctx}|w{o}")
        out.append((prompt, fig["text"]))
    return out


def _same_prompt(fig: dict, prompt: list[int], where: str) -> None:
    """Raise when a kept text was decoded after another prompt than ``prompt`` (a run cache
    from a machine whose package sources, the code corpus, differ); runs cached before the
    check kept no CRC and pass."""
    crc = fig.get("prompt_crc32")
    if crc is not None and crc != prompt_crc32(prompt):
        raise ValueError(
            f"run {where!r} decoded another prompt than this machine's corpus "
            "gives (its package sources differ): walk it where it ran"
        )


def walk_ngram(
    bench: Bench,
    regime: str,
    a: dict[str, float],
    runs: list[tuple[Strategy, dict]],
    prompts: list[list[int]],
    own: dict[str, float],
    record: dict,
    extra: list[tuple[list[int], list[int]]] = (),
) -> None:
    """Set the n-gram drafter's acceptance on each of its trees in ``a`` (``ngram@<tree>``,
    chains and branching trees) from its walks (``engine.ngram.walk_text``) over the texts of
    every dense profile run of the regime (``runs``, with their ``prompts``), whatever decoded
    them, and the (prompt, text) pairs of ``extra`` (``walk_texts``): accepted drafts over
    rounds, summed over the texts of each prompt over their number, then over the prompts --
    each prompt weighs alike, however many runs decoded it (the profile's first prompt has its
    attention runs' dense seeds too; a walk prompt one text). Each tree's own runs decode ten
    texts of their own, and at temperature 1 a text's draw moves a tree's tokens per round by
    more than the trees differ: in run 31 the n-gram chain:7 accepted 2.20 tokens a round on
    the profile's prompts and 1.87 on the measured ones, while in another process on the H100
    the same prompts and seeds wrote texts on which it accepted 2.07
    (``docs/notes/planner-h100/session18/order_check.py``); ranked first at <=4K on 2.20, it
    measured last of the five dense n-gram strategies (regret 14.6%). Walked over the same
    ~140 texts, every tree sees the same draws, so their order is the texts' and not their
    luck. Unbiased for the same reason the shadow is (``engine.ngram``): every text is the
    target's own samples. The drafter's reference alpha ``a["ngram"]`` stays its own runs'
    (the ``best:N`` trees were resolved at it, as the ranking resolves them). ``own``: each
    tree's own runs' tokens per round; ``record`` (per regime and key) gets both figures."""
    from engine.ngram import walk_text

    keys = [k for k in a if k.startswith("ngram@") and parse_tree(k.split("@", 1)[1])]
    specs = tuple(k.split("@", 1)[1] for k in keys)
    if not specs:
        return
    pairs = []
    for i, ((s, fig), prompt) in enumerate(zip(runs, prompts, strict=True)):
        # sparse attention writes another distribution; old caches kept no text
        if s.attention == "dense" and "text" in fig:
            _same_prompt(fig, prompt, f"profile run {i} of {regime}")
            pairs.append((prompt, fig["text"]))
    pairs += list(extra)
    if not pairs:
        return
    by_prompt: dict[bytes, dict[str, np.ndarray]] = {}  # prompt -> spec -> [rounds, drafts, texts]
    max_n = bench.decode().ngram_max_n
    for prompt, text in pairs:
        sums = by_prompt.setdefault(bytes(prompt), {sp: np.zeros(3) for sp in specs})
        for sp, (r, d) in walk_text(prompt, text, specs, max_n).items():
            sums[sp] += (r, d, 1)
    for k, sp in zip(keys, specs, strict=True):
        rounds = sum(v[sp][0] / v[sp][2] for v in by_prompt.values())
        drafts = sum(v[sp][1] / v[sp][2] for v in by_prompt.values())
        if not rounds:
            continue
        tpr = 1.0 + drafts / rounds
        a[k] = alpha_from_tokens(sp, tpr)
        entry = record.setdefault(regime, {}).setdefault(k, {"own": own.get(k)})
        entry.update(
            {
                "walked": tpr,
                "walked_texts": len(pairs),
                "walked_prompts": len(by_prompt),
                "used": tpr,
            }
        )
        bench.log(
            f"profile {regime} {k}: walked {tpr:.2f} tokens/round over {len(pairs)} texts "
            f"of {len(by_prompt)} prompts (own runs {own.get(k, float('nan')):.2f}), "
            f"alpha={a[k]:.3f}"
        )


def _overlap_run(bench: Bench, s: Strategy, prompt: list[int]) -> dict:
    """A run with selection statistics: its steady figures and the mean group overlap (None
    when there are no statistics)."""
    result = run_once(bench, s, prompt, record_stats=True)
    fig = steady_figures(result)
    g = [r.selection.group_overlap for r in result.rounds if r.selection is not None]
    if not g:
        return {**fig, "gamma": None}
    v = float(np.nanmean(np.concatenate([x.ravel() for x in g])))
    return {**fig, "gamma": None if math.isnan(v) else v}


def _drafter(bench: Bench, kind: str) -> DrafterSpec:
    return DrafterSpec(kind=kind, model=bench.draft_label if kind == "draft_model" else None)


def pick(ranking: list[dict], n: int, ok, top: int = 4) -> list[dict]:
    """The first ``top`` runnable entries, then runnable ranks spread evenly over the rest:
    ``n`` entries in all (fewer when fewer are runnable)."""
    runnable = [r for r in ranking if ok(strategy_from_json(r["strategy"]))]
    if len(runnable) <= n:
        return runnable
    head = runnable[: min(top, n)]  # n < top: the first n (run 30's smoke asked for 2)
    rest = runnable[len(head) :]
    k = n - len(head)
    idx = np.unique(np.round(np.linspace(0, len(rest) - 1, k)).astype(int))
    return head + [rest[i] for i in idx]


def ranking_quality(predicted: list[float], measured: list[float]) -> dict:
    """Kendall tau-b, its p-value, and the regret of the predicted best."""
    tau = kendalltau(predicted, measured)
    best_pred = int(np.argmax(predicted))
    return {
        "kendall_tau": float(tau.statistic),
        "tau_p_value": float(tau.pvalue),
        "regret": 1.0 - measured[best_pred] / max(measured),
        "n": len(measured),
    }


def measurement_resolution(
    rows: list[dict], top: int = 5, draws: int = 2000, seed: int = 0
) -> dict | None:
    """How finely a regime's measurement orders its strategies (``rows``: the regime's
    ``strategies`` entries). Every measured strategy decodes the same windows with the same
    seeds, so the window is the unit of sampling: ``draws`` resamples of the windows, jointly,
    each strategy pooled over them (the harmonic mean of its runs' tokens/s: its runs' tokens
    are equal to within 1%). Returns the standard error of the log ratio of two of the ``top``
    strategies predicted best (the median over their pairs), and the regret (mean, p90) of a
    predictor that ranked by one such draw -- one that saw another sample of the same prompts,
    timed exactly -- against the measured figures: the regret a measurement this coarse leaves
    a perfect predictor. None when the rows lack their runs per window (evaluations before
    ``runs_window`` was recorded) or decoded different windows."""
    ms = [r["measured"] for r in rows]
    if len(ms) < 2 or any("runs_window" not in m or "runs_tokens_per_s" not in m for m in ms):
        return None
    if len({tuple(m["runs_window"]) for m in ms}) != 1:
        return None
    runs = np.array([m["runs_tokens_per_s"] for m in ms], dtype=float)  # [strategy, window]
    k = runs.shape[1]
    truth = np.array([m["tokens_per_s"] for m in ms], dtype=float)
    best = np.argsort([-r["predicted_tokens_per_s"] for r in rows], kind="stable")[:top]
    pairs = np.array([(i, j) for n, i in enumerate(best) for j in best[n + 1 :]])
    idx = np.random.default_rng(seed).integers(0, k, (draws, k))
    pooled = k / np.sum(1.0 / runs[:, idx], axis=2)  # [strategy, draw]
    ratio = np.log(pooled[pairs[:, 0]] / pooled[pairs[:, 1]])  # [pair, draw]
    regret = 1.0 - truth[np.argmax(pooled, axis=0)] / truth.max()
    return {
        "windows": k,
        "draws": draws,
        "pair_ratio_se": float(np.median(ratio.std(axis=1))),
        "draw_regret_mean": float(regret.mean()),
        "draw_regret_p90": float(np.percentile(regret, 90)),
    }


def adaptive_resolution(row: dict, draws: int = 4000, seed: int = 0) -> dict | None:
    """How finely a prompt set's adaptive figures are measured (``row``: an entry of the
    adaptive evaluation's ``prompt_sets``). Repeat i of the offline best, the controller and
    every oracle strategy decodes the same prompt with seed i, so the seed is the unit of
    sampling: ``draws`` resamples of the seeds, jointly, each figure recomputed as recorded
    (the ratio of medians). Returns the gain (as recorded: ``adaptive_gain``), the gain of each
    paired run (the controller's run over the offline best's of the same seed), the 5th and
    95th percentiles of the gain over the draws, and with the oracle's runs the
    ``challenger``: the best fixed strategy other than the offline best, its gain over it as
    recorded and the same percentiles (chosen once; chosen again on every draw, the maximum of
    a dozen noisy medians would only say how noisy they are). The ceiling is the challenger's
    gain where positive. ``hindsight`` takes, for each seed, the fastest of the offline best
    and every oracle strategy on that seed, picked after the fact: the most a controller could
    gain by running one fixed strategy of them per prompt (more, in fact: a maximum over a
    dozen noisy runs leans high); switching inside a run is not bound by it. With five
    repeats the intervals are coarse: read a target against them, not against the point
    figure alone. None when the runs per seed were not kept or do not pair up."""
    best = row.get("offline_best", {}).get("runs_tokens_per_s")
    runs = row.get("adaptive", {}).get("runs")
    if not best or not runs or len(runs) != len(best) or len(best) < 2:
        return None
    b = np.asarray(best, dtype=float)
    a = np.array([r["tokens_per_s"] for r in runs], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(b), (draws, len(b)))
    base = np.median(b[idx], axis=1)
    gain = np.median(a[idx], axis=1) / base - 1.0
    out = {
        "seeds": len(b),
        "draws": draws,
        "gain": float(np.median(a) / np.median(b) - 1.0),
        "paired_gains": (a / b - 1.0).tolist(),
        "gain_p05": float(np.percentile(gain, 5)),
        "gain_p95": float(np.percentile(gain, 95)),
    }
    others = [
        x
        for x in (row.get("oracle") or {}).get("strategies", [])
        if x["id"] != row["offline_best"].get("id")
        and len(x.get("runs_tokens_per_s") or ()) == len(b)
    ]
    if others:
        top = max(others, key=lambda x: x["tokens_per_s"])
        drawn = np.median(np.asarray(top["runs_tokens_per_s"], dtype=float)[idx], axis=1)
        lo, hi = np.percentile(drawn / base - 1.0, [5, 95])
        out["challenger"] = {
            "id": top["id"],
            "describe": top["describe"],
            "gain": top["tokens_per_s"] / row["offline_best"]["tokens_per_s"] - 1,
            "gain_p05": float(lo),
            "gain_p95": float(hi),
        }
        fastest = np.max(
            [b, *(np.asarray(x["runs_tokens_per_s"], dtype=float) for x in others)], axis=0
        )
        out["hindsight"] = {
            "strategies": len(others) + 1,
            "gain": float(np.median(fastest) / np.median(b) - 1.0),
            "paired_gains": (fastest / b - 1.0).tolist(),
        }
    return out


def set_resolution(row: dict) -> dict | None:
    """A prompt set's recorded adaptive ``resolution``, or one derived from its runs per seed
    for evaluations made before it was recorded (``adaptive_resolution``)."""
    return row.get("resolution") or adaptive_resolution(row)


def regime_resolution(regime: dict) -> dict | None:
    """A regime entry's recorded ``measurement``, or one derived from its runs per window for
    evaluations made before it was recorded (``measurement_resolution``)."""
    return regime.get("measurement") or measurement_resolution(regime["strategies"])


def evaluate_regime(
    bench: Bench, ranking: dict, regime: str, ctx: int, profile: Profile, per_regime: int
) -> dict:
    entry = ranking["regimes"][regime]
    chosen = pick(entry["ranking"], per_regime, lambda s: bench.runnable(s) is None)
    strategies = [strategy_from_json(r["strategy"]) for r in chosen]
    scored, prov = score(bench.model, bench.gpu, strategies, ctx, profile, regime)
    pred = {strategy_id(x.strategy): x for x in scored}
    rank_of = {r["id"]: i for i, r in enumerate(entry["ranking"])}
    windows = measure_windows(ctx, bench.measure_texts)
    if len(windows) < bench.measure_texts:
        bench.log(
            f"{regime} measured on {len(windows)} code prompts: only those fit in the "
            f"corpus at {ctx} tokens"
        )
    prompts = {o: prompt_tokens("code", ctx, offset=o * ctx) for o in windows}
    jobs = {
        strategy_id(s): _prompts_jobs(bench, s, prompts, f"measure|code|{ctx}", runs=len(windows))
        for s in strategies
    }
    t0 = time.perf_counter()
    # All strategies' runs in one set of passes, interleaved: a run's passes lie a whole pass
    # apart, and one strategy's runs of a pass are spread over it (``interleave``).
    done = run_passes(bench, interleave(list(jobs.values())))
    bench.log(
        f"{regime} measured {len(strategies)} strategies x {len(windows)} runs x "
        f"{bench.timing_passes} passes ({time.perf_counter() - t0:.1f}s)"
    )
    rows = []
    for s in strategies:
        sid = strategy_id(s)
        m = pooled_prompts(done, jobs[sid])
        p = pred[sid]
        rows.append(
            {
                "id": sid,
                "describe": describe(s),
                "offline_rank": rank_of[sid],
                "predicted_tokens_per_s": p.tokens_per_s,
                "predicted_tokens_per_round": p.tokens_per_round,
                "extrapolated": p.extrapolated,
                "measured": m,
            }
        )
        bench.log(
            f"{regime} #{rank_of[sid]:4d} pred {p.tokens_per_s:9.1f} meas "
            f"{m['tokens_per_s']:9.1f} tok/s {describe(s)}"
        )
    q = ranking_quality(
        [r["predicted_tokens_per_s"] for r in rows], [r["measured"]["tokens_per_s"] for r in rows]
    )
    return {
        "context_len": ctx,
        "provenance": prov,
        "space_size": entry["num_valid"],
        "measure_windows": list(windows),
        **q,
        "measurement": measurement_resolution(rows),
        "strategies": rows,
    }


def oracle_strategies(ranking: dict, regime: str, ok) -> list[Strategy]:
    """The fixed strategies a per-prompt-set oracle picks among: the best-ranked strategy of
    each (drafter kind, tree) of the regime's ranking that ``ok`` accepts, autoregressive
    decoding once (it drafts nothing, so its drafter does not matter) -- the choices the
    controller re-scores (``OnlineController._candidates``), at their best attention."""
    out, seen = [], set()
    for r in ranking["regimes"][regime]["ranking"]:
        s = strategy_from_json(r["strategy"])
        key = (s.drafter.kind, s.tree) if parse_tree(s.tree) else ("", "chain:0")
        if key not in seen and ok(s):
            seen.add(key)
            out.append(s)
    return out


def evaluate_adaptive(
    bench: Bench,
    ranking: dict,
    profile: Profile,
    ctx: int,
    prompt_sets: tuple[str, ...],
    config: ControllerConfig,
    oracle: bool = True,
) -> dict:
    """Per prompt set: a fixed default, the fixed offline best and the controller (median of
    ``repeats`` paired runs each); with ``oracle``, also every strategy of
    ``oracle_strategies`` fixed on the same prompt and seeds: the best of them bounds what any
    choice of one fixed strategy per prompt set gains over the offline best (``ceiling``)."""
    regime = regime_of(ctx)
    best = strategy_from_json(ranking["regimes"][regime]["ranking"][0]["strategy"])
    default = dataclasses.replace(Strategy.from_name("ssv"), drafter=_drafter(bench, "draft_model"))
    if bench.runnable(default) is not None:
        default = dataclasses.replace(default, drafter=_drafter(bench, "ngram"))
    out = {}
    ok = lambda s: bench.runnable(s) is None  # noqa: E731
    oracles = oracle_strategies(ranking, regime, ok) if oracle else []
    for kind in prompt_sets:
        prompt = prompt_tokens(kind, ctx, offset=2 * ctx)
        key = f"adapt|{kind}|{ctx}|{2 * ctx}"
        bid = strategy_id(best)
        adapt = (adaptive_run, bench, best, prompt, ranking, profile, config)
        cold = bench.run(f"{key}|cold|{bid}", *adapt, seed=bench.repeats)
        # What the switches cost (host time: installing the strategy, catching a drafter up)
        # is known to the timed runs' controllers per destination kind, as a server knows it
        # from earlier requests: the cold run's figures hold first-time compilation, so a
        # second run, told them, measures again where it switches.
        warm = bench.run(
            f"{key}|warm|{bid}", *adapt, seed=bench.repeats + 1, switch_cost_s=_costs(cold)
        )
        known_cost = {**_costs(cold), **_costs(warm, measured_only=True)}
        # The timed runs, each pass over all of them (``run_passes``), interleaved seed by
        # seed (``interleave``): the default, the offline best, the controller and the
        # oracle's strategies (the offline best's runs among them are the same jobs, not run
        # again), so a drift of the machine falls on every one alike; all runs of repeat i
        # draw with seed i.
        fixed, adaptive_jobs = {}, {}
        for i in range(bench.repeats):
            fixed[f"{key}|{bid}|{i}"] = (steady_run, (bench, best, prompt), {"seed": i})
            adaptive_jobs[f"{key}|adaptive|{bid}|{i}"] = (
                adapt[0],
                adapt[1:],
                {"seed": i, "switch_cost_s": known_cost},
            )
        fixed_keys, adaptive_keys = list(fixed), list(adaptive_jobs)
        oracle_jobs = {strategy_id(s): _measure_jobs(bench, s, prompt, key) for s in oracles}
        default_jobs = _measure_jobs(bench, default, prompt, key)
        groups = [default_jobs, fixed, adaptive_jobs, *oracle_jobs.values()]
        done = run_passes(bench, interleave(groups))
        row = {"default": _median_run([done[k] for k in default_jobs])}
        row["default"]["id"] = strategy_id(default)
        runs = [done[k] for k in adaptive_keys]
        row["offline_best"] = _median_run([done[k] for k in fixed_keys])
        row["offline_best"]["id"] = strategy_id(best)
        adaptive = _median_run(runs)
        adaptive["cold"] = {
            "tokens_per_s": cold["tokens_per_s"],
            "switch_s": cold["switch_s"],
            "switches": cold["switches"],
        }
        adaptive["warm"] = {
            "tokens_per_s": warm["tokens_per_s"],
            "switch_s": warm["switch_s"],
            "switches": warm["switches"],
        }
        keep = (
            "tokens_per_s",
            "switches",
            "switch_s",
            "control_s",
            "control_overlap_s",
            "warm_s",
            "shadow",
            "capture_rounds",
            "capture_s",
            "capture_tokens",
            "tokens",
        )
        if bench.timing_passes > 1:
            keep = (*keep, "passes_tokens_per_s", "passes_kept")
        adaptive["runs"] = [{k: r[k] for k in keep if k in r} for r in runs]
        adaptive["known_switch_cost_s"] = known_cost
        row["adaptive"] = adaptive
        row["adaptive_gain"] = adaptive["tokens_per_s"] / row["offline_best"]["tokens_per_s"] - 1
        # The same gain with the in-run capture rounds counted, both sides (reported, not the
        # target's figure: a server captures before requests arrive).
        row["adaptive_gain_captures_counted"] = float(
            np.median([captures_counted(r) for r in runs])
            / np.median([captures_counted(done[k]) for k in fixed_keys])
            - 1
        )
        # Without a switch the adaptive run decodes what the offline best does: its "gain" is
        # the spread of the measurement, and says so.
        row["switched"] = bool(adaptive["switches"])
        if oracle:
            # Same keys as the offline best's runs (``measure``): those are not run again.
            fixed_all = []
            for s in oracles:
                m = _median_run([done[k] for k in oracle_jobs[strategy_id(s)]])
                fixed_all.append(
                    {
                        "id": strategy_id(s),
                        "describe": describe(s),
                        "tokens_per_s": m["tokens_per_s"],
                        "runs_tokens_per_s": m["runs_tokens_per_s"],
                        "mean_accepted": m["mean_accepted"],
                    }
                )
            top = max(fixed_all, key=lambda x: x["tokens_per_s"])
            row["oracle"] = {
                "best": top["id"],
                "describe": top["describe"],
                "tokens_per_s": top["tokens_per_s"],
                "ceiling": top["tokens_per_s"] / row["offline_best"]["tokens_per_s"] - 1,
                "strategies": fixed_all,
            }
        row["resolution"] = adaptive_resolution(row)
        bench.log(
            f"adapt {kind:10s} default {row['default']['tokens_per_s']:8.1f} best "
            f"{row['offline_best']['tokens_per_s']:8.1f} adaptive "
            f"{adaptive['tokens_per_s']:8.1f} tok/s ({len(adaptive['switches'])} switches"
            f"{''.join(' ' + x['reason'] for x in adaptive['switches'])},"
            f" gain {row['adaptive_gain']:+.1%}, captures counted "
            f"{row['adaptive_gain_captures_counted']:+.1%})"
        )
        if oracle:
            o = row["oracle"]
            bench.log(
                f"oracle {kind:10s} best fixed {o['tokens_per_s']:8.1f} tok/s "
                f"({o['ceiling']:+.1%} over the offline best): {o['describe']}"
            )
        out[kind] = row
    return {
        "context_len": ctx,
        "regime": regime,
        "controller": dataclasses.asdict(config),
        "prompt_sets": out,
    }


def _costs(run: dict, measured_only: bool = False) -> dict[str, float]:
    """The switch costs per destination kind an adaptive run knew at its end (``default``: the
    figure it was given for kinds it had not measured, left out with ``measured_only``)."""
    costs = run.get("switch_costs", {})
    return {k: v for k, v in costs.items() if not (measured_only and k == "default")}


def evaluate(
    bench: Bench,
    contexts: dict[str, int],
    space: SpaceSpec,
    *,
    per_regime: int = 12,
    adaptive_context: int | None = None,
    prompt_sets: tuple[str, ...] = PROMPT_SETS,
    ref_tree: str = "chain:4",
    attention_tree: str = "best:16:6",
    profile_prompts: int = 3,
    walk_prompts: int = 0,
    controller: ControllerConfig | None = None,
    provenance: dict | None = None,
    oracle: bool = True,
) -> tuple[dict, dict]:
    """The evaluation document and the full ranking it used."""
    t0 = time.perf_counter()
    profile, overhead_fits, per_key, chain_tokens = measure_profile(
        bench, contexts, space, ref_tree, attention_tree, profile_prompts, walk_prompts
    )
    ranking = rank(bench.model, bench.gpu, space, profile, regimes=contexts)
    regimes = {
        r: evaluate_regime(bench, ranking, r, ctx, profile, per_regime)
        for r, ctx in contexts.items()
    }
    actx = adaptive_context or max(contexts.values())
    if regime_of(actx) not in ranking["regimes"]:
        raise ValueError(f"adaptive context {actx} falls in regime {regime_of(actx)}, not ranked")
    adaptive = evaluate_adaptive(
        bench, ranking, profile, actx, prompt_sets, controller or ControllerConfig(), oracle
    )
    gains = {k: v["adaptive_gain"] for k, v in adaptive["prompt_sets"].items()}
    off = [gains[k] for k in OFF_DISTRIBUTION if k in gains]
    sets = adaptive["prompt_sets"]
    ceiling = {k: v["oracle"]["ceiling"] for k, v in sets.items()} if oracle else None
    doc = {
        "version": EVAL_VERSION,
        "provenance": {**(provenance or {}), "wall_s": time.perf_counter() - t0},
        "model": bench.model.name,
        "draft_model": bench.draft_label,
        "gpu_model": bench.gpu.name,
        "max_new_tokens": bench.max_new_tokens,
        "temperature": bench.temperature,
        "repeats": bench.repeats,
        "measure_texts": bench.measure_texts,
        "timing_passes": bench.timing_passes,
        "profile": profile.to_json(),
        "profile_reference_tree": ref_tree,
        "profile_attention_tree": attention_tree,
        "profile_prompts": profile_prompts,
        "profile_walk_prompts": walk_prompts,
        # The profile's steady runs' timing passes (``measure_profile``; run 30 and earlier: one).
        "profile_timing_passes": bench.timing_passes,
        "profile_overhead_fits": overhead_fits,
        "profile_attention_factor_per_key": per_key,
        "profile_chain_tokens": chain_tokens,
        "space": dataclasses.asdict(space),
        "kendall_tau": {r: v["kendall_tau"] for r, v in regimes.items()},
        "regret": {r: v["regret"] for r, v in regimes.items()},
        "adaptive_gain": gains,
        "adaptive_gain_off_distribution_mean": float(np.mean(off)) if off else None,
        # The gains with the rounds that captured a CUDA graph inside a run counted.
        "adaptive_gain_captures_counted": {
            k: v["adaptive_gain_captures_counted"] for k, v in sets.items()
        },
        # The best fixed strategy per prompt set over the offline best: what a controller
        # that picked the right fixed strategy from the first round would gain.
        "adaptive_ceiling": ceiling,
        "targets": TARGETS,
        "met": {
            "kendall_tau": all(
                v["kendall_tau"] >= TARGETS["kendall_tau_min"] for v in regimes.values()
            ),
            "regret": all(v["regret"] <= TARGETS["regret_max"] for v in regimes.values()),
            "adaptive_gain_off_distribution": bool(off)
            and all(g >= TARGETS["adaptive_gain_min"] for g in off),
        },
        "regimes": regimes,
        "adaptive": adaptive,
    }
    return doc, ranking


def summary_table(doc: dict) -> str:
    lines = ["regime   ctx     n  kendall_tau  p_value  regret  pair s.e.  draw regret p90"]
    for r, v in doc["regimes"].items():
        m = regime_resolution(v)
        res = f"  {m['pair_ratio_se']:9.1%}  {m['draw_regret_p90']:15.1%}" if m else ""
        lines.append(
            f"{r:7s} {v['context_len']:6d} {v['n']:3d}  {v['kendall_tau']:11.3f}  "
            f"{v['tau_p_value']:7.3f}  {v['regret']:6.1%}{res}"
        )
    a = doc["adaptive"]
    lines.append(f"\nadaptive at {a['context_len']} ({a['regime']}): tokens/s")
    lines.append(
        "prompts      default  offline_best  adaptive  switches  gain   gain 90%"
        "         best fixed  ceiling  hindsight"
    )
    for k, v in a["prompt_sets"].items():
        o = v.get("oracle")
        m = set_resolution(v)
        band = f"{m['gain_p05']:+6.1%}..{m['gain_p95']:+6.1%}" if m else " " * 16
        tail = f" {o['tokens_per_s']:11.1f} {o['ceiling']:+8.1%}" if o else ""
        if m and m.get("hindsight"):
            tail += f" {m['hindsight']['gain']:+10.1%}"
        lines.append(
            f"{k:10s} {v['default']['tokens_per_s']:9.1f} "
            f"{v['offline_best']['tokens_per_s']:13.1f} "
            f"{v['adaptive']['tokens_per_s']:9.1f} {len(v['adaptive']['switches']):9d} "
            f"{v['adaptive_gain']:+6.1%}  {band}{tail}"
        )
    lines.append(f"met: {doc['met']}")
    return "\n".join(lines)
