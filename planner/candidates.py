"""The online controller's view of a ranking: per regime, the candidates it re-scores and
what it reads of each, worked out once.

A re-score only recomputes tokens per round: a candidate's round time (the step model's)
depends on acceptance only through the loop's host work per kept token of an n-gram drafter
(``perfmodel.loop_host``, a few percent of a round), so ``CandidateBook`` scores it once per
regime at the profile's acceptance (a
full ``planner.rank.score`` call takes ~15-30 ms of host time, more than ten 1-ms decode
rounds), and memoises every per-strategy look-up the controller makes per round (strategy
ids, profiled alphas, attention factors, the shadow's reference candidates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.strategy import Strategy, chain_length, parse_tree
from ssvkit.perfmodel.tree_tokens import expected_tokens_interp
from ssvkit.planner.profile import REGIMES, RegimeProfile, regime_of
from ssvkit.planner.rank import score, strategy_from_json
from ssvkit.planner.space import strategy_id


@dataclass(slots=True)
class Known:
    """What the controller asks of one strategy every round, worked out once: its id, drafter
    kind, chain length (``chain_length``), and per regime its profiled alpha and attention
    factor."""

    sid: str
    kind: str
    chain: int
    alpha: dict[str, float] = field(default_factory=dict)
    factor: dict[tuple, float] = field(default_factory=dict)  # (regime, drafter) -> factor


@dataclass(slots=True)
class Now:
    """What every round works out the same way while the current strategy (this very object),
    the context's ranked regime and the shadowed chain lengths stay: contexts in ``(lo, hi]``
    fall in ``regime``; ``expected``: the strategy's profiled alpha there; ``refs``: per
    shadow key (``CandidateBook.shadow_keys``: a shadowed kind's reference chain, or a walked
    tree's best-ranked candidate), the key, that strategy, its chain length (0 for a tree),
    attention factor and profiled alpha, and the current strategy's attention factor for its
    kind."""

    strategy: Strategy
    lo: float
    hi: float
    regime: str
    lens: tuple[tuple[str, int], ...]
    known: Known
    expected: float
    refs: tuple[tuple[object, Strategy, int, float, float, float], ...]
    # ``CandidateBook.trunc_rows``: the current chain's drafter's shorter chains among the
    # candidates (id, strategy, chain length, predicted round time) and the current
    # strategy's round time.
    trunc: tuple[tuple[tuple[str, Strategy, int, float], ...], float] | None = None


class CandidateBook:
    """Per regime of ``ranking``: the candidates, their rows and round times, the shadow's
    reference candidates and the probe's strategy, each computed on first use."""

    def __init__(
        self,
        ranking: dict,
        model: ModelSpec,
        gpu: GpuSpec,
        profile: RegimeProfile,
        batch: int,
        num_candidates: int,
    ):
        self.ranking, self.model, self.gpu, self.profile = ranking, model, gpu, profile
        self.batch, self.num_candidates = batch, num_candidates
        # Candidates are scored as the ranking scored its strategies; a ranking that names no
        # implementation was priced before the step model knew the fused kernels: torch's ops.
        self.elementwise = ranking.get("elementwise", "torch")
        self._cands: dict[str, dict[str, Strategy]] = {}
        self._refs: dict[tuple, dict[str, Strategy]] = {}  # shadow_refs
        self._keys: dict[tuple, tuple] = {}  # shadow_keys
        self._probes: dict[tuple, Strategy | None] = {}  # probe_strategy
        self._round_cache: dict[str, dict[str, float]] = {}
        self._cand_rows: dict[str, list[tuple]] = {}  # rows, per regime
        # ``known``: by value, and by identity (``id`` -> (strategy, record); the strategy
        # held keeps its id from being reused).
        self._known_of: dict[Strategy, Known] = {}
        self._known_id: dict[int, tuple[Strategy, Known]] = {}

    def known(self, s: Strategy) -> Known:
        """``s``'s record, looked up by identity first: the loop hands the controller back the
        strategy object it installed round after round, and hashing a ``Strategy`` (by value:
        its 15 fields and its drafter's) costs more than the rest of a quiet round."""
        hit = self._known_id.get(id(s))
        if hit is not None and hit[0] is s:
            return hit[1]
        known = self._known_of.get(s)
        if known is None:
            known = Known(strategy_id(s), s.drafter.kind, chain_length(s.tree))
            self._known_of[s] = known
        if len(self._known_id) >= 4096:  # a caller building a new object per round
            self._known_id.clear()
        self._known_id[id(s)] = (s, known)
        return known

    def sid(self, s: Strategy) -> str:
        """``strategy_id``, memoised (``known``): it hashes the strategy's JSON (~20 us), and
        the controller needs the current one's every round."""
        return self.known(s).sid

    def alpha_for(self, regime: str, s: Strategy) -> float:
        """``profile.alpha_for``, memoised per strategy and regime."""
        per_regime = self.known(s).alpha
        a = per_regime.get(regime)
        if a is None:
            a = per_regime[regime] = self.profile.alpha_for(regime, s)
        return a

    def factor(self, regime: str, s: Strategy, drafter: str | None = None) -> float:
        """``profile.attention_factor`` (for ``drafter``, default ``s``'s), memoised per
        strategy, regime and drafter."""
        memo = self.known(s).factor
        key = (regime, drafter)
        f = memo.get(key)
        if f is None:
            f = memo[key] = self.profile.attention_factor(regime, s, drafter)
        return f

    def ranked_regime(self, context_len: int) -> str:
        """The context's regime, or the ranked regime nearest to it (a sequence can grow past
        the regimes the ranking holds)."""
        regimes = self.ranking["regimes"]
        regime = regime_of(context_len)
        if regime in regimes:
            return regime
        return min(regimes, key=lambda r: abs(regimes[r]["context_len"] - context_len))

    def candidates(self, regime: str) -> dict[str, Strategy]:
        """The regime's top candidates, plus the best-ranked strategy of every (drafter, tree):
        a change in acceptance mostly moves the best tree, which the top of one ranking may
        not hold."""
        if regime not in self._cands:
            ranked = self.ranking["regimes"][regime]["ranking"]
            picked = ranked[: self.num_candidates]
            seen = set()
            for r in ranked:
                key = (r["strategy"]["drafter"]["kind"], r["strategy"]["tree"])
                if key not in seen:
                    seen.add(key)
                    picked.append(r)
            strategies = (strategy_from_json(r["strategy"]) for r in picked)
            self._cands[regime] = {strategy_id(c): c for c in strategies}
        return self._cands[regime]

    def round_s(self, regime: str, strategies: list[Strategy]) -> dict[str, float]:
        """Predicted round time (the step model's, the loop's host time in it) per strategy at
        the regime's ranked context, computed once per strategy."""
        cache = self._round_cache.setdefault(regime, {})
        missing = [s for s in strategies if self.sid(s) not in cache]
        if missing:
            ctx = self.ranking["regimes"][regime]["context_len"]
            scored, _ = score(
                self.model,
                self.gpu,
                missing,
                ctx,
                self.profile,
                regime,
                self.batch,
                elementwise=self.elementwise,
                loop="serial",  # the engine's rounds are serial under an online controller
            )
            cache.update({strategy_id(x.strategy): x.round_s for x in scored})
        return cache

    def rows(self, regime: str, current: Strategy) -> list[tuple]:
        """What a re-score reads of each candidate, worked out once per regime: id, strategy,
        drafter kind, chain length, attention factor, profiled alpha, predicted round time.
        The current strategy is one of them (the last one when it is no candidate)."""
        rows = self._cand_rows.get(regime)
        cands = self.candidates(regime)
        if rows is None:
            rows = self._cand_rows[regime] = self._make_rows(regime, list(cands.values()))
        if self.sid(current) not in cands:
            rows = rows + self._make_rows(regime, [current])
        return rows

    def _make_rows(self, regime: str, strategies: list[Strategy]) -> list[tuple]:
        round_s = self.round_s(regime, strategies)
        return [
            (
                k.sid,
                c,
                k.kind,
                k.chain,
                self.factor(regime, c),
                self.alpha_for(regime, c),
                round_s[k.sid],
            )
            for c, k in ((c, self.known(c)) for c in strategies)
        ]

    def shadow_refs(self, regime: str, lens: tuple) -> dict[str, Strategy]:
        """Per shadowed drafter kind (``lens``: ``ShadowTracker.lens``), its best-ranked chain
        among the regime's candidates: what its shadow is compared with (its profile) and what
        shifts its other trees. Memoised: the dictionary itself, not to be changed."""
        key = (regime, lens)
        refs = self._refs.get(key)
        if refs is None:  # depends on the regime and the shadowed chain lengths only
            refs = {}
            for kind, n, _ in lens:
                for c in self.candidates(regime).values():
                    if c.drafter.kind == kind and 1 <= chain_length(c.tree) <= n:
                        refs[kind] = c
                        break
            self._refs[key] = refs
        return refs

    def shadow_keys(self, regime: str, lens: tuple) -> tuple[tuple, ...]:
        """What a rising shadow is watched on: per shadowed drafter kind, its reference chain
        (``shadow_refs``; key: the kind), and per tree its shadow walks, the regime's
        best-ranked candidate of that kind on it (key: (kind, tree)). Memoised."""
        key = (regime, lens)
        keys = self._keys.get(key)
        if keys is None:
            out = list(self.shadow_refs(regime, lens).items())
            for kind, _, trees in lens:
                for spec in trees:
                    ref = next(
                        (
                            c
                            for c in self.candidates(regime).values()
                            if c.drafter.kind == kind and c.tree == spec
                        ),
                        None,
                    )
                    if ref is not None:
                        out.append(((kind, spec), ref))
            keys = self._keys[key] = tuple(out)
        return keys

    def probe_strategy(self, regime: str, lens: tuple) -> Strategy | None:
        """The regime's best-ranked strategy that drafts with a drafter the shadow does not
        cover (None when there is none: the shadow observes the others every round)."""
        shadowed = self.shadow_refs(regime, lens)
        key = (regime, tuple(shadowed))
        if key not in self._probes:  # depends on the regime and the shadowed kinds only
            self._probes[key] = None
            for r in self.ranking["regimes"][regime]["ranking"]:
                s = strategy_from_json(r["strategy"])
                if parse_tree(s.tree) and s.drafter.kind not in shadowed:
                    self._probes[key] = s
                    break
        return self._probes[key]

    def now(self, s: Strategy, context_len: int, lens: tuple) -> Now:
        """``Now`` of ``s`` at ``context_len``, with the shadowed chain lengths ``lens``."""
        regime = self.ranked_regime(context_len)
        lo, hi = context_len, context_len  # the nearest ranked regime: this context only
        if regime == regime_of(context_len):
            bounds = [-math.inf, *REGIMES.values()]
            i = list(REGIMES).index(regime)
            lo, hi = bounds[i], bounds[i + 1] if i + 1 < len(REGIMES) else math.inf
        refs = tuple(
            (
                skey,
                ref,
                self.known(ref).chain,
                self.factor(regime, ref),
                self.alpha_for(regime, ref),
                self.factor(regime, s, ref.drafter.kind),
            )
            for skey, ref in self.shadow_keys(regime, lens)
        )
        return Now(s, lo, hi, regime, lens, self.known(s), self.alpha_for(regime, s), refs)

    def trunc_rows(self, now: Now, regime: str):
        """(rows, round time of the current strategy): per candidate chain of the current
        chain's drafter no longer than it, at the same attention factor (so the same
        acceptance), not the current strategy itself, and per candidate that drafts nothing
        (chain length 0: one token every round, whatever the text): its id, strategy, chain
        length and predicted round time. Memoised on ``now``."""
        if now.trunc is None:
            rows = self.rows(regime, now.strategy)
            sid_now, k_now = now.known.sid, now.known.chain
            f_now = self.factor(regime, now.strategy)
            round_now = next(r[6] for r in rows if r[0] == sid_now)
            trunc = tuple(
                (sid, c, chain, round_s)
                for sid, c, kind, chain, factor, _, round_s in rows
                if sid != sid_now
                and (
                    (kind == now.known.kind and 1 <= chain <= k_now and factor == f_now)
                    or not parse_tree(c.tree)
                )
            )
            now.trunc = (trunc, round_now)
        return now.trunc

    def warm(self) -> None:
        """Score every ranked regime's candidates and tabulate their trees' expected tokens
        now, before decoding starts (tens of ms per tree the first time), so that no round
        of the loop pays for it."""
        for regime in self.ranking["regimes"]:
            cands = list(self.candidates(regime).values())
            self.round_s(regime, cands)
            for c in cands:
                expected_tokens_interp(c.tree, 0.5)
