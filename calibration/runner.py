"""The one runner of the GPU sweeps (ops and kernels): it times a config, seals its row
(``perfmodel.rows``) and appends it to a JSONL file, resumes from the rows already there, and
stops before the wall budget runs out (``Runner.out_of_time``).

A row's key is its op, its timing and its defining params (``perfmodel.rows.row_key``), so a
rerun skips every (config, timing) already in the file, or in the read-only ``done_from`` files
(the committed rows, when a shard writes its own file). Each row is one ``write`` of one line,
synced: a kill leaves at most a last line cut short, which the next run drops (that row is
measured again). The ceilings every row carries (copy bandwidth, GEMM rate, the empty kernel
per timing) are measured in the same run, with the runner's timing config. With a ``shard``,
configs other shards own (``calibration.shards.Shard.owns``) are not this runner's to time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from ssvkit.calibration.shards import Shard
from ssvkit.calibration.stale_rows import STALE, is_stale
from ssvkit.kernels import timing as tm
from ssvkit.perfmodel.files import atomic_write
from ssvkit.perfmodel.rows import redo_matches, row_key, seal

STOPPED_AT_BUDGET = 3  # exit status: configs left out at the budget (validation.campaign)
COPY_BYTES = 2**31  # the device copy that measures the copy-bandwidth ceiling


def read_rows(path: Path) -> list[dict]:
    """Every row of a JSONL file ([] when there is none), unchecked: the resume keys and the
    summary read them; ``perfmodel.rows.load_rows`` is the checked reader. A last line cut
    short by a kill (no newline at its end) is left out."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines = lines[:-1]
    return [json.loads(line) for line in lines if line.strip()]


def drop_cut_tail(path: Path) -> bool:
    """Rewrite ``path`` without a last line cut short by a kill; True when there was one."""
    if not path.exists():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    atomic_write(path, data[: data.rfind(b"\n") + 1])
    return True


def append_line(path: Path, line: str) -> None:
    """Append ``line`` (ending in a newline) in one appending write, synced to disk."""
    data = line.encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def done_keys(paths: Iterable[Path], skip: Iterable[str] = ()) -> set[str]:
    """Resume keys of the rows of ``paths`` (those that exist), leaving out the rows ``skip``
    selects to measure again (``redo_matches``; ``stale``: the rows whose kernels' launch plan
    changed since they were timed, ``calibration.stale_rows``)."""
    skip = tuple(skip)
    stale = STALE in skip
    return {
        row_key(r["op"], r["timing"], r["params"])
        for p in paths
        for r in read_rows(Path(p))
        if not redo_matches(skip, r["op"], r["params"]) and not (stale and is_stale(r))
    }


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
    done_from : further rows files whose keys count as done (read, never written).
    redo_ops : ``redo_matches`` selectors of the rows of ``done_from`` that do not count
        (measured again): an op, or an op and params.
    shard : time only the configs this shard owns (``Shard.owns``); None: all.
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
        done_from: tuple[Path, ...] = (),
        redo_ops: tuple[str, ...] = (),
        shard: Shard | None = None,
    ) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if drop_cut_tail(path):
            print(f"{path}: dropped a last row cut short by a kill (it is measured again)")
        others = [Path(p) for p in done_from if Path(p).resolve() != path.resolve()]
        self.done = done_keys([path]) | done_keys(others, redo_ops)
        self.shard = shard
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
        self._since = time.monotonic()  # the previous row's write (``wall_s``)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def out_of_time(self) -> bool:
        """True (and ``stopped`` set) once no further config fits in the budget: no config
        starts once the elapsed time is within twice the longest timing so far (5 s before
        any) of the budget; ``stopped`` then says a config not in the file was left out, and
        the command exits with ``STOPPED_AT_BUDGET``."""
        if not self.stopped and self.elapsed_s() > self.budget_s - 2 * self.longest_s:
            print(f"[{self.elapsed_s():6.1f}s] budget of {self.budget_s:.0f} s near: stopping")
            self.stopped = True
        return self.stopped

    def pending(self, op: str, params: dict) -> list[str]:
        """The timings of a config not yet in the file (none of another shard's config)."""
        params = self._params(params)
        if self.shard is not None and not self.shard.owns(row_key(op, "", params)):
            return []
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
        self._since = time.monotonic()
        return rates

    def _params(self, params: dict) -> dict:
        return {**params, "l2": "resident"} if self.resident else params

    def write(
        self,
        op: str,
        params: dict,
        t: tm.Timing,
        unique_bytes: float,
        flops: float,
        first_call_s: float = 0.0,
    ) -> None:
        """Seal and append one row (nothing when its key is in the file already). The row
        records ``wall_s`` (seconds since the previous row of the run: input building,
        compilation and timing) and ``first_call_s`` (its op's untimed first call, compilation
        included when the kernel had no compiled specialisation yet), from which later sweeps
        are planned (``calibration.kernel_plan``)."""
        key = row_key(op, t.timing, params)
        if key in self.done:
            return
        now = time.monotonic()
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
                "wall_s": round(now - self._since, 3),
                "first_call_s": round(first_call_s, 4),
                **self.prov,
            }
        )
        append_line(self.path, json.dumps(row) + "\n")
        self._since = now
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
                first_call_s = timed_first_call(fn)
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
            self.write(op, params, t, unique_bytes, flops, first_call_s)
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


def timed_first_call(fn: Callable[[int], object]) -> float:
    """Wall seconds of one untimed call of ``fn(0)``, drained (compilation included)."""
    start = time.monotonic()
    fn(0)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.monotonic() - start
