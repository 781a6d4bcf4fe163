"""Where partitions run: in this process, in local worker processes, or on a Dask cluster.

Every executor has one method, ``map(fn, tasks)``, yielding ``(task index, result)`` pairs as
tasks finish; callers place results by index, so completion order never changes the output.
Workers only compute and return arrays: the caller alone writes files, once, at the end.

- ``SerialExecutor``: in order, in this process (``--workers 1`` and small grids).
- ``ProcessExecutor``: a process pool on this machine; forked on Linux while this process runs
  no other thread, else started by ``forkserver`` or ``spawn`` (a script then needs a
  ``__main__`` guard).
- ``DaskExecutor``: a running Dask scheduler; needs the ``sweep`` extra, and ssvkit installed
  on the workers.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed


class SerialExecutor:
    """The tasks in order, in this process (``--workers 1`` and small grids)."""

    name = "serial"

    def map(self, fn: Callable, tasks: list) -> Iterator[tuple[int, object]]:
        for i, t in enumerate(tasks):
            yield i, fn(t)

    def close(self) -> None:
        pass


class ProcessExecutor:
    """A lazily started pool of ``workers`` local processes, reused across ``map`` calls.

    A ``concurrent.futures.ProcessPoolExecutor`` on this machine. On Linux, while this process
    runs no other thread, workers are forked (fast; a script needs no ``__main__`` guard);
    otherwise they start by ``forkserver`` (preloading the sweep's task modules) or ``spawn``,
    never by forking a threaded process, and a script must guard its entry with
    ``if __name__ == "__main__":`` as multiprocessing requires.
    """

    def __init__(self, workers: int):
        self.workers = workers
        self.name = f"processes:{workers}"
        self._pool: ProcessPoolExecutor | None = None

    def _start(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=_context())
        return self._pool

    def map(self, fn: Callable, tasks: list) -> Iterator[tuple[int, object]]:
        pool = self._start()
        futures = {pool.submit(fn, t): i for i, t in enumerate(tasks)}
        try:
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
        finally:
            for fut in futures:
                fut.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class DaskExecutor:
    """Tasks submitted to a running Dask scheduler; results gathered as they complete.

    A ``dask.distributed.Client`` connected to the scheduler at ``address``
    (``tcp://host:port``); needs the ``sweep`` extra, and ssvkit installed on the workers (and
    any model ``config.json`` path of the grid readable there).
    """

    def __init__(self, address: str, timeout_s: float = 10.0):
        try:
            from dask.distributed import Client
        except ImportError:
            raise ValueError(
                "--scheduler needs dask.distributed: pip install 'ssvkit[sweep]'"
            ) from None
        try:
            self._client = Client(address, timeout=timeout_s, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"cannot reach the Dask scheduler {address!r}: {detail}") from None
        self.name = f"dask:{address}"

    def map(self, fn: Callable, tasks: list) -> Iterator[tuple[int, object]]:
        from dask.distributed import as_completed as dask_completed

        futures = self._client.map(fn, tasks, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for fut in dask_completed(futures, loop=self._client.loop):
                yield index[fut.key], fut.result()
        finally:
            self._client.cancel(futures)

    def close(self) -> None:
        self._client.close()


def _context():
    methods = multiprocessing.get_all_start_methods()
    if sys.platform == "linux" and "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(["ssvkit.sweep.partition", "ssvkit.sweep.capacity"])
    return ctx


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def make_executor(workers: int | None, scheduler: str | None, num_tasks: int, timeout_s=10.0):
    """The executor for a run: Dask when ``scheduler`` is given, else local processes (one
    per core by default), or this process for one worker or a single task."""
    if scheduler:
        return DaskExecutor(scheduler, timeout_s)
    n = default_workers() if workers is None else workers
    if n < 1:
        raise ValueError(f"--workers must be >= 1, got {n}")
    if n == 1 or num_tasks <= 1:
        return SerialExecutor()
    return ProcessExecutor(min(n, num_tasks))
