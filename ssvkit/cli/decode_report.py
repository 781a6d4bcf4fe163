"""``ssvkit decode``'s report: the measurement beside perfmodel's prediction, as JSON (every
figure with its provenance) or as a table.

The prediction is for ``--gpu`` at the measured acceptance: the per-draft alpha whose expected
accepted drafts per round (perfmodel's tree model) equal the measured mean (of the full-batch
rounds, which the prediction prices, where a batched run has them), and, when measured, the mean
group overlap; the context is the mean context of the run.
"""

from __future__ import annotations

import dataclasses

from ssvkit.perfmodel.elementwise import elementwise_of_backend
from ssvkit.perfmodel.loop_host import measured_loop_host_s
from ssvkit.perfmodel.numbers import figure, interval_text
from ssvkit.validation import full_batch
from ssvkit.validation.decode_figures import fit_acceptance, mean_selection, predict
from ssvkit.validation.records import run_schedule


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeRun:
    """What ``ssvkit decode`` ran: the strategy and its tree, the models, the context and the
    device setup, and the oracle drafter when it drafted."""

    strategy: object
    tree: object
    target_src: object
    draft_src: object
    context: int
    device: str
    dtype: object
    backend: str
    graphs: bool
    note: str | None
    oracle: object = None


def build_report(args, result, run: DecodeRun) -> dict:
    """The run's figures with their provenance; with ``run.oracle`` (the oracle drafter) every
    acceptance figure is labelled ``synthetic:oracle``."""
    source = "synthetic:oracle" if run.oracle is not None else None
    mean_acc = result.mean_accepted()
    full = full_batch.figures(result, args.batch) if args.batch > 1 else None
    # The prediction prices full-batch rounds: at their acceptance where the run has them (the
    # tail's rounds hold the sequences that accepted least, and weigh in the run's mean as much
    # as a full round).
    fit_full = full is not None and run.tree.num_drafts > 0
    fit_to = full["mean_accepted"] if fit_full else mean_acc
    parents = run.tree.parents
    alpha = fit_acceptance(parents[1:] and [p - 1 for p in parents[1:]], fit_to)
    pred = _prediction(args, result, run, alpha, source)
    return {
        **_run_fields(args, result, run),
        **_measured_figures(args, result, run, mean_acc, alpha, source, fit_full),
        "full_batch": _full_batch(full, source, f"measured:{result.timer}"),
        "selection": {
            name: mean_selection(result, name)
            for name in ("group_overlap", "layer_overlap", "predict_hit", "reuse_hit")
        },
        "prediction": pred,
        "trace": args.trace,
        "sample": _sample_text(result.tokens[0]),
    }


def _prediction(args, result, run: DecodeRun, alpha: float, source: str | None) -> dict:
    """perfmodel's prediction for ``--gpu`` at the fitted ``alpha``, the measured group overlap
    and the run's mean context; its acceptance labelled ``source`` where that is synthetic."""
    draft_src = run.draft_src
    overlap = mean_selection(result, "group_overlap")
    ctx_mean = run.context + args.max_new_tokens // 2 if args.max_new_tokens else run.context
    pred = predict(
        run.strategy,
        run.target_src.config_path,
        draft_src.config_path if draft_src else None,
        ctx_mean,
        args.batch,
        alpha,
        overlap,
        args.gpu,
        elementwise=elementwise_of_backend(run.backend),
        loop=result.loop,
    )
    if source is not None and "error" not in pred:
        pred["acceptance"] = source
    return pred


def _run_fields(args, result, run: DecodeRun) -> dict:
    """What ran: the models, the strategy and its schedule, the device setup and the run's
    size."""
    timed = result.timed()
    return {
        "model": run.target_src.name,
        "draft_model": run.draft_src.name if run.draft_src else None,
        "strategy": dataclasses.asdict(run.strategy),
        **run_schedule(run.strategy),
        "note": run.note,
        "device": run.device,
        "dtype": str(run.dtype).removeprefix("torch."),
        "backend": run.backend,
        "cuda_graphs": run.graphs,
        "loop": result.loop,
        "context": run.context,
        "batch": args.batch,
        "new_tokens": len(result.tokens[0]),
        "rounds": len(result.rounds),
        "warmup_rounds": len(result.rounds) - len(timed),
        "drafted_per_round": run.tree.num_drafts,
    }


def _measured_figures(
    args, result, run: DecodeRun, mean_acc, alpha, source: str | None, full_fit: bool
) -> dict:
    """The measured throughput, acceptance (labelled ``source`` where that is synthetic) and
    step times with their provenance; ``alpha`` fitted to the full-batch rounds' acceptance
    where ``full_fit``."""
    timer = f"measured:{result.timer}"
    steps = result.mean_step_s()
    return {
        "tokens_per_s": figure(result.tokens_per_s(), "tokens/s", f"{timer}+host"),
        "mean_accepted": figure(mean_acc, "drafts/round", source or timer.split("+")[0]),
        "acceptance_rate": figure(result.acceptance_rate(), "share", source or "measured"),
        "fitted_alpha": figure(
            alpha,
            "share",
            "fit:perfmodel.tree_expected_tokens"
            + (" of the full-batch rounds" if full_fit else "")
            + (f" of {source}" if source else ""),
        ),
        "acceptance": source or "measured",
        "oracle": _oracle_summary(run.oracle, args.batch, result),
        "steps_s": {k: figure(v, "s", timer) for k, v in steps.items()},
        "round_s": figure(sum(steps.values()), "s", timer),
        "round_wall_s": figure(result.mean_wall_s(), "s", "measured:wall-clock"),
        "prefill_s": figure(result.prefill_s, "s", "measured:wall-clock"),
        # With the oracle its reference pass runs the prefill and the decode reuses it: the
        # prefill's own time is the one measured when it ran.
        "prefill_reused": result.prefill_reused,
        "prefill_forward_s": figure(result.prefill_forward_s, "s", timer),
        "warm_drafters_s": figure(result.warm_s, "s", "measured:wall-clock"),
    }


def _full_batch(f: dict | None, source: str | None, timer: str) -> dict | None:
    """The run's figures over its full-batch rounds (``validation.full_batch.figures`` ``f``:
    every sequence decodes, none finishes), which perfmodel's tokens/s describes; None at batch 1
    or without such a round. A fixed batch's last rounds carry its finished sequences at a full
    round's cost, which the whole run's tokens/s counts. Its acceptance labelled ``source``
    where that is synthetic."""
    if f is None:
        return None
    return {
        "rounds": f["rounds"],
        "tokens_per_s": figure(f["tokens_per_s"], "tokens/s", f"{timer}+host"),
        "round_s": figure(f["round_s"], "s", f"{timer}+host"),
        "mean_accepted": figure(f["mean_accepted"], "drafts/round", source or timer),
    }


def _oracle_summary(oracle, batch: int, result) -> dict | None:
    """The oracle's chosen acceptance, how many sequences' verify left its probes, how many
    (sequence, round) pairs left the drawn plan, and what the probes cost (verify forwards and
    host wall time, outside every timed figure)."""
    if oracle is None:
        return None
    cost = result.oracle_overhead()
    return {
        "acceptance": list(oracle.config.oracle_acceptance),
        "diverged": len(oracle.diverged),
        "off_plan": oracle.off_plan,
        "sequences": batch,
        "probes_per_round": cost["probes_per_round"],
        "probe_s": figure(cost["seconds"], "s", "measured:wall-clock"),
    }


def _sample_text(tokens: list[int]) -> str:
    from ssvkit.engine.corpus import decode

    return decode(tokens[:80])


def _iv(iv, fmt: str, scale: float = 1.0) -> str:
    """`` [low, high]`` after a predicted figure, or nothing without an interval."""
    return f" {interval_text(iv, fmt, scale)}" if iv is not None else ""


def report_text(r: dict) -> str:
    """The report as text: what ran, each measured figure beside its prediction, and where
    the prediction and the selections come from."""
    p = r["prediction"]
    ivs = p.get("intervals") or {}
    lines = _run_lines(r)
    lines += _token_lines(r, p, ivs)
    lines += _time_lines(r, p, ivs)
    lines += _source_lines(r, p)
    return "\n".join(lines)


def _run_lines(r: dict) -> list[str]:
    """The models and the device, the strategy, the note, the online controller's switches and
    the run's size."""
    lines = [
        f"{r['model']}"
        + (f" + {r['draft_model']}" if r["draft_model"] else "")
        + f" on {r.get('device_name', r['device'])}, {r['dtype']}, {r['backend']}"
        + (", CUDA graphs" if r["cuda_graphs"] else "")
        + (", pipelined rounds" if r.get("loop") == "pipelined" else "")
        + f"  [{r['round_s']['provenance']}]",
        f"strategy {r['strategy']['name']}: tree {r['strategy']['tree']} "
        f"({r['drafted_per_round']} drafts, {r['strategy']['traversal']}), attention "
        f"{r['strategy']['attention']}, drafter {r['strategy']['drafter']['kind']}",
    ]
    if r["note"]:
        lines.append(f"note: {r['note']}")
    if r.get("switches") is not None:
        sw = r["switches"]
        mixed = "; the figures below mix strategies, the prediction is the first one's"
        lines.append(f"online controller: {len(sw)} switch(es)" + (mixed if sw else ""))
        for x in sw:
            lines.append(
                f"  round {x['round']}: {x['from']} -> {x['to']} (alpha {x['observed_alpha']:.2f} "
                f"vs {x['expected_alpha']:.2f} expected, predicted gain {x['predicted_gain']:+.1%})"
            )
    lines.append(
        f"context {r['context']}, batch {r['batch']}, {r['new_tokens']} new tokens, "
        f"{r['rounds']} rounds ({r['warmup_rounds']} warm-up left out)"
    )
    return lines


def _token_lines(r: dict, p: dict, ivs: dict) -> list[str]:
    """The table's head, tokens/s and accepted drafts per round, measured and predicted, and
    the oracle's acceptance and probes where it drafted."""
    pred_tps = f"{p['tokens_per_s']:10.1f}" if "tokens_per_s" in p else "       n/a"
    pred_tps += _iv(ivs.get("tokens_per_s"), ".1f")
    lines = [
        f"{'':22s}{'measured':>10s} {'predicted':>10s}",
        f"{'tokens/s':22s}{r['tokens_per_s']['value']:10.1f} {pred_tps}",
        *_full_batch_lines(r, pred_tps),
        f"{'mean accepted/round':22s}{r['mean_accepted']['value']:10.2f} "
        f"{p.get('tokens_per_round', float('nan')) - 1:10.2f}   (alpha fit "
        f"{r['fitted_alpha']['value']:.3f}"
        + (" to the full-batch rounds" if r.get("full_batch") and r["drafted_per_round"] else "")
        + f", rate {r['acceptance_rate']['value']:.3f})"
        + (" [synthetic]" if r.get("oracle") else ""),
    ]
    if r.get("oracle"):
        o = r["oracle"]
        lines.append(
            f"acceptance: synthetic (oracle drafter, alpha per depth "
            f"{','.join(f'{a:g}' for a in o['acceptance'])}; {o['diverged']} of "
            f"{o['sequences']} sequences left its probes; {o['off_plan']} sequence-rounds "
            "left the drawn plan)"
        )
        lines.append(
            f"oracle probes: {o['probes_per_round']:.2f} verify forwards per round, "
            f"{o['probe_s']['value']:.3f} s, outside every step time and tokens/s"
        )
    return lines


def _full_batch_lines(r: dict, pred_tps: str) -> list[str]:
    """Tokens/s over the full-batch rounds beside the prediction, which prices such rounds, and
    how many rounds they are; nothing where the run has none."""
    f = r.get("full_batch")
    if not f:
        return []
    if not r["drafted_per_round"]:
        what = "the prediction prices such rounds"
    else:
        what = (
            f"{f['mean_accepted']['value']:.2f} accepted a round; the prediction prices such "
            "rounds at their acceptance"
        )
    return [
        f"{'  full-batch rounds':22s}{f['tokens_per_s']['value']:10.1f} {pred_tps}   "
        f"({f['rounds']} of {r['rounds']} rounds: every sequence decoding; {what})"
    ]


def _time_lines(r: dict, p: dict, ivs: dict) -> list[str]:
    """Each step's, the loop's host time and the round's milliseconds, measured and predicted
    (the prediction's round is the round's wall time: its steps and the loop's host time)."""
    ms = 1e3
    lines = []
    for k, v in r["steps_s"].items():
        pv = p.get(f"{k}_s")
        # ``launch`` is the GPU waiting for the host: priced with the loop's host time.
        note = "(in loop)" if k == "launch" else "(in verify)"
        pcol = f"{pv * ms:10.3f}" if pv is not None else f"{note:>10s}"
        pcol += _iv(ivs.get(f"{k}_s"), ".3f", ms)
        if k == "verify" and pv is not None:
            pcol += "   (prediction includes accept)"
        lines.append(f"{k + ' (ms)':22s}{v['value'] * ms:10.3f} {pcol}")
    if "round_wall_s" in r:
        steps = {k: v["value"] for k, v in r["steps_s"].items()}
        loop = measured_loop_host_s(r["round_wall_s"]["value"], steps)
        pl = f"{p['loop_s'] * ms:10.3f}" if "loop_s" in p else "       n/a"
        what = "wall less the steps" + (
            ": what the GPU did not hide" if r.get("loop") == "pipelined" else ""
        )
        lines.append(f"{'loop host (ms)':22s}{loop * ms:10.3f} {pl}   ({what})")
        measured, what = r["round_wall_s"]["value"], "round wall (ms)"
    else:
        measured, what = r["round_s"]["value"], "round (ms)"
    pr = f"{p['round_s'] * ms:10.3f}" if "round_s" in p else "       n/a"
    pr += _iv(ivs.get("round_s"), ".3f", ms)
    lines.append(f"{what:22s}{measured * ms:10.3f} {pr}")
    return lines


def _source_lines(r: dict, p: dict) -> list[str]:
    """The prediction's GPU, provenance and overlap (or why there is none), the mean
    selection figures and the trace file."""
    lines = [
        "prediction: "
        + (
            f"{p['gpu']} [{p['provenance']}], overlap {p['overlap']['value']:.3f} "
            f"[{p['overlap']['provenance']}]"
            if "error" not in p
            else p["error"]
        )
    ]
    sel = r["selection"]
    if any(v is not None for v in sel.values()):
        lines.append(
            "selection (mean over layers): "
            + ", ".join(f"{k} {v:.3f}" for k, v in sel.items() if v is not None)
        )
    if r["trace"]:
        lines.append(f"trace: {r['trace']}")
    return lines
