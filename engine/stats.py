"""Per-round selection statistics of the verify forward, from the queries each layer saw.

For every layer (refresh or reuse alike) the block choice the layer *would* make with its own
queries is recomputed after the round, outside the timed steps: ``block_scores`` and the scored
part of ``engine.attention.select_relative`` for ``sparse``/``dense`` strategies, NSA's block
importance and ``topn_from_scores`` for ``nsa``. From those sets, per sequence and layer
(``SelectionStats.observe`` defines each): ``group_overlap`` (gamma, seed 000),
``layer_overlap`` (seed 001 eq. 7), and PRR's ``predict_hit`` and ``reuse_hit`` (seed 004
eq. 4), the Holt EMA's and last round's coverage of this round's true top-n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from ssvkit.engine.attention import AttentionConfig, select_relative, torch_block_scores
from ssvkit.engine.cache import KVCache
from ssvkit.kernels.block_scores import block_scores
from ssvkit.kernels.select_reference import topn_from_scores
from ssvkit.perfmodel.prr import HoltParams
from ssvkit.perfmodel.strategy import Strategy

DEFAULT_HOLT = HoltParams(alpha=0.5, beta=0.0, phi=1.0)


@dataclass(frozen=True, slots=True)
class RoundSelection:
    """``[B, L]`` arrays (NaN where undefined)."""

    group_overlap: np.ndarray
    layer_overlap: np.ndarray
    predict_hit: np.ndarray
    reuse_hit: np.ndarray

    def row(self, b: int, name: str) -> list[float] | None:
        """Sequence ``b``'s per-layer list, or None when any layer is undefined."""
        v = getattr(self, name)[b]
        return None if np.isnan(v).any() else [round(float(np.clip(x, 0, 1)), 6) for x in v]


def nsa_block_importance(
    q: torch.Tensor, comp_k: torch.Tensor, lens: torch.Tensor, cfg: AttentionConfig, nb: int
) -> torch.Tensor:
    """NSA selection scores ``[B, Hkv, t, nb]``: each compressed token's attention probability
    (summed over the KV head's query heads) credited to every block its window overlaps."""
    b, t, h, d = q.shape
    hkv, nc_max = comp_k.shape[1], comp_k.shape[2]
    n_live = torch.div(lens.long() - cfg.comp_block, cfg.comp_stride, rounding_mode="floor") + 1
    n_live = torch.where(lens.long() >= cfg.comp_block, n_live, 0)
    qf = q.float().view(b, t, hkv, h // hkv, d).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, t, D]
    s = torch.einsum("bkgtd,bknd->bkgtn", qf, comp_k.float()) / math.sqrt(d)
    live = torch.arange(nc_max, device=q.device) < n_live[:, None]  # [B, NC]
    s = s.masked_fill(~live.view(b, 1, 1, 1, nc_max), float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0).sum(2)  # [B, Hkv, t, NC]
    start = torch.arange(nc_max, device=q.device) * cfg.comp_stride
    j = torch.arange(nb, device=q.device)
    overlap = (start[:, None] < (j + 1) * cfg.block_size) & (
        start[:, None] + cfg.comp_block > j * cfg.block_size
    )
    return p @ overlap.float()


def _membership(sel: torch.Tensor, nb: int) -> torch.Tensor:
    """``[..., n]`` block ids (-1 pads) -> ``[..., nb]`` bool membership."""
    m = torch.zeros((*sel.shape[:-1], nb + 1), dtype=torch.bool, device=sel.device)
    m.scatter_(-1, torch.where(sel < 0, nb, sel.long()), True)
    return m[..., :nb]


def _top_mask(values: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the ``k`` largest finite values along the last axis."""
    v = torch.nan_to_num(values, nan=-math.inf)
    idx = torch.topk(v, min(k, v.shape[-1]), dim=-1).indices
    mask = torch.zeros(v.shape, dtype=torch.bool, device=v.device).scatter_(-1, idx, True)
    return mask & torch.isfinite(v)


def _hit(pred: torch.Tensor, true: torch.Tensor, imp: torch.Tensor) -> torch.Tensor:
    """Seed 004 eq. 4 over the last axis, averaged over KV heads: ``[L, B, Hkv, NB]`` ->
    ``[B, L]`` (NaN where no KV head has a true top-n of positive importance)."""
    s = torch.nan_to_num(imp)
    covered = (s * (pred & true)).sum(-1)
    total = (s * true).sum(-1)
    ratio = torch.where(total > 0, covered / torch.where(total > 0, total, 1.0), math.nan)
    return torch.nanmean(ratio, dim=-1).T


def stats_config(strategy: Strategy, attn: AttentionConfig, t: int) -> AttentionConfig:
    """What the statistics select with: the strategy's own sparse attention ``attn``, or for a
    dense strategy its sparse fields (top_n, block_size, window, at least the ``t`` verify
    rows) with mean keys."""
    if strategy.is_sparse:
        return attn
    return AttentionConfig(
        kind="sparse",
        metadata=strategy.metadata if strategy.metadata != "nsa" else "mean",
        top_n=strategy.top_n,
        block_size=strategy.block_size,
        window=max(strategy.window, t),
    )


class SelectionStats:
    """Accumulates the PRR predictor state across rounds and scores each round's selections."""

    def __init__(
        self,
        cfg: AttentionConfig,
        num_layers: int,
        *,
        backend: str,
        holt: HoltParams = DEFAULT_HOLT,
    ) -> None:
        self.cfg, self.num_layers, self.holt = cfg, num_layers, holt
        self.triton = backend == "triton"
        # Holt's state and last round's true top-n, on the queries' device: [L, B, Hkv, NB].
        self._level: torch.Tensor | None = None
        self._trend: torch.Tensor | None = None
        self._prev_true: torch.Tensor | None = None

    def required(self) -> tuple[str, int]:
        """Which summary the statistics read: ``("blocks", block_size)`` or ``("nsa", 0)``."""
        return ("nsa", 0) if self.cfg.kind == "nsa" else ("blocks", self.cfg.block_size)

    @torch.no_grad()
    def observe(
        self,
        queries: list[torch.Tensor],
        cache: KVCache,
        lens: torch.Tensor,
        positions: torch.Tensor,
        group_size: int,
    ) -> RoundSelection:
        """Statistics of one round from each layer's ``q`` ``[B, t, H, D]``; ``lens`` and
        ``positions`` as they were during the verify forward.

        Each layer's selection is recomputed from its own queries: for ``sparse``/``dense``
        strategies ``block_scores`` (mean or quest keys) and the scored part of
        ``engine.attention.select_relative`` (the ``top_n`` picks; the always-attended local
        window is left out); for ``nsa`` NSA's block importance (compressed-branch
        probabilities mapped onto blocks) and ``topn_from_scores`` with the first and last
        blocks forced, as in the refresh path.

        Returns
        -------
        RoundSelection
            Per sequence and layer:

            - ``group_overlap`` (gamma, seed 000): ``|S_i ∩ S_j| / |S_i|`` for each query and
              its neighbour ``j = i + 1`` in traversal order within a group of
              ``group_size`` (any neighbour when it is 1), averaged over pairs and KV heads;
              absent when a round has one query.
            - ``layer_overlap`` (seed 001 eq. 7): Jaccard of each query's set with the previous
              layer's; 0 for layer 0; absent while no block can be selected (a context shorter
              than the window).
            - ``predict_hit`` and ``reuse_hit`` (PRR, seed 004 eq. 4): rounds are the steps;
              the root query's block importance (softmax of the scores over the candidate
              blocks; NSA's probabilities) is the trajectory. Holt's damped-trend EMA
              (``perfmodel.prr``'s equations, fixed ``HoltParams``) predicts this round's top-n
              from the earlier rounds; reuse predicts last round's true top-n. The hit is the
              share of the true top-n's importance the prediction covered, averaged over KV
              heads; absent on the first round.
        """
        cfg = self.cfg
        sets, imps = [], []
        for layer, q in enumerate(queries):
            if cfg.kind == "nsa":
                nb = -(-cache.t_max // cfg.block_size)
                imp = nsa_block_importance(q, cache.comp[layer][0], lens, cfg, nb)
                sel = topn_from_scores(
                    imp, lens, cfg.block_size, top_n=cfg.top_n, num_sink=cfg.num_sink, num_local=1
                )
                root_imp = imp[:, :, 0]
                cand = root_imp > 0
            else:
                meta = cache.meta[layer]
                method = cfg.metadata
                scores = (
                    block_scores(q, meta, lens, method=method)
                    if self.triton
                    else torch_block_scores(q, meta, lens, method)
                )
                nb = scores.shape[-1]
                sel = select_relative(scores, positions, lens, cfg)[..., : cfg.top_n]
                lo = torch.clamp(positions[:, 0] - cfg.window, min=0) // cfg.block_size  # [B]
                cand = torch.arange(nb, device=q.device)[None, None, :] < lo[:, None, None]
                cand = cand & torch.isfinite(scores[:, :, 0])
                root = scores[:, :, 0] / math.sqrt(q.shape[-1])
                root = torch.where(cand, root, float("-inf"))
                root_imp = torch.nan_to_num(torch.softmax(root, dim=-1), nan=0.0)
            sets.append(_membership(sel, nb))
            imps.append(torch.where(cand, root_imp, float("nan")))
        member = torch.stack(sets)  # [L, B, Hkv, t, NB]
        group = self._group_overlap(member, group_size)
        layer = self._layer_overlap(member)
        predict, reuse = self._prr(torch.stack(imps).float())  # [L, B, Hkv, NB]
        return RoundSelection(group, layer, predict, reuse)

    @staticmethod
    def _group_overlap(member: torch.Tensor, group_size: int) -> np.ndarray:
        num_l, b, _, t, _ = member.shape
        if t < 2:
            return np.full((b, num_l), np.nan)
        i = torch.arange(t - 1, device=member.device)
        if group_size > 1:
            i = i[(i % group_size) != group_size - 1]  # pairs inside a group
        if i.numel() == 0:
            return np.full((b, num_l), np.nan)
        a, c = member[:, :, :, i], member[:, :, :, i + 1]
        inter = (a & c).sum(-1).float()
        size = a.sum(-1).float()
        ratio = torch.where(size > 0, inter / size.clamp(min=1), float("nan"))
        return torch.nanmean(ratio.flatten(2), dim=-1).T.cpu().numpy()  # [B, L]

    @staticmethod
    def _layer_overlap(member: torch.Tensor) -> np.ndarray:
        inter = (member[1:] & member[:-1]).sum(-1).float()
        union = (member[1:] | member[:-1]).sum(-1).float()
        jac = torch.where(union > 0, inter / union.clamp(min=1), float("nan"))  # [L-1, B, Hkv, t]
        out = torch.zeros(member.shape[0], member.shape[1], device=member.device)
        out[1:] = torch.nanmean(jac.flatten(2), dim=-1)
        out[:, torch.isnan(out[1:]).all(0)] = float("nan")  # nothing selected anywhere
        return out.T.cpu().numpy()

    def _prr(self, imp: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Holt-EMA and reuse-last-round hit rates ``[B, L]`` for this round, then learn it.
        Computed where the queries are: only the ``[B, L]`` rates reach the host."""
        n = self.cfg.top_n
        true = _top_mask(imp, n)
        num_l, b = imp.shape[:2]
        if self._level is not None and self._level.shape == imp.shape:
            pmask = _top_mask(self._level + self.holt.phi * self._trend, n)
            # One copy to the host for both rates.
            rates = torch.stack([_hit(pmask, true, imp), _hit(self._prev_true, true, imp)])
            predict, reuse = rates.double().cpu().numpy()
            self._update(imp)
        else:
            predict, reuse = np.full((b, num_l), np.nan), np.full((b, num_l), np.nan)
            self._level = imp.clone()
            self._trend = torch.zeros_like(imp)
        self._prev_true = true
        return predict, reuse

    def _update(self, obs: torch.Tensor) -> None:
        """One step of ``perfmodel.prr.holt_predictions``' recursion."""
        a, beta, phi = self.holt.alpha, self.holt.beta, self.holt.phi
        level, trend = self._level, self._trend
        seen = ~torch.isnan(obs)
        new = seen & torch.isnan(level)
        old = seen & ~new
        nxt = torch.where(old, a * obs + (1 - a) * (level + phi * trend), level)
        trend = torch.where(old, beta * (nxt - level) + (1 - beta) * phi * trend, trend)
        self._level = torch.where(new, obs, nxt)
        self._trend = torch.where(new, 0.0, trend)


def batch_mean(sel: RoundSelection | None, name: str, rows: list[int]) -> tuple[float, ...] | None:
    """Per-layer mean of ``name`` over the sequences ``rows`` (None when undefined)."""
    if sel is None:
        return None
    v = getattr(sel, name)[rows]
    if np.isnan(v).all():
        return None
    return tuple(float(x) for x in np.nanmean(v, axis=0))
