"""Whether the engine can run a strategy with given models, before any model is loaded: its
draft tree and attention, or a one-line ``ValueError`` saying why not. The command line and
the campaigns check their strategies with it before they build an engine. ``check_room``
checks that a cache holds a run of the strategy's tree."""

from __future__ import annotations

from ssvkit.engine.attention import AttentionConfig
from ssvkit.engine.config import ModelConfig
from ssvkit.engine.tree import DraftTree
from ssvkit.perfmodel.strategy import Strategy


def check_strategy(
    strategy: Strategy,
    target: ModelConfig,
    draft: ModelConfig | None,
    backend: str,
) -> tuple[DraftTree, AttentionConfig]:
    """The tree and attention of ``strategy``, or a one-line ``ValueError`` saying why the
    engine cannot run it with these models (no model is loaded; nothing touches the GPU)."""
    tree = DraftTree.from_spec(strategy.tree, strategy.traversal)
    attn = AttentionConfig.from_strategy(strategy)
    attn.check_tree(tree.num_nodes, target.gqa_group)
    kind = strategy.drafter.kind
    used = [target]
    if tree.num_drafts:
        if kind == "eagle":
            raise ValueError(
                "the engine has no EAGLE heads; use --drafter-kind draft_model, ngram or "
                "self_sparse"
            )
        if kind == "draft_model":
            if draft is None:
                raise ValueError("drafter draft_model needs a draft model (--draft-model)")
            if draft.vocab_size != target.vocab_size:
                raise ValueError(
                    f"draft vocabulary {draft.vocab_size} differs from the target's "
                    f"{target.vocab_size}"
                )
            used.append(draft)
        if kind == "self_sparse" and tree.max_children > 1:
            raise ValueError("the self_sparse drafter drafts chains only (tree chain:K)")
    if backend == "triton":
        for cfg in used:
            d = cfg.head_dim
            if d < 16 or d > 256 or d & (d - 1):
                raise ValueError(
                    f"the Triton kernels need a power-of-two head_dim in [16, 256], got {d}"
                )
    return tree, attn


def check_room(tree: DraftTree, t_max: int, prompt_len: int, max_new_tokens: int) -> None:
    """``ValueError`` unless a cache of ``t_max`` positions holds a prompt of ``prompt_len``
    tokens, ``max_new_tokens`` and a verify tail of ``tree`` past them. A sequence stops at
    ``max_new_tokens`` (its kept count is capped there, ``AcceptGraph.accept``) while the
    batch's slower ones go on, so its cache length ends at most at
    ``prompt + max_new_tokens - 1`` and each later round still writes its tail of
    ``tree.num_nodes`` entries after that."""
    need = prompt_len + max_new_tokens + tree.num_nodes - 1
    if need > t_max:
        raise ValueError(
            f"a prompt of {prompt_len} tokens + {max_new_tokens} new tokens + a verify tail of "
            f"{tree.num_nodes} need {need} cache positions; the cache holds {t_max}"
        )
