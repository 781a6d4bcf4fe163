"""The drafters of one engine: one of each kind, built the first time a strategy drafts with it
(the oracle for every strategy when the config gives its acceptance), and the *warm* kinds the
controller declares (``drafter_kinds()``), started with the prompts beside the current one so
that a later switch to one only catches it up (``Drafter.resume``) instead of starting over. A
warm n-gram drafter also scores its shadow acceptance (``engine.ngram``)."""

from __future__ import annotations

import time

import torch
from ssvkit.engine.controller import Controller
from ssvkit.engine.draft_model import ModelDrafter, SelfSparseDrafter
from ssvkit.engine.drafter import Drafter
from ssvkit.engine.ngram import SHADOW_MAX_CHAIN, NgramDrafter
from ssvkit.engine.oracle import OracleDrafter
from ssvkit.engine.runner import ModelRunner
from ssvkit.engine.settings import DecodeConfig
from ssvkit.engine.tree import DraftTree
from ssvkit.perfmodel.strategy import Strategy


class DrafterPool:
    """The drafters an engine has built, by kind, and the kinds started in the current
    generate call."""

    def __init__(
        self,
        target: ModelRunner,
        draft_runner: ModelRunner | None,
        config: DecodeConfig,
        controller: Controller,
    ) -> None:
        self.target, self.draft_runner, self.config = target, draft_runner, config
        self.controller = controller
        declared = getattr(controller, "drafter_kinds", None)
        # Kinds with state of their own to keep warm (self_sparse drafts from the target's
        # cache; a draft model needs its runner).
        self.warm_kinds = tuple(
            k
            for k in (declared() if declared else ())
            if k == "ngram" or (k == "draft_model" and draft_runner is not None)
        )
        self.built: dict[str, Drafter] = {}
        self.started: set[str] = set()  # drafter kinds started in this generate call

    def get(self, strategy: Strategy | None, tree: DraftTree | None, kind: str = "") -> Drafter:
        """The drafter of ``strategy`` (or of ``kind``: draft_model or ngram), built once; the
        oracle for every strategy when the config gives its acceptance."""
        oracle = self.config.oracle_acceptance is not None
        kind = kind or ("oracle" if oracle else strategy.drafter.kind)
        if kind not in self.built:
            temp = self.config.draft_temp
            if kind == "oracle":
                d = OracleDrafter(self.target.device, self.target.config.vocab_size, self.config)
            elif kind == "draft_model":
                d = ModelDrafter(self.draft_runner, temp)
            elif kind == "ngram":
                shadow = SHADOW_MAX_CHAIN if "ngram" in self.warm_kinds else 0
                trees = getattr(self.controller, "shadow_trees", None)
                d = NgramDrafter(
                    self.target.device,
                    self.config.ngram_max_n,
                    shadow,
                    trees if trees and shadow else (),
                    getattr(self.controller, "shadow_sequences", 0),
                )
            else:
                attn = SelfSparseDrafter.attention(
                    self.target.cache.t_max,
                    strategy.drafter.sparsity_ratio,
                    strategy.block_size,
                    max(strategy.window, tree.num_nodes),
                )
                attn.check_tree(tree.num_nodes, self.target.config.gqa_group)
                d = SelfSparseDrafter(self.target, attn, temp)
            self.built[kind] = d
        return self.built[kind]

    def start(self, drafter: Drafter | None, prompts: list[list[int]]) -> None:
        """Start the current ``drafter`` (if any) on the prompts of a new generate call, the
        only kind started in it so far."""
        if drafter is not None:
            drafter.start(prompts)
        self.started = {drafter.kind} if drafter is not None else set()

    def catch_up(self, drafter: Drafter, history: list[list[int]]) -> None:
        """Bring ``drafter`` up to the committed tokens ``history`` mid-generation: a warm one
        (started in this call) with those it lacks, another from scratch."""
        if drafter.kind in self.started:
            drafter.resume(history)
        else:
            drafter.start([h[:-1] for h in history])
            self.started.add(drafter.kind)

    def start_warm(self, prompts: list[list[int]]) -> float:
        """Start the warm drafters that are not the current one; their host wall time."""
        todo = [k for k in self.warm_kinds if k not in self.started]
        if not todo:
            return 0.0
        t0 = time.perf_counter()
        for kind in todo:
            self.get(None, None, kind).start(prompts)
            self.started.add(kind)
        if self.target.device.type == "cuda":
            torch.cuda.synchronize()  # the draft model's prefill runs asynchronously
        return time.perf_counter() - t0

    def shadow(self) -> NgramDrafter | None:
        """The n-gram drafter when it scores a shadow acceptance, else None."""
        ngram = self.built.get("ngram")
        return ngram if ngram is not None and ngram.shadow_chain else None
