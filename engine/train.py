"""``train-tiny``: a byte-level target (~13M parameters, GQA 4:1) and a ~1.3M-parameter draft,
trained together on the installed Python sources, saved in Hugging Face format.

Recipe (one H100, <= 5 minutes wall clock in total): random windows of ``context + 1`` bytes of
the train stream (``engine.corpus``; whole packages concatenated, so long-range structure
survives), both models on the same batches, AdamW (betas 0.9/0.95, weight decay 0.1), linear
warm-up then cosine decay over the *time* budget, bf16 autocast, gradient clipping at 1, causal
flash attention through SDPA. At the end: validation loss (nats/byte) of both models, the greedy
agreement of the draft with the target on validation windows, and both checkpoints in bf16
(``config.json`` + ``model.safetensors``). A sizing note: 13.4M + 1.3M bf16 parameters are
~29 MB, inside the repository's 32 MB budget for the pair.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from ssvkit.engine.checkpoint import ModelSource, build_model, save_checkpoint
from ssvkit.engine.config import ModelConfig
from ssvkit.engine.corpus import VOCAB_SIZE, collect_documents, split_streams
from ssvkit.engine.model import CausalLM
from ssvkit.engine.settings import TrainConfig

TARGET = ModelConfig(
    vocab_size=VOCAB_SIZE,
    hidden_size=512,
    intermediate_size=640,
    num_layers=8,
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=64,
    rope_theta=500000.0,
    max_position_embeddings=32768,
)
DRAFT = ModelConfig(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=512,
    num_layers=2,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=64,
    rope_theta=500000.0,
    max_position_embeddings=32768,
)


class _CausalSelfAttention:
    """KV sink and ``attend`` for training (torch backend): each layer attends causally to its
    own k, v."""

    def __init__(self) -> None:
        self.k = self.v = None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            self.k.transpose(1, 2),
            self.v.transpose(1, 2),
            is_causal=True,
            enable_gqa=True,
        )
        return o.transpose(1, 2)


def lm_loss(model: CausalLM, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean next-byte cross-entropy (nats) of ``window`` ``[B, T + 1]`` and the logits."""
    x, y = window[:, :-1], window[:, 1:]
    pos = torch.arange(x.shape[1], device=x.device).expand_as(x)
    ctx = _CausalSelfAttention()
    logits, _ = model(x, pos, ctx, ctx.attend)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)), logits


def sample_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """``batch`` random windows of ``length`` bytes of the uint8 ``stream`` (on its device)."""
    hi = stream.numel() - length
    if hi <= 0:
        raise ValueError(f"the stream has {stream.numel()} bytes, fewer than a window {length}")
    starts = torch.randint(0, hi, (batch,), generator=gen, device="cpu").to(stream.device)
    idx = starts[:, None] + torch.arange(length, device=stream.device)
    return stream[idx].long()


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine to ``min_lr_ratio`` over the time."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


def _optimizer(model: CausalLM, cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest}]
    fused = next(model.parameters()).is_cuda
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0, fused=fused)


@torch.no_grad()
def evaluate(target: CausalLM, draft: CausalLM, windows: torch.Tensor, autocast) -> dict:
    """Validation loss of both models and the draft's greedy agreement with the target."""
    out = {"target_val_loss": 0.0, "draft_val_loss": 0.0, "greedy_agreement": 0.0}
    for w in windows.split(1):
        with autocast():
            lt, logits_t = lm_loss(target, w)
            ld, logits_d = lm_loss(draft, w)
        out["target_val_loss"] += lt.item() / len(windows)
        out["draft_val_loss"] += ld.item() / len(windows)
        agree = (logits_t.argmax(-1) == logits_d.argmax(-1)).float().mean().item()
        out["greedy_agreement"] += agree / len(windows)
    return out


def train_tiny(
    cfg: TrainConfig,
    *,
    out_dir: str | Path | None,
    device: str = "cuda",
    target_config: ModelConfig = TARGET,
    draft_config: ModelConfig = DRAFT,
    roots: list[Path] | None = None,
    log=print,
) -> dict:
    """Train the pair and (when ``out_dir`` is given) save it; returns the summary dict.

    Examples
    --------
    On a GPU::

        summary = train_tiny(TrainConfig(), out_dir="engine/checkpoints")
    """
    t_start = time.perf_counter()
    dev = torch.device(device)
    torch.manual_seed(cfg.seed)
    train_s, val_s, corpus = _corpus(cfg, roots, dev, log)
    models = _build_pair(cfg, target_config, draft_config, dev)
    opts = {k: _optimizer(m, cfg) for k, m in models.items()}
    gen = torch.Generator().manual_seed(cfg.seed)
    use_bf16 = dev.type == "cuda"

    def autocast():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16)

    step, losses, train_s_elapsed = _train(models, opts, train_s, cfg, gen, autocast, dev, log)
    for m in models.values():
        m.eval().requires_grad_(False)
    val_gen = torch.Generator().manual_seed(cfg.seed + 17)
    val_len = min(cfg.context + 1, val_s.numel() - 1)
    val = sample_windows(val_s, cfg.val_windows, val_len, val_gen)
    metrics = evaluate(models["target"], models["draft"], val, autocast)
    summary = {
        "steps": step,
        "tokens_trained": step * cfg.batch * cfg.context,
        "train_s": train_s_elapsed,
        "final_train_loss": {k: float(v[-1]) if v else None for k, v in losses.items()},
        **metrics,
        "params": {"target": target_config.num_params(), "draft": draft_config.num_params()},
        "config": dataclasses.asdict(cfg),
        "corpus": corpus,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch_version": torch.__version__,
    }
    if out_dir is not None:
        out = Path(out_dir)
        for name, folder in (("target", "tiny-target"), ("draft", "tiny-draft")):
            save_checkpoint(models[name], out / folder, dtype=torch.bfloat16)
    summary["total_s"] = time.perf_counter() - t_start
    if out_dir is not None:
        (Path(out_dir) / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _corpus(cfg: TrainConfig, roots: list[Path] | None, dev: torch.device, log):
    """The train and validation byte streams on ``dev``, and the corpus's summary."""
    docs = collect_documents(roots, max_bytes=cfg.max_corpus_bytes)
    train_np, val_np = split_streams(docs, cfg.seed)
    log(
        f"corpus: {len(docs)} packages, {train_np.size / 1e6:.1f} MB train, "
        f"{val_np.size / 1e6:.2f} MB validation"
    )
    train_s = torch.from_numpy(train_np).to(dev)
    val_s = torch.from_numpy(val_np).to(dev)
    corpus = {
        "packages": len(docs),
        "train_bytes": int(train_np.size),
        "validation_bytes": int(val_np.size),
        "validation_packages": sorted(d.name for d in docs if d.is_validation),
    }
    return train_s, val_s, corpus


def _build_pair(
    cfg: TrainConfig, target_config: ModelConfig, draft_config: ModelConfig, dev: torch.device
) -> dict[str, CausalLM]:
    """The target and the draft, initialised from ``cfg.seed`` and the next seed, in training
    mode."""
    positions = max(cfg.context + 1, target_config.max_position_embeddings)
    models = {}
    for name, mcfg, seed in (
        ("target", target_config, cfg.seed),
        ("draft", draft_config, cfg.seed + 1),
    ):
        m = build_model(ModelSource(name, mcfg, None, seed), max_positions=positions, device=dev)
        models[name] = m.train().requires_grad_(True)
    return models


def _train(models, opts, train_s, cfg: TrainConfig, gen, autocast, dev: torch.device, log):
    """Both models stepped on the same random windows of ``train_s`` until ``max_steps`` or
    the time budget: the steps taken, each model's losses and the seconds it took."""
    step, losses, t0 = 0, {"target": [], "draft": []}, time.perf_counter()
    while step < cfg.max_steps:
        elapsed = time.perf_counter() - t0
        if elapsed >= cfg.time_budget_s:
            break
        window = sample_windows(train_s, cfg.batch, cfg.context + 1, gen)
        lr = lr_at(cfg, step, elapsed / cfg.time_budget_s)
        for name, model in models.items():
            for g in opts[name].param_groups:
                g["lr"] = lr
            with autocast():
                loss, _ = lm_loss(model, window)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            losses[name].append(loss.detach())
        step += 1
        if step % 10 == 0 and dev.type == "cuda":
            torch.cuda.synchronize()  # keep the host within a few steps of the GPU clock
        if step % 100 == 0:
            lt, ld = losses["target"][-1].item(), losses["draft"][-1].item()
            log(f"step {step}  {elapsed:6.1f}s  lr {lr:.2e}  loss target {lt:.3f} draft {ld:.3f}")
    return step, losses, time.perf_counter() - t0
