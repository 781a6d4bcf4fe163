"""``FakeDecodes``: the planner evaluation's decodes without the engine, for tests of what the
evaluation asks for."""

import zlib

import numpy as np
from ssvkit.perfmodel.strategy import parse_tree
from ssvkit.planner.space import strategy_id
from ssvkit.validation.prompts import prompt_crc32


class FakeDecodes:
    """``validation.bench.run_once`` without the engine. A decode (strategy, prompts, seed, with
    a controller or not) gives the same rounds each time it runs -- each sequence's accepted
    drafts drawn from its own seed, its text the prompt's first tokens, the sequences of a batch
    finishing at their own pace -- and injected round times: its first run takes ``SLOW``
    times as long as its later ones, as a disturbed stretch of the machine makes it. ``batches``
    records every decode's batch of prompts."""

    SLOW = 1.5

    def __init__(self):
        self.runs: dict[str, int] = {}
        self.batches: list[list[list[int]]] = []

    def __call__(self, bench, strategy, prompts, controller=None, record_stats=False, seed=0):
        from ssvkit.engine.results import DecodeResult, RoundRecord
        from ssvkit.perfmodel.acceptance import node_depths_ranks

        self.batches.append(prompts)
        parents = list(parse_tree(strategy.tree))
        depth = max(node_depths_ranks(parents)[0], default=0)
        crcs = "/".join(str(prompt_crc32(p)) for p in prompts)
        key = f"{strategy_id(strategy)}|{crcs}|{seed}|{controller is not None}"
        self.runs[key] = self.runs.get(key, 0) + 1
        rng = np.random.default_rng(zlib.crc32(key.encode()))
        round_s = 1e-3 * (1 + 0.05 * len(parents) + 0.5 * strategy.is_sparse)
        round_s *= self.SLOW if self.runs[key] == 1 else 1.0
        rounds, made = [], [0] * len(prompts)
        while min(made) < bench.max_new_tokens:
            active = [b for b, m in enumerate(made) if m < bench.max_new_tokens]
            acc = [int(rng.integers(0, depth + 1)) for _ in active]
            emitted = [
                min(a + 1, bench.max_new_tokens - made[b]) for a, b in zip(acc, active, strict=True)
            ]
            rounds.append(
                RoundRecord(
                    len(rounds),
                    strategy.name,
                    [len(prompts[b]) + made[b] for b in active],
                    len(parents),
                    acc,
                    {"verify": round_s},
                    round_s,
                    not rounds,
                    emitted=emitted,
                    sequences=active,
                )
            )
            for b, n in zip(active, emitted, strict=True):
                made[b] += n
        texts = [p[:m] for p, m in zip(prompts, made, strict=True)]
        return DecodeResult(texts, rounds, 0.0, "fake", warm_s=1e-3 * bool(controller))
