"""Decoding the campaign at scale's cells (``validation.scale_campaign``): the runners, one cell's
measured figures beside perfmodel's prediction, and the rows of a shard.

A group's cells decode on one runner (the model stays loaded across its groups), so the first
prefills and the others reuse that prefill (``engine.runner.ModelRunner.prefill``), the oracle's
reference passes included; each row says whether its decode ran a prefill and the measured
seconds of the one whose KV it read.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import time
import zlib

from ssvkit.perfmodel.elementwise import elementwise_of_backend
from ssvkit.perfmodel.strategy import BASELINES, Strategy
from ssvkit.validation import full_batch
from ssvkit.validation.bench import RunCache, collection_held, steady_figures
from ssvkit.validation.records import run_schedule
from ssvkit.validation.scale_cells import (
    AUTOREGRESSIVE,
    Cell,
    Setup,
    backend_of,
    cache_positions,
    cell_strategy,
    fitted_context,
    groups_of,
    memory_plan,
    run_order,
)


class Runners:
    """The loaded model and the runner of the current (batch, cache positions), replaced when
    the next cell needs another; the model stays loaded across its cells."""

    def __init__(self, st: Setup) -> None:
        self.st = st
        self.key = None
        self.model = None
        self.runner = None

    def get(self, model: str, batch: int, t_max: int):
        import torch
        from ssvkit.engine.checkpoint import build_model, resolve_source
        from ssvkit.engine.runner import ModelRunner

        st = self.st
        if self.key is None or self.key[0] != model:
            self.model = self.runner = None
            _release(st.device)
            src = resolve_source(model)
            longest = max(fitted_context(st, model, c) for c in st.contexts)
            self.model = build_model(
                src, max_positions=cache_positions(st, longest), device=st.device, dtype=st.dtype
            )
        if self.key != (model, batch, t_max):
            self.runner = None
            _release(st.device)
            self.runner = ModelRunner(
                self.model,
                batch=batch,
                t_max=t_max,
                backend=backend_of(st.device),
                use_graphs=st.device == "cuda",
            )
            self.key = (model, batch, t_max)
        self.runner.graphs.clear()  # a cell's graphs, not the last cell's, hold memory
        torch.manual_seed(0)
        return self.runner


def _release(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def prompts_for(context: int, batch: int, vocab: int) -> list[list[int]]:
    """Code prompts, one window of the built-in corpus per sequence."""
    from ssvkit.validation.prompts import prompt_tokens

    return [
        [t % vocab for t in prompt_tokens("code", context, offset=b * context)]
        for b in range(batch)
    ]


def measure_cell(st: Setup, runners: Runners, cell: Cell, strategy: Strategy, plan) -> dict:
    """One cell decoded: its steady figures and those of its full-batch rounds
    (``validation.full_batch``), acceptance, selection overlap, prediction (at the full-batch
    rounds' acceptance), rounds' trace and prefill (reused or run, and the measured seconds of
    the one it read)."""
    from ssvkit.engine.loop import Engine
    from ssvkit.engine.settings import DecodeConfig
    from ssvkit.engine.strategy_check import check_strategy
    from ssvkit.validation.decode_figures import fit_acceptance, mean_selection

    runner = runners.get(cell.model, cell.batch, plan.t_max)
    tree, _ = check_strategy(strategy, runner.config, None, runner.backend)
    oracle = (cell.acceptance,) if tree.num_drafts else None
    decode = DecodeConfig(
        max_new_tokens=st.args.new_tokens,
        record_stats=strategy.is_sparse,
        oracle_acceptance=oracle,
    )
    engine = Engine(runner, strategy, decode)
    prompts = prompts_for(cell.context, cell.batch, runner.config.vocab_size)
    prefills = runner.prefills
    with collection_held():
        result = engine.generate(prompts)
    fig = steady_figures(result)
    full = full_batch.figures(result, cell.batch)
    if full is not None:
        fig["full_batch"] = full
    parents = [p - 1 for p in tree.parents[1:]]
    # The prediction is of a full batch: the acceptance of the full-batch rounds.
    accepted = (full or fig)["mean_accepted"]
    alpha = fit_acceptance(parents, accepted) if parents else 0.0
    selection = {
        k: mean_selection(result, k)
        for k in ("group_overlap", "layer_overlap", "predict_hit", "reuse_hit")
    }
    fig.update(_decoded(result))
    return {
        "measured": fig,
        "prefill_s": result.prefill_s,
        "prefill": {
            "reused": runner.prefills == prefills,
            "forward_s": result.prefill_forward_s,
            "timer": result.timer,
        },
        "timer": result.timer,
        "measured_acceptance": _measured_acceptance(result, engine, fig, alpha, full, oracle),
        "selection": selection,
        "prediction": predictions(
            st, cell, strategy, alpha, selection["group_overlap"], fig["loop"]
        ),
    }


def _decoded(result) -> dict:
    """A run's rounds (trace, accepted counts, decoding sequences) and its decoded tokens' CRC."""
    return {
        # Per round: the longest context, the drafts and the accepted count of the first
        # sequence still decoding; each decoding sequence's accepted count, and which
        # sequences those are.
        "rounds_trace": [[max(r.context_lens), r.drafted, r.accepted[0]] for r in result.rounds],
        "accepted_per_sequence": [list(r.accepted) for r in result.rounds],
        "sequences_per_round": [list(r.sequences) for r in result.rounds],
        # The decoded text, every sequence: equal wherever the decode is deterministic
        # (another shard, a reused prefill).
        "tokens_crc32": zlib.crc32(json.dumps(result.tokens).encode()),
    }


def _measured_acceptance(result, engine, fig: dict, alpha: float, full, oracle) -> dict:
    """A run's measured acceptance: its source (the oracle's, labelled synthetic, or the
    drafter's), mean accepted drafts and rate, the acceptance ``alpha`` fitted over its
    full-batch rounds (``full``, when there are any) or the whole run, and the oracle's
    diverged and off-plan counts."""
    return {
        "source": "synthetic:oracle" if oracle else "measured",
        "mean_accepted": fig["mean_accepted"],
        "rate": result.acceptance_rate(),
        "fitted_alpha": alpha,
        "fitted_over": "full-batch rounds" if full is not None else "run",
        "oracle": list(oracle) if oracle else None,
        "diverged": len(engine.drafter.diverged) if oracle else 0,
        "off_plan": engine.drafter.off_plan if oracle else 0,
    }


def predictions(
    st: Setup, cell: Cell, strategy: Strategy, alpha: float, overlap, loop: str
) -> dict:
    """perfmodel's prediction at the measured acceptance and overlap (the mean context of the
    run) and the run's decode ``loop``, with its speedups over the autoregressive baselines
    predicted alike."""
    drafted = cell.acceptance is not None
    elementwise = elementwise_of_backend(backend_of(st.device))
    args = (cell.model, cell.context, cell.batch, drafted, alpha, overlap, st.args, elementwise)
    return predict_cell(strategy, *args, loop)


def predict_cell(
    strategy: Strategy,
    model: str,
    context: int,
    batch: int,
    drafted: bool,
    alpha: float,
    overlap,
    settings,
    elementwise: str,
    loop: str,
) -> dict:
    """perfmodel's prediction of one cell (``drafted``: the oracle's acceptance, labelled
    synthetic) at the run's mean context (``settings.new_tokens``) on ``settings.gpu``, the
    element-wise ops as the run's engine ran them (``elementwise``), with its speedups over the
    autoregressive baselines predicted alike and their intervals; ``{"error": reason}`` where
    it cannot predict."""
    from ssvkit.validation.decode_figures import predict, ratio_interval

    name = model.removeprefix("random:")
    gpu = settings.gpu
    ctx = context + settings.new_tokens // 2
    kw = {"elementwise": elementwise, "loop": loop}
    pred = predict(strategy, name, None, ctx, batch, alpha, overlap, gpu, **kw)
    if "error" in pred:
        return pred
    if drafted:
        pred["acceptance"] = "synthetic:oracle"
    pred["speedup"], pred["speedup_intervals"] = {}, {}
    for base in AUTOREGRESSIVE:
        ar = predict(BASELINES[base], name, None, ctx, batch, 0.0, overlap, gpu, **kw)
        if "tokens_per_s" in ar:
            pred["speedup"][base] = pred["tokens_per_s"] / ar["tokens_per_s"]
            same = (ar["tokens_per_s"], ar["round_log_bounds"]) == (
                pred["tokens_per_s"],
                pred["round_log_bounds"],
            )
            pred["speedup_intervals"][base] = ratio_interval(
                pred["speedup"][base], ar["round_log_bounds"], pred["round_log_bounds"], same
            )
    return pred


def run_cell(st: Setup, runners: Runners, cell: Cell) -> dict:
    """One cell's row value: measured, or skipped with the reason (memory, positions, a
    strategy the engine cannot run)."""
    from ssvkit.engine.checkpoint import resolve_source
    from ssvkit.engine.strategy_check import check_strategy
    from ssvkit.kernels.timing import provenance
    from ssvkit.planner.space import describe

    cfg = resolve_source(cell.model).config
    try:
        strategy = cell_strategy(st, cell)
        check_strategy(strategy, cfg, None, backend_of(st.device))
    except ValueError as e:
        return {"status": "skipped", "reason": str(e).splitlines()[0]}
    cuda = st.device == "cuda"
    out = {
        "strategy": dataclasses.asdict(strategy),
        **run_schedule(strategy),
        "describe": describe(strategy),
        "provenance": {
            **provenance(),
            "dtype": str(st.dtype).removeprefix("torch."),
            "backend": backend_of(st.device),
            "cuda_graphs": cuda,
            "new_tokens": st.args.new_tokens,
            "temperature": 0.0,
        },
    }
    plan, reason = memory_plan(st, cell, strategy)
    if plan is not None:
        out["memory"] = plan.to_json()
    if reason is not None:
        return {**out, "status": "skipped", "reason": reason}
    t0 = time.perf_counter()
    out.update(measure_cell(st, runners, cell, strategy, plan))
    return {**out, "status": "measured", "wall_s": time.perf_counter() - t0}


def measure_rows(st: Setup, cells: list[Cell], cache: RunCache | None, stop_at: float, done):
    """Decode ``cells`` (a shard's, in its run order) group by group, each group's cells in
    ``run_order``, through the run cache when there is one; ``done(cell, row)`` gets each
    row as it finishes. Returns False when ``time.perf_counter()`` passes ``stop_at`` before
    a cell that must be decoded, True when every cell has its row."""
    runners = Runners(st)
    values: dict[str, dict] = {}  # by key: a cell of another label but the same decode
    for members in groups_of(cells).values():
        for cell in run_order(st, members):
            cached = cell.key in values or (cache is not None and cell.key in cache.runs)
            if not cached and time.perf_counter() > stop_at:
                return False
            if cell.key not in values:
                call = lambda cell=cell: run_cell(st, runners, cell)  # noqa: E731
                values[cell.key] = call() if cache is None else cache.get(cell.key, call)
            done(cell, {**dataclasses.asdict(cell), **values[cell.key]})
    return True
