"""The planner evaluation's bench: the model runners, one decode and its steady figures, and the
run cache that lets an evaluation cut off by a time limit resume where it stopped.

Tokens/s of every run: generated tokens (every sequence's: a run decodes ``batch`` prompts
together) over round wall time (the shadow's host time included) plus the controller's host
time (``control``; an overlapped controller's calls run inside the next round's wall time,
``control_overlap``, and count there) and switch time, leaving out
round 0 (the first strategy's graph capture) and the later rounds that captured a graph missing
when the run began (``engine.results.RoundRecord.captured``): a server captures its strategies'
graphs before requests arrive, while here a sparse run drops every graph
(``engine.runner.ModelRunner.retain``) and the next run to switch to a strategy captures it
again. ``captures_counted`` gives the figure with those rounds put back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ssvkit.perfmodel.elementwise import elementwise_of_backend
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.hardware import GpuSpec
from ssvkit.perfmodel.models import ModelSpec
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy
from ssvkit.planner.estimators import accepted_histogram
from ssvkit.validation import full_batch
from ssvkit.validation.prompts import prompt_crc32
from ssvkit.validation.records import model_label


def read_runs(lines: list[str], path) -> dict[str, dict]:
    """The runs by key of a run cache's lines (the first, its settings, skipped); a last line
    cut short by a kill is dropped, any other line that is not JSON is an error."""
    runs = {}
    for i, line in enumerate(lines[1:], start=2):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                break  # the run being written when the process was killed
            raise ValueError(f"run cache {str(path)!r}: line {i} is not JSON") from None
        runs[row["key"]] = row["value"]
    return runs


class RunCache:
    """Completed runs by key, appended to a JSONL file as each finishes, so an evaluation cut
    off by a time limit resumes where it stopped (device calls are at most 10 minutes).

    The first line holds the settings the runs were measured under; a cache written under other
    settings is refused. A last line cut short by a kill is dropped (that run goes again)."""

    def __init__(self, path: str | Path, settings: dict):
        self.path = Path(path)
        self.settings = settings
        self.runs: dict[str, dict] = {}
        self.reused = 0
        if self.path.exists() and self.path.stat().st_size:
            self._resume()
        else:
            if self.path.parent and not self.path.parent.exists():
                raise ValueError(f"run cache folder {str(self.path.parent)!r} does not exist")
            self.path.write_text(json.dumps({"settings": self.settings}) + "\n")

    def _resume(self) -> None:
        lines = self.path.read_text().splitlines()
        try:
            head = json.loads(lines[0])
        except json.JSONDecodeError:
            raise ValueError(f"run cache {str(self.path)!r}: first line is not JSON") from None
        if head.get("settings") != self.settings:
            raise ValueError(
                f"run cache {str(self.path)!r} was written for other settings "
                f"({head.get('settings')}); give a new file or the same settings"
            )
        self.runs = read_runs(lines, self.path)
        # Rewritten without a cut-off tail, whole or not at all: a kill here keeps the runs.
        kept = [json.dumps({"settings": self.settings})]
        kept += [json.dumps({"key": k, "value": v}) for k, v in self.runs.items()]
        atomic_write(self.path, "\n".join(kept) + "\n")

    def get(self, key: str, fn) -> dict:
        """The cached value of ``key``, or ``fn()`` -- then appended to the file at once."""
        if key in self.runs:
            self.reused += 1
            return self.runs[key]
        value = fn()
        self.runs[key] = value
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"key": key, "value": value}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return value


@dataclass
class Bench:
    """The runners, decode settings and the models' specs (for the prediction)."""

    target: object  # engine.runner.ModelRunner
    draft: object | None
    model: ModelSpec
    gpu: GpuSpec
    draft_label: str
    max_new_tokens: int = 256
    repeats: int = 2
    # Code prompts each measured strategy decodes, one run each (``measure_windows``).
    measure_texts: int = 5
    # Passes over a phase's runs (``run_passes``): each run's figure is its least disturbed.
    timing_passes: int = 1
    log: object = print
    cache: RunCache | None = None
    temperature: float = 0.0
    # Sequences each decode runs together (the runners' batch): every run decodes this many
    # prompts, and its tokens/s counts all of theirs.
    batch: int = 1
    # ``time.perf_counter()`` after which no new run starts (``run`` raises ``StopAfter``).
    stop_at: float = math.inf

    @property
    def elementwise(self) -> str:
        """How the target's engine runs the element-wise ops (``perfmodel.strategy``)."""
        return elementwise_of_backend(self.target.backend)

    @property
    def loop(self) -> str:
        """How the engine runs a fixed strategy's rounds (``Workload.loop``): pipelined where
        the strategy allows (``engine.pipeline``)."""
        return "pipelined" if self.decode().pipeline else "serial"

    def decode(self, record_stats: bool = False, seed: int = 0):
        from ssvkit.engine.settings import DecodeConfig

        return DecodeConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seed=seed,
            record_stats=record_stats,
        )

    def run(self, key: str, fn, *args, **kwargs) -> dict:
        """``fn(*args, **kwargs)`` (a JSON-able dict of one run's figures), through the cache
        when there is one; ``StopAfter`` instead of a run not in the cache once ``stop_at`` has
        passed."""
        call = functools.partial(fn, *args, **kwargs)
        if self.cache is not None and key in self.cache.runs:
            return self.cache.get(key, call)
        if time.perf_counter() > self.stop_at:
            raise StopAfter(key)
        return call() if self.cache is None else self.cache.get(key, call)

    def runnable(self, s: Strategy) -> str | None:
        """Why the engine cannot run ``s`` (None when it can)."""
        from ssvkit.engine.strategy_check import check_strategy

        try:
            check_strategy(
                s,
                self.target.config,
                self.draft.config if self.draft is not None else None,
                self.target.backend,
            )
        except ValueError as e:
            return str(e)
        return None

    def generate(
        self,
        strategy: Strategy,
        prompts: list[list[int]],
        controller=None,
        record_stats: bool = False,
        seed: int = 0,
    ):
        """One decode of the batch ``prompts`` (``batch`` of them) under ``strategy``
        (``run_once``)."""
        return run_once(self, strategy, prompts, controller, record_stats, seed)

    def drafter(self, kind: str) -> DrafterSpec:
        """The drafter of ``kind`` on this bench (the draft model's checkpoint label)."""
        return DrafterSpec(kind=kind, model=self.draft_label if kind == "draft_model" else None)


def make_bench(
    model: str,
    draft_model: str,
    max_context: int,
    new_tokens: int,
    repeats: int,
    device: str = "auto",
    gpu: str = "h100-sxm",
    temperature: float = 0.0,
    batch: int = 1,
) -> Bench:
    """Target and draft runners (``batch`` sequences, room for ``max_context`` plus the new
    tokens and a tree), bf16 Triton kernels and CUDA graphs on the GPU, fp32 torch on the CPU.
    The models are named by ``model_label``: a checkpoint shipped with the engine reads the
    same on any machine."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    import torch
    from ssvkit.engine.checkpoint import build_model
    from ssvkit.engine.runner import ModelRunner
    from ssvkit.perfmodel.hardware import get_gpu

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    backend = "triton" if cuda else "torch"
    t_max = max_context + new_tokens + 64 + 1
    tsrc, dsrc, spec, draft_label = pair_sources(model, draft_model)
    runners = []
    for src in (tsrc, dsrc):
        m = build_model(src, max_positions=t_max, device=device, dtype=dtype)
        runners.append(ModelRunner(m, batch=batch, t_max=t_max, backend=backend, use_graphs=cuda))
    return Bench(
        target=runners[0],
        draft=runners[1],
        model=spec,
        gpu=get_gpu(gpu),
        draft_label=draft_label,
        max_new_tokens=new_tokens,
        repeats=repeats,
        log=lambda m: print(m, flush=True),
        temperature=temperature,
        batch=batch,
    )


def pair_sources(model: str, draft_model: str):
    """The target's and the draft's sources (``engine.checkpoint.resolve_source``: their
    configs, no weights read), the target's spec named by ``model_label`` and the draft's
    label."""
    from ssvkit.engine.checkpoint import resolve_source
    from ssvkit.perfmodel.models import get_model

    tsrc, dsrc = resolve_source(model), resolve_source(draft_model)
    spec = dataclasses.replace(get_model(str(tsrc.path)), name=model_label(tsrc.path))
    return tsrc, dsrc, spec, model_label(dsrc.path)


def steady_figures(result) -> dict:
    """tokens/s, mean accepted, round count and mean step times (CUDA events on the GPU) of a
    run, without round 0 and without the later rounds that captured a CUDA graph missing when
    the run began (``RoundRecord.captured``; ``capture_rounds``, their wall time
    ``capture_s``), and its full-batch figures where it has full-batch rounds
    (``validation.full_batch.figures``). See the module."""
    later = result.rounds[1:]
    captured = [r for r in later if r.captured]
    rounds = [r for r in later if not r.captured] or result.rounds
    tokens = sum(r.tokens for r in rounds)
    wall = sum(r.wall_s for r in rounds)
    switch = sum(r.step_s.get("switch", 0.0) for r in rounds)
    control = sum(r.step_s.get("control", 0.0) for r in rounds)
    # An overlapped controller's calls ran inside the next round's wall time: counted there.
    overlapped = sum(r.step_s.get("control_overlap", 0.0) for r in rounds)
    full = full_batch.figures(result, len(result.tokens))
    return {
        "loop": result.loop,
        "tokens_per_s": tokens / max(wall + switch + control, 1e-12),
        "tokens": tokens,
        "rounds": len(rounds),
        "wall_s": wall,
        "switch_s": switch,
        "control_s": control,
        "control_overlap_s": overlapped,
        "capture_rounds": len(captured),
        "capture_s": sum(r.wall_s for r in captured),
        "capture_tokens": sum(r.tokens for r in captured),
        "steps_s": {
            k: float(np.mean([r.step_s.get(k, 0.0) for r in rounds]))
            for k in ("draft", "launch", "verify", "accept", "shadow")
        },
        "mean_accepted": float(np.mean([np.mean(r.accepted) for r in rounds])),
        "accepted_hist": accepted_histogram(m for r in rounds for m in r.accepted),
        **({} if full is None else {"full_batch": full}),
    }


def run_once(
    bench: Bench,
    strategy: Strategy,
    prompts: list[list[int]],
    controller=None,
    record_stats: bool = False,
    seed: int = 0,
):
    """One ``generate`` call on the batch ``prompts``, with Python's garbage collector held off
    while it runs (as a benchmark harness does: a collection pause of tens of ms in a 50 ms run
    is noise, not the strategy). Every decode of the evaluation goes through here."""
    if len(prompts) != bench.batch:
        raise ValueError(
            f"a decode of batch {bench.batch} needs {bench.batch} prompts, got {len(prompts)}"
        )
    from ssvkit.engine.loop import Engine

    eng = Engine(
        bench.target,
        strategy,
        bench.decode(record_stats, seed),
        draft_runner=bench.draft,
        controller=controller,
    )
    with collection_held():
        return eng.generate(prompts)


@contextlib.contextmanager
def collection_held():
    """The garbage collector held off inside the block (after one full collection, so none
    pauses the code timed there: a collection is not the code under test), then as it was."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def captures_counted(run: dict) -> float:
    """A run's tokens/s with the rounds that captured a CUDA graph inside it put back
    (``steady_figures`` leaves them out; see the module): its tokens and theirs over its time
    and theirs. Runs cached before ``capture_tokens`` was recorded count those rounds' time
    only (a few tokens of a few hundred)."""
    time_s = run["tokens"] / run["tokens_per_s"] + run.get("capture_s", 0.0)
    return (run["tokens"] + run.get("capture_tokens", 0)) / time_s


def steady_run(
    bench: Bench,
    strategy: Strategy,
    prompts: list[list[int]],
    seed: int = 0,
    keep_text: bool = False,
) -> dict:
    """One run's steady figures (the batch ``prompts`` decoded together); with ``keep_text``,
    the tokens it decoded too and the CRC-32 of their prompts (the prompts come from the
    installed packages' sources, which differ between machines, so a walk of a text elsewhere
    checks it): ``text`` and ``prompt_crc32`` at batch 1, ``texts`` and ``prompt_crc32s``, one
    per sequence, at batch > 1 (``kept_texts`` reads either)."""
    result = bench.generate(strategy, prompts, seed=seed)
    fig = steady_figures(result)
    if keep_text:
        texts = [[int(t) for t in toks] for toks in result.tokens]
        crcs = [prompt_crc32(p) for p in prompts]
        if len(prompts) == 1:
            fig["text"], fig["prompt_crc32"] = texts[0], crcs[0]
        else:
            fig["texts"], fig["prompt_crc32s"] = texts, crcs
    return fig


def kept_texts(fig: dict) -> list[tuple[int | None, list[int]]]:
    """(prompt CRC-32, text) of each sequence whose text a run kept (``steady_run``); the CRC
    None for runs cached before it was recorded, nothing for a run that kept no text."""
    if "texts" in fig:
        return list(zip(fig["prompt_crc32s"], fig["texts"], strict=True))
    if "text" in fig:
        return [(fig.get("prompt_crc32"), fig["text"])]
    return []


class StopAfter(Exception):
    """A run would start after the bench's ``stop_at`` (``--stop-after``): the runs finished so
    far are in the run cache, and the same command goes on from them."""
