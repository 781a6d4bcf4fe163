"""The cells of the campaign at scale (``validation.scale_campaign``): the parsed axes, each
cell's strategy, the largest batch memory allows, and the groups a shard runs.

A cell is (model, context, batch, baseline, oracle acceptance); a *group* is the cells of one
(model, context, batch): they decode the same prompts on the same runner, so the group's first
cell prefills and the others reuse its prefill (``engine.runner.ModelRunner.prefill``). A
``max`` batch equal to a fixed one is the same group, and its cells the same decodes.
A context beyond what the model's positions hold with the new tokens and the largest verify tail
is cut to the longest that fits (Llama-3.1-8B and GLM-4-9B have 131,072 positions, so ``128K``
decodes 130,879 prompt tokens at 128 new tokens); the cell records the context asked for too.
The campaign's canonical order is models x contexts x batch labels x baselines x acceptances.
"""

from __future__ import annotations

import argparse
import dataclasses

from ssvkit.perfmodel.numbers import parse_count_list
from ssvkit.perfmodel.strategy import BASELINES, DrafterSpec, Strategy
from ssvkit.validation.e2e_campaign import NAMES, load_planner

CAMPAIGN_VERSION = 2
# The document's ``benchmark`` field: what ``ssvkit report --campaign`` recognises it by.
BENCHMARK = "scale_campaign"
MODELS = ("random:llama-3.1-8b", "random:glm-4-9b")
AUTOREGRESSIVE = ("ar_dense", "ar_sparse")
GIB = 2**30


@dataclasses.dataclass(frozen=True, slots=True)
class Cell:
    """One decode: the model, the prompt context (``context_asked``: the context the axis
    named, more when the model's positions cut it), the batch (``label`` says ``max`` when
    memory chose it), the baseline and the oracle's acceptance (None: autoregressive)."""

    model: str
    context: int
    batch: int
    label: str
    baseline: str
    acceptance: float | None
    context_asked: int

    @property
    def key(self) -> str:
        """The run cache's key: what the decode depends on (a ``max`` batch equal to a fixed
        one is the same decode)."""
        return f"{self.model}|{self.context}|{self.batch}|{self.baseline}|{self.acceptance}"

    @property
    def slot(self) -> str:
        """The cell's place in the campaign: its key and batch label."""
        return f"{self.key}|{self.label}"

    @property
    def group(self) -> tuple[str, int, int]:
        return (self.model, self.context_asked, self.batch)


@dataclasses.dataclass
class Setup:
    """What every cell shares: the parsed axes, the device and dtype, the planner's space and
    the memory the device offers (or the one given)."""

    models: list[str]
    contexts: list[int]
    batches: list[str]
    acceptances: list[float]
    baselines: list[str]
    device: str
    dtype: object
    space: object
    available_bytes: int
    args: argparse.Namespace

    @property
    def elem_bytes(self) -> int:
        return 2 if str(self.dtype).endswith("bfloat16") else 4


def setup(args, plan: bool = False) -> Setup:
    """The campaign's axes checked (``ValueError`` in one line on bad input). ``plan``: no
    decode follows, so ``--device auto`` means the GPU even without one here and the memory may
    come from ``--available-gib`` alone."""
    import torch
    from ssvkit.engine.checkpoint import resolve_source
    from ssvkit.engine.memory import available_memory

    if args.new_tokens < 1:
        raise ValueError(f"--new-tokens must be >= 1, got {args.new_tokens}")
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if not m.startswith("random:"):
            raise ValueError(
                f"--models takes random:NAME geometries (the oracle drafts), got {m!r}"
            )
        resolve_source(m)
    names = [x for x in args.baselines.split(",") if x]
    bad = [x for x in names if x not in NAMES]
    if bad:
        raise ValueError(f"unknown baseline {bad[0]!r}; expected {', '.join(NAMES)}")
    batches = [b for b in args.batches.split(",") if b]
    parse_count_list(",".join(b for b in batches if b != "max") or "1", "--batches")
    try:
        acceptances = [float(a) for a in args.acceptances.split(",") if a]
    except ValueError:
        raise ValueError(f"--acceptances {args.acceptances!r} is not a list of numbers") from None
    if not acceptances or not all(0 < a <= 1 for a in acceptances):
        raise ValueError(f"--acceptances must be values in (0, 1], got {args.acceptances!r}")
    device = args.device
    if device == "auto":
        device = "cuda" if plan or torch.cuda.is_available() else "cpu"
    if device == "cuda" and not plan and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    dtype = {"auto": None, "bf16": torch.bfloat16, "fp32": torch.float32}.get(args.dtype, "bad")
    if dtype == "bad":
        raise ValueError(f"--dtype must be bf16 or fp32, got {args.dtype!r}")
    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    _, space = load_planner(args.planner)
    return Setup(
        models=models,
        contexts=parse_count_list(args.contexts, "--contexts"),
        batches=batches,
        acceptances=acceptances,
        baselines=names,
        device=device,
        dtype=dtype,
        space=dataclasses.replace(space, drafters=("ngram",), draft_model=None),
        available_bytes=_available(args, device, plan, available_memory),
        args=args,
    )


def _available(args, device: str, plan: bool, available_memory) -> int:
    """``--available-gib`` in bytes (no more than the device offers when one is here), or what
    the device offers."""
    given = args.available_gib
    if given is not None and not given > 0:
        raise ValueError(f"--available-gib must be > 0, got {given}")
    if plan and device == "cuda" and given is None:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--plan for the GPU without one here needs --available-gib")
    if given is None:
        return available_memory(device)[0]
    want = int(given * GIB)
    if not plan:
        have, where = available_memory(device)
        if want > have:
            raise ValueError(
                f"--available-gib {given} exceeds the {have / GIB:.1f} GiB available {where}"
            )
    return want


def oracle_strategy(name: str, acceptance: float | None) -> Strategy:
    """A baseline with the oracle priced as n-gram drafting, ``best:N`` resolved at the
    oracle's acceptance."""
    from ssvkit.planner.rank import concrete

    s = BASELINES[name]
    if acceptance is None:
        return s
    s = dataclasses.replace(s, drafter=DrafterSpec(kind="ngram"))
    return dataclasses.replace(concrete(s, acceptance), name=name)


def backend_of(device: str) -> str:
    """The engine backend a campaign runs on ``device``: triton on CUDA, torch on the CPU."""
    return "triton" if device == "cuda" else "torch"


def planned_strategy(st: Setup, cell: Cell) -> Strategy:
    """``ssv_planned``: the offline best of the planner's space for the cell's model, context
    and batch, with the oracle's acceptance as the drafter's profile."""
    from ssvkit.perfmodel.elementwise import elementwise_of_backend
    from ssvkit.perfmodel.hardware import get_gpu
    from ssvkit.perfmodel.models import get_model
    from ssvkit.planner.profile import RegimeProfile
    from ssvkit.planner.rank import rank, strategy_from_json

    profile = RegimeProfile(
        acceptance={"default": {"ngram": cell.acceptance}}, source="synthetic:oracle"
    )
    model = get_model(cell.model.removeprefix("random:"))
    ranking = rank(
        model,
        get_gpu(st.args.gpu),
        st.space,
        profile,
        batch=cell.batch,
        regimes={"cell": cell.context},
        elementwise=elementwise_of_backend(backend_of(st.device)),
    )
    if "cell" not in ranking["regimes"]:
        raise ValueError(f"the planner ranks nothing here: {ranking.get('skipped')}")
    best = ranking["regimes"]["cell"]["ranking"][0]["strategy"]
    return dataclasses.replace(strategy_from_json(best), name="ssv_planned")


def cell_strategy(st: Setup, cell: Cell) -> Strategy:
    """The strategy a cell decodes with (``ValueError`` when the planner ranks nothing)."""
    if cell.baseline == "ssv_planned":
        return planned_strategy(st, cell)
    return oracle_strategy(cell.baseline, cell.acceptance)


def cache_positions(st: Setup, context: int) -> int:
    """Cache positions per sequence: the prompt, the new tokens and the largest verify tail
    the kernels take (``ssv_planned`` may pick any tree)."""
    from ssvkit.kernels.tree import MAX_TREE_NODES

    return context + st.args.new_tokens + MAX_TREE_NODES + 1


def fitted_context(st: Setup, model: str, asked: int) -> int:
    """``asked``, or the longest prompt whose cache positions the model's positions hold."""
    from ssvkit.engine.checkpoint import resolve_source

    limit = resolve_source(model).config.max_position_embeddings
    return min(asked, limit - (cache_positions(st, asked) - asked))


def max_batch_for(st: Setup, model: str, context: int) -> int:
    """The largest batch every baseline fits (``engine.memory.max_batch``, at most
    ``--max-batch-limit``); 0 when not one sequence does."""
    from ssvkit.engine.checkpoint import resolve_source
    from ssvkit.engine.memory import max_batch

    cfg = resolve_source(model).config
    return min(
        max_batch(
            cfg,
            context,
            oracle_strategy(n, None if n in AUTOREGRESSIVE else st.acceptances[0]),
            st.available_bytes,
            t_max=cache_positions(st, context),
            elem_bytes=st.elem_bytes,
            scores=st.device != "cuda",
            stats=True,
            limit=st.args.max_batch_limit,
        )
        for n in st.baselines
        if n != "ssv_planned"
    )


def memory_plan(st: Setup, cell: Cell, strategy: Strategy):
    """The cell's ``engine.memory.MemoryPlan`` and why it cannot run (None when it can): cache
    positions beyond the model's (None plan), or memory (the plan's refusal)."""
    from ssvkit.engine.checkpoint import resolve_source
    from ssvkit.engine.memory import plan_memory

    cfg = resolve_source(cell.model).config
    t_max = cache_positions(st, cell.context)
    if t_max > cfg.max_position_embeddings:
        return None, f"{t_max} cache positions exceed the model's {cfg.max_position_embeddings}"
    plan = plan_memory(
        cfg,
        strategy,
        batch=cell.batch,
        context=cell.context,
        t_max=t_max,
        available_bytes=st.available_bytes,
        elem_bytes=st.elem_bytes,
        scores=st.device != "cuda",
        stats=strategy.is_sparse,
    )
    return plan, None if plan.fits else plan.refusal()


def cells_for(st: Setup, model: str, asked: int) -> list[Cell]:
    """The cells of one (model, context): every batch x baseline x acceptance."""
    context = fitted_context(st, model, asked)
    out = []
    for label in st.batches:
        if label == "max":
            batch = max(max_batch_for(st, model, context), 1)  # skipped when not one fits
        else:
            batch = int(label)
        for name in st.baselines:
            for a in [None] if name in AUTOREGRESSIVE else st.acceptances:
                out.append(Cell(model, context, batch, label, name, a, asked))
    return out


def campaign_cells(st: Setup) -> list[Cell]:
    """Every cell of the campaign, in its canonical order."""
    return [c for m in st.models for ctx in st.contexts for c in cells_for(st, m, ctx)]


def groups_of(cells: list[Cell]) -> dict[tuple, list[Cell]]:
    """The cells by group, groups and cells in the order given."""
    out: dict[tuple, list[Cell]] = {}
    for c in cells:
        out.setdefault(c.group, []).append(c)
    return out


def run_order(st: Setup, cells: list[Cell]) -> list[Cell]:
    """A group's cells in the order they decode: the canonical one, but each speculative
    baseline's cells deepest tree first, so that the others take their oracle reference from
    its (``engine.oracle.reference``: a shorter continuation is a prefix of a longer one)."""
    from ssvkit.engine.tree import DraftTree

    def depth(c: Cell) -> int:
        try:
            s = cell_strategy(st, c)
        except ValueError:
            return 0
        return DraftTree.from_spec(s.tree, s.traversal).max_depth

    index = {c.slot: i for i, c in enumerate(cells)}
    return sorted(cells, key=lambda c: (NAMES.index(c.baseline), -depth(c), index[c.slot]))
