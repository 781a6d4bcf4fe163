"""The verify step of a scale campaign's cells (``validation.scale_campaign``), op by op, beside
perfmodel's prediction of each op: where the step model's verify error comes from.

    python -m ssvkit.validation.engine_verify --campaign validation/data/scale-campaign-h200.json \\
        --ops --resume --stop-after 540 --out build/scale-verify-h200.json

``engine_verify --campaign`` takes this path for a scale campaign document (``scale_main``).
Each measured cell runs with its random registry geometry, batch, context, tree and strategy
with the NSA row schedule it ran (``validation.records.measured_strategy``), on the KV of its
prompts prefilled once per (model, context, batch); its verify forward is checked, timed in a
CUDA graph beside the campaign's CUDA-event ``verify`` step and perfmodel's verify forward,
and with ``--ops`` timed op by op beside the step model per op group (``measure_cell``).
Memory is planned as the campaign planned it: a cell that does not fit is recorded as skipped.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch
from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.checkpoint import build_model, resolve_source
from ssvkit.engine.memory import plan_memory
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.tree import DraftTree
from ssvkit.kernels.timing import bench, provenance
from ssvkit.perfmodel.elementwise import elementwise_of_backend
from ssvkit.planner.space import describe
from ssvkit.validation.decode_figures import loop_of_run, step_prediction, verify_forward_s
from ssvkit.validation.engine_ops import (
    OP_GROUPS,
    op_groups,
    selection_stats,
    time_ops,
)
from ssvkit.validation.engine_verify import STEP_TIMING, _resumed, _write, device_setup
from ssvkit.validation.full_batch import row_figures
from ssvkit.validation.records import file_label, measured_strategy, run_schedule
from ssvkit.validation.scale_cells import CAMPAIGN_VERSION, cache_positions
from ssvkit.validation.scale_measure import prompts_for

GIB = 2**30
BENCHMARK = "engine_verify_scale"


def cell_key(r: dict) -> str:
    """What names a cell's verify step: model, context, batch, baseline and acceptance."""
    return f"{r['model']}|{r['context']}|{r['batch']}|{r['baseline']}|{r['acceptance']}"


def _t_max(doc: dict, r: dict) -> int:
    """The cell's cache positions, as the campaign allocated them."""
    if "memory" in r:
        return r["memory"]["t_max"]
    return cache_positions(SimpleNamespace(args=SimpleNamespace(**doc["settings"])), r["context"])


def _settings(args, doc: dict) -> dict:
    """The run's settings (``ValueError`` in one line on bad input)."""
    if doc.get("version") != CAMPAIGN_VERSION:
        raise ValueError(
            f"scale campaign {args.campaign!r} has version {doc.get('version')!r}, "
            f"not {CAMPAIGN_VERSION}"
        )
    if args.stop_after is not None and not args.stop_after >= 0:
        raise ValueError(f"--stop-after must be >= 0 seconds, got {args.stop_after}")
    if args.available_gib is not None and not args.available_gib > 0:
        raise ValueError(f"--available-gib must be > 0, got {args.available_gib}")
    available = doc["available_bytes"]
    if args.available_gib is not None:
        available = int(args.available_gib * GIB)
    return {"gpu": args.gpu or doc["gpu"], "available_bytes": available}


class _Runners:
    """The model of the current cell's geometry (built once per model, for the longest cache
    its cells need) and the runner of its (context, batch) with the KV filled."""

    def __init__(self, args, doc: dict, backend: str, dtype) -> None:
        self.args, self.doc, self.backend, self.dtype = args, doc, backend, dtype
        self.model_name = self.model = self.key = self.runner = None

    def get(self, r: dict, longest: int) -> ModelRunner:
        args = self.args
        if self.model_name != r["model"]:
            self.model = self.runner = self.key = None
            _release(args.device)
            torch.manual_seed(0)
            src = resolve_source(r["model"])
            self.model = build_model(
                src, max_positions=longest, device=args.device, dtype=self.dtype
            )
            self.model_name = r["model"]
        key = (r["context"], r["batch"])
        if self.key != key:
            self.runner = None
            _release(args.device)
            self.runner = ModelRunner(
                self.model, batch=r["batch"], t_max=_t_max(self.doc, r), backend=self.backend
            )
            self._fill(r)
            self.key = key
        return self.runner

    @torch.no_grad()
    def _fill(self, r: dict) -> None:
        runner = self.runner
        if self.args.random_kv:
            torch.manual_seed(0)
            runner.cache.kv.normal_()
            runner.cache.set_lens(torch.full((r["batch"],), r["context"], dtype=torch.int32))
        else:
            runner.prefill(prompts_for(r["context"], r["batch"], runner.config.vocab_size))


def _release(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _skip_reason(doc: dict, r: dict, settings: dict, args) -> str | None:
    """Why the cell cannot be timed here: memory, as the campaign planned it."""
    s = measured_strategy(r)
    plan = plan_memory(
        resolve_source(r["model"]).config,
        s,
        batch=r["batch"],
        context=r["context"],
        t_max=_t_max(doc, r),
        available_bytes=settings["available_bytes"],
        elem_bytes=2 if args.device == "cuda" else 4,
        scores=args.device != "cuda",
        stats=s.is_sparse,
    )
    return None if plan.fits else plan.refusal()


def _check(runner, tokens, tree, attn) -> None:
    """The forward gives finite logits and commits nothing (``ValueError`` otherwise)."""
    lens = runner.cache.lens.clone()
    logits = runner.tree_forward(tokens, tree, attn)[0]
    if not torch.isfinite(logits).all():
        raise ValueError("the verify forward gave non-finite logits")
    if not torch.equal(lens, runner.cache.lens):
        raise ValueError("the verify forward changed the committed lengths")


@torch.no_grad()
def measure_cell(args, settings: dict, runner, r: dict, timing: str) -> dict:
    """One cell's verify step: checked, timed whole and (``--ops``) op by op, predicted.

    - a check first (``_check``): the verify forward's logits are finite and the forward
      commits nothing;
    - ``graph_s``: the verify forward (``ModelRunner.tree_forward``) replayed in a CUDA graph
      (on the CPU, timed by the wall clock), beside the campaign's CUDA-event ``verify`` step
      and perfmodel's verify forward at this point (``decode_figures.step_prediction`` on the
      campaign's GPU, at the acceptance of the cell's full-batch rounds and its measured
      overlap, as the report predicts; ``predicted_verify_s``);
    - with ``--ops``, every op of the forward timed alone (``engine_ops.time_ops``, with the
      forward's recorded queries) and, per group (``engine_ops.OP_GROUPS``), the measured
      seconds beside the step model's;
    - for sparse cells, the blocks the refresh layers select (``engine_ops.selection_stats``).
    """
    s = measured_strategy(r)
    attn = AttentionConfig.from_strategy(s)
    tree = DraftTree.from_spec(s.tree, s.traversal)
    runner.prepare(attn)
    if attn.kind != "dense":  # summaries of the prefilled keys
        runner.cache.rebuild_summaries()
    gen = torch.Generator().manual_seed(0)
    shape = (r["batch"], tree.num_nodes)
    tokens = torch.randint(0, runner.config.vocab_size, shape, generator=gen).to(args.device)
    _check(runner, tokens, tree, attn)

    def step(i):
        return runner.tree_forward(tokens, tree, attn)[0]

    graph_s = bench(step, timing, config=STEP_TIMING).median_s
    queries = runner.tree_forward(tokens, tree, attn, record=True)[2]
    selection = selection_stats(runner, attn, tree, queries)
    ops = time_ops(runner, attn, tree, tokens, queries, timing) if args.ops else None
    _, alpha = row_figures(r)
    try:
        pred, _, _ = step_prediction(
            s,
            r["model"].removeprefix("random:"),
            None,
            r["context"],
            r["batch"],
            alpha,
            r["selection"]["group_overlap"],
            settings["gpu"],
            elementwise=elementwise_of_backend(runner.backend),
            loop=loop_of_run(r["measured"]),
        )
    except ValueError as e:
        pred, unpredicted = None, str(e).splitlines()[0]
    return {
        "t": tree.num_nodes,
        "graph_s": graph_s,
        "campaign_verify_s": r["measured"]["steps_s"]["verify"],
        "predicted_verify_s": None if pred is None else verify_forward_s(pred),
        "prediction_provenance": unpredicted if pred is None else pred.label(0),
        "ops": ops,
        "groups": None if pred is None else op_groups(ops, pred),
        "selection": selection,
    }


def _row(r: dict) -> dict:
    s = measured_strategy(r)
    return {
        "key": cell_key(r),
        **{k: r[k] for k in ("model", "context", "batch", "label", "baseline", "acceptance")},
        "describe": describe(s),
        **run_schedule(s),
    }


def _groups(cells: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in cells:
        out.setdefault((r["model"], r["context"], r["batch"]), []).append(r)
    return out


def scale_main(args, doc: dict) -> dict:
    """Every measured cell of the scale campaign ``doc``: its verify step (``measure_cell``).

    The cells run group by group (model, context, batch), on the KV of the cells' prompts
    (``validation.scale_measure.prompts_for``) prefilled once per group, so that sparse
    selections see the keys the campaign's decode saw (``--random-kv``: random values at the
    cells' lengths instead, minutes faster, selections over random keys). Memory is planned as
    the campaign planned it (``engine.memory.plan_memory``, at the campaign's available bytes or
    ``--available-gib``): a cell that does not fit is recorded as skipped with the plan's
    refusal. The document is written whole after every cell; ``--resume`` keeps the cells an
    earlier call at this code's commit wrote to ``--out``, and ``--stop-after S`` starts no new
    cell after S seconds. The table printed last: per cell, the verify forward measured, in the
    campaign and predicted, then per op group measured and predicted.
    """
    settings = _settings(args, doc)
    backend, dtype, timing = device_setup(args.device)
    resumed = _resumed(args)
    if resumed is not None and resumed.get("benchmark") != BENCHMARK:
        raise ValueError(f"--resume: {args.out} is not a scale campaign's verify breakdown")
    rows = [] if resumed is None else resumed["rows"]
    done = {row["key"] for row in rows}
    cells = [r for r in doc["rows"] if r["status"] == "measured"]
    result = {
        "benchmark": BENCHMARK,
        "campaign": file_label(args.campaign),
        "campaign_commit": doc["provenance"].get("git_commit"),
        **settings,
        "device": args.device,
        "kv": "random" if args.random_kv else "prefill",
        "ops": bool(args.ops),
        "provenance": provenance(),
        "complete": False,
        "rows": rows,
    }
    stop_at = time.perf_counter() + (args.stop_after if args.stop_after is not None else 1e18)
    runners = _Runners(args, doc, backend, dtype)
    longest = {
        m: max(_t_max(doc, r) for r in cells if r["model"] == m)
        for m in {c["model"] for c in cells}
    }
    for members in _groups(cells).values():
        for r in members:
            if cell_key(r) in done:
                continue
            if time.perf_counter() > stop_at:
                break
            reason = _skip_reason(doc, r, settings, args)
            if reason is not None:
                rows.append({**_row(r), "status": "skipped", "reason": reason})
            else:
                # No reference to a runner outlives its cell: the next group's KV replaces it.
                row = measure_cell(args, settings, runners.get(r, longest[r["model"]]), r, timing)
                rows.append({**_row(r), "status": "measured", **row})
                print(_cell_line(rows[-1]), flush=True)
            done.add(cell_key(r))
            _write(result, args.out)
    result["complete"] = all(cell_key(r) in done for r in cells)
    _write(result, args.out)
    print(table(result))
    if not result["complete"]:
        print(
            f"stopped by --stop-after: run again with --resume to go on ({len(done)} of "
            f"{len(cells)} cells)"
        )
    return result


def _ms(x) -> str:
    return f"{1e3 * x:8.3f}" if x is not None else f"{'-':>8s}"


def _cell_line(row: dict) -> str:
    head = f"{row['context']:7d} {row['batch']:4d} {row['baseline']:16s} {row['acceptance']!s:>5s}"
    if row["status"] != "measured":
        return f"{head}  skipped: {row['reason']}"
    times = (row["graph_s"], row["campaign_verify_s"], row["predicted_verify_s"])
    return f"{head} {row['t']:3d} " + " ".join(_ms(x) for x in times)


def table(result: dict) -> str:
    """Per cell, the verify forward timed here, in the campaign and predicted (ms); then, per op
    group, measured / predicted ms per forward of each cell timed op by op."""
    lines = [
        f"{'context':>7s} {'b':>4s} {'baseline':16s} {'acc':>5s}   t {'graph':>8s} "
        f"{'campaign':>8s} {'predict':>8s} (ms)"
    ]
    lines += [_cell_line(r) for r in result["rows"]]
    timed = [r for r in result["rows"] if r["status"] == "measured" and r.get("ops")]
    if timed:
        lines += ["", "per op group, measured/predicted ms per forward:"]
        lines.append(f"{'cell':30s}" + "".join(f"{g[:12]:>14s}" for g in OP_GROUPS))
        for r in timed:
            name = f"{r['context']} b{r['batch']} {r['baseline']} {r['acceptance'] or '-'}"
            cols = (
                [
                    f"{1e3 * x['measured_s']:6.2f}/{1e3 * x['predicted_s']:<6.2f}"
                    for x in (r["groups"][g] for g in OP_GROUPS)
                ]
                if r["groups"]
                else ["-"] * len(OP_GROUPS)
            )
            lines.append(f"{name:30s}" + "".join(f"{c:>14s}" for c in cols))
    return "\n".join(lines)
