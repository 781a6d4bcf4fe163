"""Compile a kernel sweep's kernels before it times them, in several host processes.

A config's first call compiles its kernels' specialisations (about 1.8 s each on the H200's
host, measured by earlier runs' ``first_call_s``; more than half of a selection sweep's wall
time). ``kernel_sweep --compile-jobs N`` first runs N worker processes of the same command
(``--warm K/N``): each calls its share of the pending configs' ops once, untimed and writing
no row, so the compilations run side by side on the host's cores and land in Triton's on-disk
cache. The timed run that follows finds every kernel there and spends its budget timing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch
from ssvkit.calibration import kernel_ops as ops
from ssvkit.calibration.kernel_grid import KernelConfig
from ssvkit.calibration.runner import Runner, drop_cut_tail, timed_first_call

MODULE = "ssvkit.calibration.kernel_sweep"


class WarmRunner(Runner):
    """A ``Runner`` that calls each pending op once (its first call, compilation included)
    and writes nothing; ``num_warmed`` counts the ops called."""

    num_warmed = 0

    def time_op(self, op, params, fn, *, num_inputs, unique_bytes, flops) -> None:
        if not self.pending(op, self._params(params)) or self.out_of_time():
            return
        try:
            timed_first_call(fn)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()  # the timed run reports it
            return
        except Exception as e:
            print(f"  warm {op}: {type(e).__name__}: {e}")
            return
        self.num_warmed += 1


def warm_configs(r: WarmRunner, configs: list[KernelConfig], seed: int, mods: dict) -> int:
    """Call the ops of this worker's pending configs once each (no check, no ceilings, no
    row); returns the exit status. The workers share the GPU's memory, so a config whose
    inputs do not fit beside the other workers' is skipped (the timed run, alone on the GPU,
    compiles its kernels at their first call) and the worker goes on with the next."""
    skipped = 0
    for cfg in configs:
        if r.out_of_time():
            break
        try:
            ops.run_config(r, cfg, seed, mods[cfg.step])
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            skipped += 1
    note = f", {skipped} configs skipped for memory" if skipped else ""
    print(f"warm {r.shard}: {r.num_warmed} ops called in {r.elapsed_s():.0f} s{note}")
    return 0


def worker_argv(argv: list[str], k: int, n: int) -> list[str]:
    """The command line of worker ``k`` of ``n``: the sweep's own, warming its share."""
    return [sys.executable, "-m", MODULE, *argv, "--warm", f"{k}/{n}", "--compile-jobs", "1"]


def precompile(argv: list[str], rows: Path, jobs: int) -> float:
    """Run ``jobs`` warm workers of the sweep ``argv`` (writing ``rows``) side by side and wait
    for them; returns the wall seconds they took. The workers read ``rows`` for the configs
    already timed and never write it; a worker that fails costs its share's compilations only
    (the timed run compiles what is missing)."""
    start = time.monotonic()
    drop_cut_tail(rows)  # before the workers read it, so that none of them rewrites it
    procs = [subprocess.Popen(worker_argv(argv, k, jobs)) for k in range(jobs)]
    failed = [k for k, p in enumerate(procs) if p.wait() != 0]
    spent = time.monotonic() - start
    note = f" (workers {failed} failed)" if failed else ""
    print(f"compiled in {jobs} worker processes in {spent:.0f} s{note}", flush=True)
    return spent
