"""The one runner of the GPU sweeps (ops and kernels): it times a config, seals its row
(``perfmodel.rows``) and appends it to a JSONL file, resumes from the rows already there, and
stops before the wall budget runs out.

A row's key is its op, its timing and its defining params (``perfmodel.rows.row_key``), so a
rerun skips every (config, timing) already in the file. The
ceilings every row carries (copy bandwidth, GEMM rate, the empty kernel per timing) are measured
in the same run, with the runner's timing config. No config starts once the elapsed time is within
twice the longest config timed so far of the budget; ``stopped`` then says a config not in the
file was left out, and the command exits with ``STOPPED_AT_BUDGET``.
"""

from __future__ import annotations

import dataclasses
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.rows import row_key, seal

STOPPED_AT_BUDGET = 3  # exit status: configs left out at the budget (validation.campaign)
COPY_BYTES = 2**31  # the device copy that measures the copy-bandwidth ceiling


def read_rows(path: Path) -> list[dict]:
    """Every row of a JSONL file ([] when there is none), unchecked: the resume keys and the
    summary read them; ``perfmodel.rows.load_rows`` is the checked reader."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Runner:
    """Owns a rows file, its resume keys, the run's ceilings and the wall budget.

    Parameters
    ----------
    path : the JSONL rows file (its folder is created).
    budget_s : wall-clock limit of the run.
    config : timing config of every measurement, the ceilings' included.
    timings : the timings each config is measured by (``launch``, ``graph``).
    work_type : number type of the rows' ``unique_bytes`` and ``flops`` (each rows file keeps
        the one its committed rows have).
    show : params printed on each row's progress line (None: all of them).
    """

    def __init__(
        self,
        path: Path,
        budget_s: float,
        *,
        config: tm.TimingConfig,
        timings: tuple[str, ...] = tm.TIMINGS,
        work_type: type = float,
        show: tuple[str, ...] | None = None,
    ) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.done = {row_key(r["op"], r["timing"], r["params"]) for r in read_rows(path)}
        self.budget_s = budget_s
        self.config = config
        self.timings = timings
        self.work_type = work_type
        self.show = show
        self.resident = False  # time every config L2-resident (one input set, no flush)
        self.t0 = time.monotonic()
        self.prov = tm.provenance()
        self.longest_s = 5.0
        self.stopped = False
        self.num_written = 0
        self.ceil: dict[str, float] = {}

    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def out_of_time(self) -> bool:
        """True (and ``stopped`` set) once no further config fits in the budget."""
        if not self.stopped and self.elapsed_s() > self.budget_s - 2 * self.longest_s:
            print(f"[{self.elapsed_s():6.1f}s] budget of {self.budget_s:.0f} s near: stopping")
            self.stopped = True
        return self.stopped

    def pending(self, op: str, params: dict) -> list[str]:
        """The timings of a config not yet in the file."""
        params = self._params(params)
        return [t for t in self.timings if row_key(op, t, params) not in self.done]

    def rotations(self, working_set_bytes: int) -> int:
        """Input sets to rotate over: enough to exceed the L2 when timing cold, one when the
        inputs are to stay resident."""
        return 1 if self.resident else tm.num_rotations(working_set_bytes)

    def measure_ceilings(self) -> dict[str, float]:
        """Measure the run's ceilings (``ceil``); returns the copy rate of each copy method."""
        cfg = self.config
        rates = tm.copy_rates(COPY_BYTES, config=cfg)
        self.ceil = {
            "copy_bytes_per_s": max(rates.values()),
            "gemm_flops_per_s": tm.gemm_flops_per_s(config=cfg),
            **{t: tm.empty_kernel_s(t, cfg) for t in self.timings},
        }
        return rates

    def _params(self, params: dict) -> dict:
        return {**params, "l2": "resident"} if self.resident else params

    def write(self, op: str, params: dict, t: tm.Timing, unique_bytes: float, flops: float) -> None:
        """Seal and append one row (nothing when its key is in the file already)."""
        key = row_key(op, t.timing, params)
        if key in self.done:
            return
        row = seal(
            {
                "op": op,
                "params": params,
                "median_s": t.median_s,
                "p10_s": t.p10_s,
                "p90_s": t.p90_s,
                "timing": t.timing,
                "unique_bytes": self.work_type(unique_bytes),
                "flops": self.work_type(flops),
                "achieved_bytes_per_s": unique_bytes / t.median_s if t.median_s > 0 else 0.0,
                "copy_bytes_per_s": self.ceil["copy_bytes_per_s"],
                "gemm_flops_per_s": self.ceil["gemm_flops_per_s"],
                "launch_s": self.ceil[t.timing],
                **self.prov,
            }
        )
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self.done.add(key)
        self.num_written += 1

    def time_op(
        self,
        op: str,
        params: dict,
        fn: Callable[[int], object],
        *,
        num_inputs: int,
        unique_bytes: float,
        flops: float,
    ) -> None:
        """Time ``fn(i)`` over ``num_inputs`` input sets by every pending timing and write the
        rows. A config that fails (out of memory, an error) is reported and left out: one
        broken config must not end the sweep."""
        params = self._params(params)
        config = dataclasses.replace(self.config, flush_l2=False) if self.resident else self.config
        num_inputs = 1 if self.resident else num_inputs
        for timing in self.pending(op, params):
            if self.out_of_time():
                return
            start = time.monotonic()
            try:
                t = tm.bench(fn, timing, num_inputs=num_inputs, config=config)
            except torch.cuda.OutOfMemoryError:
                print(f"  {op} {timing}: out of memory, skipped")
                torch.cuda.empty_cache()
                return
            except Exception as e:
                print(f"  {op} {timing}: {type(e).__name__}: {e}")
                traceback.print_exc(limit=2)
                return
            self.longest_s = max(self.longest_s, time.monotonic() - start)
            self.write(op, params, t, unique_bytes, flops)
            self._report(op, params, t, unique_bytes, flops)

    def _report(self, op: str, params: dict, t: tm.Timing, unique_bytes, flops) -> None:
        floor = max(
            unique_bytes / self.ceil["copy_bytes_per_s"], flops / self.ceil["gemm_flops_per_s"]
        )
        short = {
            k: v
            for k, v in params.items()
            if v is not None and (self.show is None or k in self.show)
        }
        print(
            f"[{self.elapsed_s():6.1f}s] {op:<20} {t.timing:<6} {t.median_s * 1e6:9.1f} us "
            f"{unique_bytes / t.median_s / 1e12:5.2f} TB/s "
            f"{t.median_s / floor if floor else float('nan'):6.2f} x floor "
            f"({floor * 1e6:.1f} us)  {short}"
        )
