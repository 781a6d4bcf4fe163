"""ssvkit's side of the seeds' headline figures: each computed on the paper's settings through
the functions a user calls (``perfmodel.baselines.compare``, what ``ssvkit predict`` prints;
``sim.scenarios.simulate``, what ``ssvkit simulate`` runs) or, for the seeds' analytic figures,
through ``perfmodel.seed_formulas``.

A computation takes the figure's ``compute`` entry of ``validation/data/papers.json`` and the
settings (``Settings``: the paper's, with the figure's overrides) and returns the value and the
provenance of the costs behind it. A GPU without a fitted profile is priced with the profile
of its architecture transferred to its ceilings (``transferred:<profile>-><gpu>``).
"""

from __future__ import annotations

import dataclasses

from ssvkit.perfmodel.baselines import compare, grouped_seconds
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.seed_formulas import (
    dense_ffn_flops,
    full_attention_flops,
    moe_ffn_flops,
    reduction,
    sparse_attention_flops,
    sparse_ffn_flops,
    sparse_moe_flops,
)
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy, Workload
from ssvkit.sim.config import PrrConfig, SimConfig, SparseSpecConfig, SsdConfig, default_strategy


def simulate(config):
    """``sim.scenarios.simulate``, imported when a figure simulates: the command line imports
    this module at start, and a decode-only machine need not have simpy."""
    from ssvkit.sim.scenarios import simulate as run

    return run(config)


WORKLOAD_KEYS = ("context_len", "batch", "tp", "acceptance", "overlap")
STRATEGY_KEYS = ("tree", "metadata", "drafter", "draft_model")
SIM_KEYS = ("model", "gpu", "context_len", "num_tokens", "batch", "tp", "acceptance", "overlap")
NESTED = {"ssd": SsdConfig, "prr": PrrConfig, "sparsespec": SparseSpecConfig}


def strategy_for(name: str, s: dict) -> Strategy:
    """A baseline (or a simulator scenario's default strategy) with the settings' tree, drafter
    and sparse metadata, as ``ssvkit predict`` and ``ssvkit simulate`` apply their options."""
    base = default_strategy(name)  # a baseline by its name, or a scenario's default
    kw = {}
    if base.tree != "chain:0" and "drafter" in s:
        kw["drafter"] = DrafterSpec(kind=s["drafter"], model=s.get("draft_model"))
    if base.tree != "chain:0" and "tree" in s:
        kw["tree"] = s["tree"]
    if base.is_sparse and "metadata" in s:
        kw["metadata"] = s["metadata"]
    return dataclasses.replace(base, **kw)


def _predict(s: dict, names: list[str]) -> dict[str, dict]:
    model, gpu = get_model(s["model"]), get_gpu(s["gpu"])
    work = Workload(**{k: s[k] for k in WORKLOAD_KEYS if k in s})
    rows = compare(model, gpu, [strategy_for(n, s) for n in names], [work.context_len], work)
    return {r["strategy"]: r for r in rows}


def _provenance(a: dict, b: dict) -> str:
    """The provenance of a figure of rows ``a`` and ``b``: ``a``'s, labelled ``stand-in`` when
    ``b`` is priced by a stand-in class and ``a`` is not (``perfmodel.calibrated``)."""
    return a["provenance"] + (":stand-in" if b["stand_ins"] and not a["stand_ins"] else "")


def predict_speedup(c: dict, s: dict) -> tuple[float, str]:
    """tokens/s of ``strategy`` over ``over`` at the settings (``ssvkit predict``'s rows)."""
    rows = _predict(s, [c["strategy"], c["over"]])
    a, b = rows[c["strategy"]], rows[c["over"]]
    return a["tokens_per_s"] / b["tokens_per_s"], _provenance(a, b)


def predict_stage_ratio(c: dict, s: dict) -> tuple[float, str]:
    """Seconds of a stage of ``over`` over the same stage of ``strategy``: ``verify`` (the
    verification forward) or ``attention`` (the attention ops, ``op_group``)."""
    rows = _predict(s, [c["strategy"], c["over"]])

    def secs(r):
        return r["verify_s"] if c["stage"] == "verify" else grouped_seconds(r)[c["stage"]]

    a, b = rows[c["strategy"]], rows[c["over"]]
    return secs(b) / secs(a), _provenance(a, b)


def predict_step_ms(c: dict, s: dict) -> tuple[float, str]:
    """Milliseconds of one step of ``strategy`` in an op group (``total``: the whole step)."""
    r = _predict(s, [c["strategy"]])[c["strategy"]]
    secs = r["round_s"] if c["group"] == "total" else grouped_seconds(r)[c["group"]]
    return 1e3 * secs, r["provenance"]


def _sim_config(scenario: str, s: dict) -> SimConfig:
    kw = {k: s[k] for k in SIM_KEYS if k in s}
    if scenario == "sparsespec":
        kw["num_requests"] = kw.get("batch", 1)
    for group, cls in NESTED.items():
        sub = {k.split(".", 1)[1]: v for k, v in s.items() if k.startswith(group + ".")}
        if sub:
            kw[group] = cls(**sub)
    return SimConfig(scenario=scenario, strategy=strategy_for(scenario, s), **kw)


def simulate_speedup(c: dict, s: dict) -> tuple[float, str]:
    """Simulated tokens/s of ``scenario`` over ``over``'s on the same requests (``ssvkit
    simulate``); speculative baselines take the scenario's tree and drafter."""
    a = simulate(_sim_config(c["scenario"], s)).figures["simulated_tokens_per_s"]
    b = simulate(_sim_config(c["over"], s)).figures["simulated_tokens_per_s"]
    return a["value"] / b["value"], a["provenance"]


def simulate_figure(c: dict, s: dict) -> tuple[float, str]:
    """One summary figure of a simulated run (times ``scale``)."""
    f = simulate(_sim_config(c["scenario"], s)).figures[c["figure"]]
    return f["value"] * c.get("scale", 1), f["provenance"]


def mean_length(input_sparsity: float, reference_base_len: float, sparsity: float) -> float:
    """The sequence length at which seed 001's piecewise budget (eq. 6) gives ``input_sparsity``
    at base length ``reference_base_len``: ``s_a = (1 - rho)(1 - L0 / L)`` solved for L."""
    return reference_base_len / (1.0 - input_sparsity / (1.0 - sparsity))


def piecewise_sparsity(c: dict, inputs: dict) -> tuple[float, str]:
    """Seed 001's attention sparsity at base length L0: the share of blocks eq. 6 evicts,
    ``1 - N_budget / N_all = (1 - rho)(1 - L0 / L)``, at the mean length solved from the
    dataset's L0 = 4K row (block size and KV heads cancel)."""
    ref = inputs[c["input"]]["value"]
    length = mean_length(ref, c["reference_base_len"], c["sparsity"])
    L0, rho = c["base_len"], c["sparsity"]
    s_a = (1.0 - rho) * (1.0 - L0 / length) if length > L0 else 0.0
    return s_a, f"formula:seed_001_eq6 (L = {length:.0f} from {c['input']})"


def hybrid_flops(c: dict, inputs: dict) -> tuple[float, str]:
    """FLOPs saved by seed 001's hybrid verification with Table 1's formulas, in percent: sparse
    attention at the budget's sparsity, sparse FFN channels in the dense layers and in every
    expert, skipped experts in the MoE layers; the routers and projections stay dense."""
    m = get_model(c["model"])
    s_a = inputs[c["input"]]["value"]
    length = mean_length(s_a, c["reference_base_len"], c["sparsity"])
    d, s_f, s_e = m.hidden_size, c["ffn_sparsity"], c["expert_sparsity"]
    moe = [bool(x) for x in m.moe_layers] or [m.num_experts > 0] * m.num_layers
    strict = sparse = 0.0
    for is_moe in moe:
        strict += full_attention_flops(1, length, d)
        sparse += sparse_attention_flops(1, length, d, s_a)
        if not is_moe:
            strict += dense_ffn_flops(1, length, d, m.intermediate_size)
            sparse += sparse_ffn_flops(1, length, d, m.intermediate_size, s_f)
            continue
        k, E, d_e = m.experts_per_token, m.num_experts, m.expert_intermediate_size
        router = moe_ffn_flops(1, length, d, d_e, 0, E)
        shared = m.num_shared_experts * dense_ffn_flops(1, length, d, d_e)
        strict += moe_ffn_flops(1, length, d, d_e, k, E) + shared
        experts = sparse_moe_flops(1, length, d, d_e, k, E, s_e) - router
        channel = sparse_ffn_flops(1, 1, 1, 1, s_f) / dense_ffn_flops(1, 1, 1, 1)
        sparse += router + (experts + shared) * channel
    return 100 * float(reduction(strict, sparse)), f"formula:seed_001_table1 (L = {length:.0f})"


SIMULATED = {
    "predict_speedup": predict_speedup,
    "predict_stage_ratio": predict_stage_ratio,
    "predict_step_ms": predict_step_ms,
    "simulate_speedup": simulate_speedup,
    "simulate_figure": simulate_figure,
}
ANALYTIC = {"piecewise_sparsity": piecewise_sparsity, "hybrid_flops": hybrid_flops}
KINDS = (*SIMULATED, *ANALYTIC, "not_modelled")
