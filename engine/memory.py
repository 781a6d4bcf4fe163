"""What a decode run holds in device memory, so that one that cannot fit is refused before any
model is built, and a campaign can pick the largest batch that fits.

A run holds the weights of its models, their KV caches (``[L, 2, B, Hkv, T_max, D]``), the
cache summaries its attention reads (sparse: fp32 block keys ``[L, B, Hkv, NB, D]`` per
metadata kind; NSA: compressed keys and values ``[L, B, Hkv, NC, D]``), and one of two
transient peaks that never coexist: prefill (``prefill_token_budget`` tokens per forward, each
carrying ``prefill_bytes_per_token`` of activations, plus the last position's logits) and the
verify step (the tree's rows x vocabulary logits in the model dtype, their fp32 copy and the
acceptance's fp32 probabilities; the block scores of a sparse selection). The activation counts
are upper bounds of the live tensors of one layer: the allocator reuses each layer's buffers
for the next, so the peak does not grow with depth.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

from ssvkit.engine.config import ModelConfig
from ssvkit.perfmodel.strategy import Strategy

# Share of the memory left after the resident tensors that a prefill forward may fill: the
# rest absorbs the allocator's fragmentation and the attention kernels' workspaces.
PREFILL_SHARE = 0.5
# Fewest tokens per prefill forward the budget falls to: below this a long prompt takes
# thousands of launch-bound forwards, so a run that cannot afford it is refused.
MIN_PREFILL_TOKENS = 1024
# Share of the device's (or the host's free) memory a run may plan to use.
USABLE_SHARE = 0.9
GIB = 2**30


def prefill_bytes_per_token(cfg: ModelConfig, elem_bytes: int, scores_context: int = 0) -> int:
    """Activation bytes one prompt token holds during a prefill forward (one layer's worth).

    ``elem_bytes`` x (3 hidden (residual stream, normed input, the block's output) + the fused
    q/k/v projection + the rotated q and the attention output (2 H D) + 3 intermediate (the
    fused gate/up projection and ``silu(gate) * up``)). ``scores_context`` > 0 adds the fp32
    scores and their softmax over that many keys per query head, for attention that
    materialises them (SDPA's math path, the CPU); flash attention keeps none."""
    h, hkv, d = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
    width = 3 * cfg.hidden_size + (h + 2 * hkv) * d + 2 * h * d + 3 * cfg.intermediate_size
    return elem_bytes * width + 2 * 4 * h * scores_context


def prefill_token_budget(
    cfg: ModelConfig, elem_bytes: int, free_bytes: int, scores_context: int = 0
) -> int:
    """Tokens per prefill forward (rows x chunk) that fill ``PREFILL_SHARE`` of ``free_bytes``
    with activations, and at least ``MIN_PREFILL_TOKENS``."""
    per_token = prefill_bytes_per_token(cfg, elem_bytes, scores_context)
    return max(MIN_PREFILL_TOKENS, int(free_bytes * PREFILL_SHARE) // per_token)


def kv_cache_bytes(cfg: ModelConfig, batch: int, t_max: int, elem_bytes: int) -> int:
    """The KV cache ``[L, 2, B, Hkv, T_max, D]``."""
    return 2 * cfg.num_layers * batch * cfg.num_kv_heads * t_max * cfg.head_dim * elem_bytes


def summaries_bytes(cfg: ModelConfig, strategy: Strategy, batch: int, t_max: int, elem_bytes: int):
    """The cache summaries ``strategy``'s attention reads (0 for dense): block keys per layer,
    an fp32 value's four bytes in two bf16 parts (``kernels.block_metadata``), one tensor per
    metadata kind (mean; quest keeps min and max), or NSA's compressed keys and values in the
    cache dtype."""
    if not strategy.is_sparse:
        return 0
    per_row = cfg.num_layers * batch * cfg.num_kv_heads * cfg.head_dim
    if strategy.metadata == "nsa":
        windows = max(1, (t_max - strategy.comp_block) // strategy.comp_stride + 1)
        return 2 * per_row * windows * elem_bytes
    kinds = 2 if strategy.metadata == "quest" else 1
    return kinds * per_row * math.ceil(t_max / strategy.block_size) * 4


def verify_bytes(
    cfg: ModelConfig, strategy: Strategy, batch: int, t_max: int, rows: int, elem_bytes: int
) -> int:
    """The verify step's transient tensors for ``rows`` tree rows per sequence: the logits in
    the model dtype, their fp32 copy and the fp32 probabilities of acceptance; one layer's
    activations; for sparse attention the fp32 block scores ``[B, Hkv, rows, NB]``."""
    logits = batch * rows * cfg.vocab_size * (elem_bytes + 4 + 4)
    act = batch * rows * prefill_bytes_per_token(cfg, elem_bytes)
    scores = 0
    if strategy.is_sparse:
        blocks = math.ceil(t_max / strategy.block_size)
        scores = batch * cfg.num_kv_heads * rows * blocks * 4
    return logits + act + scores


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Bytes a run holds, item by item, against what the device offers."""

    batch: int = field(metadata={"help": "sequences decoded together"})
    context: int = field(metadata={"help": "prompt tokens per sequence"})
    t_max: int = field(metadata={"help": "cache positions per sequence"})
    weights_bytes: int = field(metadata={"help": "the target's weights"})
    kv_bytes: int = field(metadata={"help": "the target's KV cache"})
    summaries_bytes: int = field(metadata={"help": "block metadata / compressed KV"})
    draft_bytes: int = field(metadata={"help": "the draft model's weights and KV cache"})
    verify_bytes: int = field(metadata={"help": "the verify step's transient tensors"})
    prefill_tokens: int = field(metadata={"help": "tokens per prefill forward (rows x chunk)"})
    prefill_bytes: int = field(metadata={"help": "a prefill forward's activations and logits"})
    available_bytes: int = field(metadata={"help": "memory the run may use"})

    @property
    def resident_bytes(self) -> int:
        """What stays allocated for the whole run."""
        return self.weights_bytes + self.kv_bytes + self.summaries_bytes + self.draft_bytes

    @property
    def need_bytes(self) -> int:
        """The peak: the resident tensors plus the larger of the two transient peaks."""
        return self.resident_bytes + max(self.prefill_bytes, self.verify_bytes)

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.available_bytes

    def refusal(self) -> str:
        """One line: the batch and context, the GiB needed item by item, the GiB available."""
        items = ", ".join(
            f"{name} {b / GIB:.1f}"
            for name, b in (
                ("weights", self.weights_bytes),
                ("KV", self.kv_bytes),
                ("summaries", self.summaries_bytes),
                ("draft", self.draft_bytes),
                (f"prefill at {self.prefill_tokens} tokens", self.prefill_bytes),
                ("verify", self.verify_bytes),
            )
            if b
        )
        return (
            f"batch {self.batch} at context {self.context} needs {self.need_bytes / GIB:.1f} GiB "
            f"({items}), {self.available_bytes / GIB:.1f} GiB available"
        )

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "need_bytes": self.need_bytes, "fits": self.fits}


def plan_memory(
    target: ModelConfig,
    strategy: Strategy,
    *,
    batch: int,
    context: int,
    t_max: int,
    available_bytes: int,
    elem_bytes: int = 2,
    draft: ModelConfig | None = None,
    scores: bool = False,
    stats: bool = False,
) -> MemoryPlan:
    """The memory of decoding ``batch`` prompts of ``context`` tokens with ``strategy`` in a
    cache of ``t_max`` positions. ``draft`` counts when the strategy drafts with the draft
    model; ``scores`` when prefill attention materialises its scores (the CPU); ``stats``
    when selection statistics are recorded (a dense strategy then keeps mean block keys too,
    ``engine.stats.stats_config``)."""
    from ssvkit.engine.tree import DraftTree

    rows = DraftTree.from_spec(strategy.tree, strategy.traversal).num_nodes
    drafts = strategy.drafter.kind == "draft_model" and rows > 1 and draft is not None
    models = [target] + ([draft] if drafts else [])
    weights = target.num_params() * elem_bytes
    kv = kv_cache_bytes(target, batch, t_max, elem_bytes)
    draft_b = (
        draft.num_params() * elem_bytes + kv_cache_bytes(draft, batch, t_max, elem_bytes)
        if drafts
        else 0
    )
    summarised = strategy
    if stats and not strategy.is_sparse:
        summarised = dataclasses.replace(strategy, attention="sparse", metadata="mean")
    summaries = summaries_bytes(target, summarised, batch, t_max, elem_bytes)
    room = max(0, available_bytes - weights - kv - summaries - draft_b)
    scores_context = t_max if scores else 0
    # Every model prefills in turn through the same budget: the widest sets it.
    widest = max(models, key=lambda c: prefill_bytes_per_token(c, elem_bytes, scores_context))
    per_token = prefill_bytes_per_token(widest, elem_bytes, scores_context)
    tokens = min(batch * context, prefill_token_budget(widest, elem_bytes, room, scores_context))
    logits = batch * max(c.vocab_size for c in models) * (elem_bytes + 4)
    return MemoryPlan(
        batch=batch,
        context=context,
        t_max=t_max,
        weights_bytes=weights,
        kv_bytes=kv,
        summaries_bytes=summaries,
        draft_bytes=draft_b,
        verify_bytes=verify_bytes(target, strategy, batch, t_max, rows, elem_bytes),
        prefill_tokens=tokens,
        prefill_bytes=tokens * per_token + logits,
        available_bytes=available_bytes,
    )


def max_batch(
    target: ModelConfig,
    context: int,
    strategy: Strategy,
    available_bytes: int,
    *,
    t_max: int,
    elem_bytes: int = 2,
    draft: ModelConfig | None = None,
    scores: bool = False,
    stats: bool = False,
    limit: int = 1 << 16,
) -> int:
    """The largest batch (<= ``limit``) whose ``plan_memory`` fits; 0 when not even one
    sequence does. The need grows with the batch, so a bisection finds it."""

    def fits(b: int) -> bool:
        return plan_memory(
            target,
            strategy,
            batch=b,
            context=context,
            t_max=t_max,
            available_bytes=available_bytes,
            elem_bytes=elem_bytes,
            draft=draft,
            scores=scores,
            stats=stats,
        ).fits

    if not fits(1):
        return 0
    lo, hi = 1, limit + 1  # fits(lo), and hi is past the limit or does not fit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def available_memory(device: str) -> tuple[int, str]:
    """Bytes a run on ``device`` may plan to use (``USABLE_SHARE`` of the GPU's memory, or of
    the host's free memory) and where they are, in words."""
    if device == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        return int(USABLE_SHARE * total), "on the GPU"
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return int(USABLE_SHARE * free), "free on the host"


def free_memory(device) -> int:
    """Bytes free for new tensors on ``device`` now: the driver's free memory plus what torch
    holds cached but unused (CUDA), or the host's free memory."""
    import torch

    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
