"""Resumable measurement campaigns: stages run in order as subprocesses, within a wall budget
per call, with their state in a folder W (``validation.h100_campaign`` holds the H100
campaign; ``validation.campaign_files`` packs W and installs its products).

A call runs the stages not done yet. Each stage is a command run in the tree root with its
output appended to ``W/logs/<stage>.log``; a crash or a kill of one cannot corrupt the state,
which is written (atomically, ``W/state.json``) before and after every stage: per stage its
status (pending, partial, done, failed), calls, wall seconds summed over calls and last exit
status, and the commit measured. A ``budgeted`` stage gets ``--budget-s`` (what the call has
left, less a start-up margin) and is done only when it exits 0 (``STAGE_STOPPED``: it stopped at
its budget); every stage is killed with its process group ``end_slack_s`` before the call's
budget ends, and none starts with less than its floor left. The call then ends with
``EXIT_AGAIN``: the same command continues.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ssvkit.perfmodel.files import atomic_write

EXIT_DONE, EXIT_FAILED, EXIT_REFUSED, EXIT_AGAIN = 0, 1, 2, 3
STAGE_STOPPED = 3  # calibration.runner.STOPPED_AT_BUDGET, the sweeps' exit status
TARGET_S = 1500.0  # every measurement of record in <= 25 minutes of GPU time
STATE_VERSION = 1


class CampaignError(ValueError):
    """Bad input or a refusal: one line, exit 2."""


@dataclass(frozen=True, slots=True)
class Stage:
    """One measurement step: a command run in the tree root with ``{work}`` replaced by W."""

    name: str = field(metadata={"help": "stage name (state, logs, --stages)"})
    argv: tuple[str, ...] = field(metadata={"help": "arguments after the interpreter"})
    budgeted: bool = field(
        default=False,
        metadata={"help": "takes --budget-s and exits STAGE_STOPPED when it stops at it"},
    )
    min_s: float = field(default=30.0, metadata={"help": "not started with less left (s)"})
    estimate_s: float = field(default=0.0, metadata={"help": "H100 wall time of a whole run"})
    outputs: tuple[str, ...] = field(
        default=(), metadata={"help": "paths under W it writes (removed by --restart)"}
    )
    installs: tuple[tuple[str, str], ...] = field(
        default=(), metadata={"help": "(path under W, path in the tree) copied by --install"}
    )
    early_install: bool = field(
        default=False,
        metadata={"help": "its installs go into the tree once done, before each later stage"},
    )

    def __post_init__(self) -> None:
        if not self.name or not self.argv:
            raise ValueError(f"stage needs a name and a command, got {self.name!r} {self.argv}")
        if self.min_s <= 0:
            raise ValueError(f"min_s of stage {self.name} must be > 0, got {self.min_s}")

    def command(self, work: str, budget_s: float | None) -> list[str]:
        argv = [sys.executable, *(a.replace("{work}", work) for a in self.argv)]
        return argv + (["--budget-s", f"{budget_s:.0f}"] if budget_s is not None else [])


@dataclass(frozen=True, slots=True)
class CallConfig:
    """Time limits of one call (seconds of wall time)."""

    budget_s: float = field(default=540.0, metadata={"help": "wall budget of this call"})
    floor_s: float = field(default=30.0, metadata={"help": "no stage starts with less left"})
    startup_s: float = field(
        default=25.0, metadata={"help": "a budgeted stage's own budget is what is left less this"}
    )
    end_slack_s: float = field(
        default=10.0, metadata={"help": "a stage is killed this long before the budget ends"}
    )
    kill_grace_s: float = field(default=5.0, metadata={"help": "SIGTERM to SIGKILL"})

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"{f.name} must be > 0, got {getattr(self, f.name)}")
        if not self.budget_s > self.floor_s:
            msg = f"budget_s must exceed floor_s ({self.floor_s} s), got {self.budget_s}"
            raise ValueError(msg)
        if not self.end_slack_s < self.floor_s or not self.startup_s < self.floor_s:
            raise ValueError(
                f"startup_s ({self.startup_s}) and end_slack_s ({self.end_slack_s}) must be "
                f"below floor_s ({self.floor_s})"
            )


# --------------------------------------------------------------------------- state


def _now_utc() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _new_stage_state() -> dict:
    return {"status": "pending", "calls": 0, "wall_s": 0.0, "last_rc": None, "timed_out": False}


def load_state(work: Path, stages, commit: str | None = None) -> dict:
    """``W/state.json`` (a fresh state when there is none), every stage of ``stages`` in it;
    refuses a state measured at another commit than ``commit`` when one is given."""
    path = work / "state.json"
    if path.exists():
        try:
            state = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise CampaignError(f"{path} is not valid JSON ({e.msg})") from None
        if state.get("version") != STATE_VERSION:
            raise CampaignError(f"{path}: state version {state.get('version')!r} is not mine")
        if commit is not None and state["commit"] != commit:
            raise CampaignError(
                f"{path} holds the campaign of commit {state['commit']}, this tree is {commit}: "
                "give --restart to discard it (or another --work)"
            )
    else:
        state = {"version": STATE_VERSION, "commit": commit, "num_calls": 0, "calls": []}
        state["stages"] = {}
    for s in stages:
        state["stages"].setdefault(s.name, _new_stage_state())
    return state


def save_state(work: Path, state: dict) -> None:
    atomic_write(work / "state.json", json.dumps(state, indent=1) + "\n")


def restart(work: Path, stages) -> None:
    """Remove what the campaign wrote under W (its state, logs and every stage's outputs)."""
    for rel in ("state.json", "logs", *(o for s in stages for o in s.outputs)):
        p = work / rel
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


# --------------------------------------------------------------------------- one stage


@dataclass(frozen=True, slots=True)
class StageRun:
    status: str  # done | partial | failed
    rc: int | None
    wall_s: float
    timed_out: bool
    interrupted: bool = False

    def why(self) -> str:
        if self.interrupted:
            return " (interrupted)"
        if self.timed_out:
            return " (killed at the call's budget)"
        return " (stopped at its budget)" if self.status == "partial" else ""


def _kill_group(proc: subprocess.Popen, grace_s: float) -> int:
    """SIGTERM to the stage's process group (it runs in its own session), SIGKILL after."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def run_stage(
    stage: Stage,
    argv: list[str],
    root: Path,
    log: Path,
    timeout_s: float,
    env: dict,
    grace_s: float,
    header: str,
    clock: Callable[[], float] = time.monotonic,
) -> StageRun:
    """Run ``argv`` in ``root`` with its output appended to ``log``; kill it after
    ``timeout_s`` of wall time (or when this process is interrupted). ``clock`` (seconds)
    times it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        fh.write(f"==== {header}: {shlex.join(argv)}\n".encode())
        fh.flush()
        t0 = clock()
        proc = subprocess.Popen(
            argv,
            cwd=root,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        timed_out = interrupted = False
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = _kill_group(proc, grace_s)
        except BaseException:  # KeyboardInterrupt, or SIGTERM (see main): never orphan it
            interrupted = True
            rc = _kill_group(proc, grace_s)
        wall_s = clock() - t0
        if timed_out or interrupted:
            status = "partial"
        elif rc == 0:
            status = "done"
        elif stage.budgeted and rc == STAGE_STOPPED:
            status = "partial"
        else:
            status = "failed"
        r = StageRun(status, rc, wall_s, timed_out, interrupted)
        fh.write(f"==== exit {rc} after {wall_s:.1f} s: {status}{r.why()}\n".encode())
    return r


def install_files(pairs, work: Path, root: Path) -> list[Path]:
    """Copy (path under W, path in the tree) pairs, whole files only; returns the files that
    changed."""
    changed = []
    for src, dst in pairs:
        a, b = work / src, root / dst
        if not a.is_file():
            raise CampaignError(f"{a} is missing: nothing installed from it")
        if not b.exists() or a.read_bytes() != b.read_bytes():
            b.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(b, a.read_bytes())
            changed.append(b)
    return changed


# --------------------------------------------------------------------------- one call


def work_arg(work: Path, root: Path) -> str:
    """W as the stages see it: relative to the tree when inside it, so that run caches (which
    record their paths) still match on a machine where the tree lies elsewhere."""
    try:
        return str(work.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(work.resolve())


@dataclass(frozen=True, slots=True)
class _Call:
    """What every stage of one call shares: W, the tree, the commit measured, the time limits,
    the stages' environment, the clock, the output and the call's elapsed time."""

    work: Path
    root: Path
    commit: str
    cfg: CallConfig
    env: dict
    clock: Callable[[], float]
    out: Callable[[str], None]
    elapsed: Callable[[], float]

    def log(self, stage: Stage, text: str) -> None:
        self.out(f"[{self.elapsed():6.1f} s] {stage.name}: {text}")

    def install(self, stage: Stage) -> None:
        """Copy ``stage``'s products into the tree, saying which files changed."""
        for p in install_files(stage.installs, self.work, self.root):
            self.log(stage, f"installed {p.relative_to(self.root)}")


def _call_stage(c: _Call, stage: Stage, state: dict, left_s: float) -> StageRun:
    """Run ``stage`` once with ``left_s`` of the call's budget left (a budgeted stage gets it
    less the start-up margin), its state saved before and after."""
    st = state["stages"][stage.name]
    wa = work_arg(c.work, c.root)
    argv = stage.command(wa, left_s - c.cfg.startup_s if stage.budgeted else None)
    st["calls"] += 1
    st["status"] = "partial"  # from its first start until it ends done
    save_state(c.work, state)
    shown = shlex.join(["python3", *argv[1:]])
    c.log(stage, f"start (call {st['calls']}, {left_s:.0f} s left): {shown}")
    header = f"{stage.name}, call {st['calls']}, {_now_utc()}, commit {c.commit}"
    log_path = c.work / "logs" / f"{stage.name}.log"
    r = run_stage(
        stage,
        argv,
        c.root,
        log_path,
        left_s - c.cfg.end_slack_s,
        c.env,
        c.cfg.kill_grace_s,
        header,
        c.clock,
    )
    st.update(status=r.status, last_rc=r.rc, timed_out=r.timed_out)
    st["wall_s"] += r.wall_s
    save_state(c.work, state)
    why = f": see {wa}/logs/{stage.name}.log" if r.status == "failed" else r.why()
    c.log(stage, f"{r.status} after {r.wall_s:.1f} s, exit {r.rc}{why}")
    return r


def run_campaign(
    stages,
    work: Path,
    root: Path,
    commit: str,
    cfg: CallConfig,
    only: set[str] | None = None,
    out=None,
    started: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run the stages not done yet, in order, within ``cfg.budget_s`` of wall time since
    ``started`` (a reading of ``clock``, seconds; default: now); returns the exit status
    (``EXIT_*``). ``clock`` times the call's budget and its stages."""
    started = clock() if started is None else started
    out = out or (lambda line: print(line, flush=True))
    work.mkdir(parents=True, exist_ok=True)
    state = load_state(work, stages, commit)
    state["num_calls"] += 1
    call = {"started_utc": _now_utc(), "budget_s": cfg.budget_s, "wall_s": 0.0, "exit": None}
    state["calls"].append(call)
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "PYTHONUNBUFFERED": "1",
        "SSVKIT_GIT_COMMIT": commit,
    }
    elapsed = lambda: clock() - started  # noqa: E731
    c = _Call(work, root, commit, cfg, env, clock, out, elapsed)
    rc = EXIT_DONE
    for stage in stages:
        st = state["stages"][stage.name]
        if st["status"] == "done" or (only is not None and stage.name not in only):
            continue
        left_s = cfg.budget_s - elapsed()
        need_s = max(cfg.floor_s, stage.min_s)
        if left_s < need_s:
            c.log(
                stage,
                f"{left_s:.0f} s left, it needs {need_s:.0f} s: incomplete, run the same "
                "command again",
            )
            rc = EXIT_AGAIN
            break
        for done in stages:
            if done.early_install and state["stages"][done.name]["status"] == "done":
                c.install(done)
        r = _call_stage(c, stage, state, left_s)
        if r.status == "done" and stage.early_install:
            c.install(stage)
        if r.status != "done":
            rc = EXIT_FAILED if r.status == "failed" else EXIT_AGAIN
            break
    call.update(wall_s=round(elapsed(), 3), exit=rc)
    save_state(work, state)
    out(table(stages, state))
    if rc == EXIT_AGAIN:
        out("incomplete: run the same command again")
    return rc


def table(stages, state: dict) -> str:
    """Stage, status, calls, wall seconds (GPU time) and the estimate; the total vs 25 min."""
    lines = [f"{'stage':<18}{'status':<9}{'calls':>6}{'wall s':>10}{'est. s':>9}"]
    total = est = 0.0
    for s in stages:
        st = state["stages"][s.name]
        total, est = total + st["wall_s"], est + s.estimate_s
        lines.append(
            f"{s.name:<18}{st['status']:<9}{st['calls']:>6}{st['wall_s']:>10.1f}"
            f"{s.estimate_s:>9.0f}"
        )
    calls_s = sum(c["wall_s"] for c in state["calls"])
    lines.append(
        f"{'total':<33}{total:>10.1f}{est:>9.0f}  of the {TARGET_S:.0f} s target "
        f"({'met' if total <= TARGET_S else 'MISSED'} so far)"
    )
    commit = state["commit"] or "-"
    lines.append(f"{state['num_calls']} calls, {calls_s:.1f} s of wall in all; commit {commit}")
    return "\n".join(lines)
