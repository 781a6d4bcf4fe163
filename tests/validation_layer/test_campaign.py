"""The campaign orchestrator (``validation.campaign``, ``validation.h100_campaign``) with fake
stages: tiny Python commands that count their calls, stop at their budget, run past it or fail.

The budget arithmetic runs on a virtual clock (``VirtualClock``): each fake stage says how
long it took by appending its seconds to ``W/clock``, so budgets, floors and wall times are
exact whatever the machine's load. Kills are checked on real processes, with lower bounds on
time only (a kill never comes early) and generous hang guards."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from ssvkit.calibration import ceilings
from ssvkit.calibration.validate import disagreements, fit_agreement
from ssvkit.validation import campaign, h100_campaign
from ssvkit.validation.campaign import (
    EXIT_AGAIN,
    EXIT_DONE,
    EXIT_FAILED,
    STAGE_STOPPED,
    CallConfig,
    CampaignError,
    Stage,
    load_state,
    restart,
    run_campaign,
)
from ssvkit.validation.campaign_files import install, pack, unpack

from tests.fit_helpers import without_leave_one_out

QUICK = CallConfig(budget_s=60, floor_s=2, startup_s=1, end_slack_s=1, kill_grace_s=1)
HANG_S = 120.0  # a hang guard only: what a process is given to start or to die

# Takes 2 s (virtual), appends the budget it was given to W/rows; done (exit 0) on its third
# call, else stopped.
COUNTER = """
import pathlib, sys
w = pathlib.Path(sys.argv[1])
with open(w / 'clock', 'a') as f:
    f.write('2\\n')
budget = sys.argv[sys.argv.index('--budget-s') + 1]
n = len((w / 'rows').read_text().splitlines()) if (w / 'rows').exists() else 0
with open(w / 'rows', 'a') as f:
    f.write(budget + '\\n')
print('row', n + 1)
sys.exit(0 if n + 1 == 3 else 3)
"""
# Starts a grandchild, then writes both pids to ``argv[1]`` and sleeps with it;
# with ``argv[2] == 'ignore'`` both ignore SIGTERM (the disposition is inherited).
GROUP = """
import os, pathlib, signal, subprocess, sys, time
if sys.argv[2] == 'ignore':
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
tmp = pathlib.Path(sys.argv[1] + '.tmp')
tmp.write_text(f'{os.getpid()} {child.pid}')
tmp.rename(sys.argv[1])
time.sleep(600)
"""


class VirtualClock:
    """The seconds the fake stages said they took: the sum of what they appended to
    ``W/clock``."""

    def __init__(self, work):
        self.path = work / "clock"

    def __call__(self):
        return sum(map(float, self.path.read_text().split())) if self.path.exists() else 0.0


def stage(name, code, **kw):
    return Stage(name, ("-c", code, "{work}"), min_s=kw.pop("min_s", 0.1), **kw)


def touch(name):
    return f"import pathlib, sys; pathlib.Path(sys.argv[1], {name!r}).write_text({name!r})"


def took(seconds):
    """A stage that takes ``seconds`` on the virtual clock."""
    return f"import sys; open(sys.argv[1] + '/clock', 'a').write('{seconds}\\n')"


def exits(code):
    return f"import sys; print('exiting {code}'); sys.exit({code})"


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    return root, root / "build" / "campaign"


def run(stages, tree, commit="c0ffee1", cfg=QUICK, **kw):
    """One call on the virtual clock (``clock=time.monotonic`` for the real one)."""
    root, work = tree
    lines = []
    kw.setdefault("clock", VirtualClock(work))
    rc = run_campaign(stages, work, root, commit, cfg, out=lines.append, **kw)
    return rc, load_state(work, stages), "\n".join(lines)


def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(ready, what):
    deadline = time.monotonic() + HANG_S
    while not ready():
        assert time.monotonic() < deadline, f"{what} within {HANG_S:.0f} s"
        time.sleep(0.02)


def test_a_budget_stop_resumes_and_the_next_stage_waits_until_it_is_done(tree, monkeypatch):
    stages = (
        stage("warm", took(7)),
        stage("rows", COUNTER, budgeted=True),
        stage("after", touch("after")),
    )
    root, work = tree
    timeouts, run_stage = [], campaign.run_stage

    def spy(s, argv, root, log, timeout_s, *args):
        timeouts.append((s.name, timeout_s))
        return run_stage(s, argv, root, log, timeout_s, *args)

    monkeypatch.setattr(campaign, "run_stage", spy)
    for call in (1, 2):
        rc, state, out = run(stages, tree)
        assert rc == EXIT_AGAIN and "run the same command again" in out
        assert state["stages"]["rows"] == {
            **state["stages"]["rows"],
            "status": "partial",
            "calls": call,
            "last_rc": STAGE_STOPPED,
        }
        assert state["stages"]["after"]["calls"] == 0 and not (work / "after").exists()
    rc, state, out = run(stages, tree)
    assert rc == EXIT_DONE and (work / "after").exists()
    assert [state["stages"][s.name]["status"] for s in stages] == ["done"] * 3
    assert state["stages"]["rows"]["calls"] == 3 and state["stages"]["after"]["calls"] == 1
    # Each call handed the stage what it had left, less the start-up margin: the first call
    # after the 7 s of "warm"; each stage is killed end_slack_s before the call's budget ends.
    assert (work / "rows").read_text().split() == ["52", "59", "59"]
    assert timeouts == [("warm", 59), ("rows", 52), ("rows", 59), ("rows", 59), ("after", 57)]
    assert state["stages"]["warm"]["calls"] == 1 and state["stages"]["warm"]["wall_s"] == 7
    assert state["stages"]["rows"]["wall_s"] == 3 * 2
    log = (work / "logs" / "rows.log").read_text()
    assert [log.count(f"==== rows, call {i}") for i in (1, 2, 3)] == [1, 1, 1]
    assert log.count("partial (stopped at its budget)") == 2 and "row 3" in log
    # A done campaign runs nothing more.
    rc, state, out = run(stages, tree)
    assert rc == EXIT_DONE and "start" not in out and state["stages"]["rows"]["calls"] == 3
    assert state["num_calls"] == 4 and [c["exit"] for c in state["calls"]] == [3, 3, 0, 0]
    assert [c["wall_s"] for c in state["calls"]] == [9, 2, 2, 0]


def test_done_only_when_it_ran_to_the_end(tree):
    root, work = tree
    # Exit 3 is a budget stop only for a stage that takes a budget; anything else fails.
    stages = (stage("plain", exits(3)), stage("after", touch("after")))
    rc, state, out = run(stages, tree)
    assert rc == EXIT_FAILED and state["stages"]["plain"]["status"] == "failed"
    assert "build/campaign/logs/plain.log" in out and not (work / "after").exists()
    stages = (stage("sweep", exits(1), budgeted=True), stage("after", touch("after")))
    restart(work, stages + (stage("plain", exits(3)),))
    assert not (work / "state.json").exists() and not (work / "logs").exists()
    rc, state, _ = run(stages, tree)
    assert rc == EXIT_FAILED and state["stages"]["sweep"]["status"] == "failed"
    assert (
        state["stages"]["sweep"]["last_rc"] == 1
        and "exiting 1" in (work / "logs" / "sweep.log").read_text()
    )
    # The next call retries a failed stage; it is done when it exits 0.
    stages = (stage("sweep", exits(0), budgeted=True), stage("after", touch("after")))
    rc, state, _ = run(stages, tree)
    assert rc == EXIT_DONE and state["stages"]["sweep"]["calls"] == 2
    assert (work / "after").exists()


def test_a_stage_killed_at_the_budget_finishes_on_the_next_call(tree):
    """On the real clock: a stage that would run past the call's budget is killed no earlier
    than ``end_slack_s`` before its end, marked partial, and the next call runs it again."""
    root, work = tree
    after = stage("after", touch("after"))
    cfg = CallConfig(budget_s=1.2, floor_s=0.2, startup_s=0.1, end_slack_s=0.1, kill_grace_s=30)
    rc, state, out = run(
        (stage("slow", "import time; time.sleep(600)"), after), tree, cfg=cfg, clock=time.monotonic
    )
    assert rc == EXIT_AGAIN
    st = state["stages"]["slow"]
    assert st["status"] == "partial" and st["timed_out"] and st["calls"] == 1
    assert st["last_rc"] == -signal.SIGTERM  # its SIGTERM ended it, within the grace
    (call,) = state["calls"]
    assert cfg.budget_s - cfg.end_slack_s <= call["wall_s"]  # the call's, to the ms
    assert 0 < round(st["wall_s"], 3) <= call["wall_s"]
    assert "killed at the call's budget" in out and not (work / "after").exists()
    assert "killed at the call's budget" in (work / "logs" / "slow.log").read_text()
    first_s = st["wall_s"]
    rc, state, _ = run((stage("slow", took(0.5)), after), tree)
    st = state["stages"]["slow"]
    assert rc == EXIT_DONE and st["status"] == "done" and not st["timed_out"]
    assert st["calls"] == 2 and st["wall_s"] == first_s + 0.5
    assert (work / "after").exists()


@pytest.mark.parametrize("sigterm", ["default", "ignore"])
def test_a_kill_takes_the_whole_process_group(tmp_path, sigterm):
    """``_kill_group``: SIGTERM to the stage's process group, SIGKILL after the grace when it
    is ignored; the stage and the process it started are gone either way."""
    from ssvkit.validation.campaign import _kill_group

    pids_file = tmp_path / "pids"
    proc = subprocess.Popen(
        [sys.executable, "-c", GROUP, str(pids_file), sigterm], start_new_session=True
    )
    try:
        wait_until(pids_file.exists, "the stage starts its grandchild")
        pids = [int(p) for p in pids_file.read_text().split()]
        assert pids[0] == proc.pid and os.getpgid(pids[1]) == proc.pid
        # A grace long enough that a SIGTERM honoured is never taken for one ignored.
        rc = _kill_group(proc, grace_s=HANG_S if sigterm == "default" else 0.2)
        assert rc == (-signal.SIGTERM if sigterm == "default" else -signal.SIGKILL)
        wait_until(lambda: not any(alive(p) for p in pids), "the process group dies")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_wall_time_is_summed_per_stage_and_per_call(tree):
    stages = (stage("a", took(0.25)), stage("b", took(0.5)))
    rc, state, out = run(stages, tree)
    a, b = state["stages"]["a"]["wall_s"], state["stages"]["b"]["wall_s"]
    assert rc == EXIT_DONE and (a, b) == (0.25, 0.5)
    assert state["calls"][0]["wall_s"] == a + b
    assert "b: done after 0.5 s" in out and "[   0.8 s] b: done" in out
    total_line = next(line for line in out.splitlines() if line.startswith("total"))
    assert f"{a + b:.1f}" in total_line and "1500 s target" in total_line
    rc, state, _ = run(stages, tree)
    assert state["stages"]["a"]["wall_s"] == a and state["num_calls"] == 2
    assert state["calls"][1]["wall_s"] == 0


def test_no_stage_starts_below_its_floor(tree):
    root, work = tree
    stages = (stage("big", touch("big"), min_s=30),)
    cfg = CallConfig(budget_s=20, floor_s=5, startup_s=1, end_slack_s=1, kill_grace_s=1)
    rc, state, out = run(stages, tree, cfg=cfg)
    assert rc == EXIT_AGAIN and "it needs 30 s" in out and "run the same command again" in out
    assert state["stages"]["big"]["calls"] == 0 and not (work / "logs").exists()
    # The call's floor: after 16 s of the 20, a stage needing only 1 s waits for the next call.
    stages = (stage("long", took(16)), stage("next", touch("next"), min_s=1))
    rc, state, out = run(stages, tree, cfg=cfg)
    assert rc == EXIT_AGAIN and "next: 4 s left, it needs 5 s" in out
    assert state["stages"]["next"]["calls"] == 0 and not (work / "next").exists()
    rc, state, out = run(stages, tree, cfg=cfg)
    assert rc == EXIT_DONE and "next: start (call 1, 20 s left)" in out and (work / "next").exists()


def test_another_commits_state_is_refused(tree):
    root, work = tree
    stages = (stage("a", touch("a")),)
    run(stages, tree, commit="aaaa")
    before = (work / "state.json").read_text()
    with pytest.raises(CampaignError, match="commit aaaa, this tree is bbbb.*--restart"):
        run(stages, tree, commit="bbbb")
    assert (work / "state.json").read_text() == before


def test_pack_and_unpack_round_trip(tree, tmp_path):
    root, work = tree
    stages = (stage("a", touch("a")), stage("b", touch("b")))
    run(stages, tree)
    (work / "profile").mkdir()
    (work / "profile" / "rows.jsonl").write_text('{"x": 1}\n')
    dest = tmp_path / "state.tar.gz"
    assert pack(work, dest) == dest.stat().st_size > 0
    files = {p.relative_to(work): p.read_bytes() for p in work.rglob("*") if p.is_file()}
    w2 = tmp_path / "fresh" / "w"
    assert unpack(dest, w2)
    assert {p.relative_to(w2): p.read_bytes() for p in w2.rglob("*") if p.is_file()} == files
    # W as new as the pack is kept; a W of another commit is refused.
    assert not unpack(dest, w2)
    state = json.loads((w2 / "state.json").read_text())
    (w2 / "state.json").write_text(json.dumps({**state, "commit": "other"}))
    with pytest.raises(CampaignError, match="give --restart"):
        unpack(dest, w2)
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(work / "state.json", arcname="state.json")
        tar.add(work / "state.json", arcname="../escaped.json")
    with pytest.raises(CampaignError, match="not a campaign pack"):
        unpack(evil, tmp_path / "w3")
    assert not (tmp_path / "escaped.json").exists() and not (tmp_path / "w3").exists()
    with pytest.raises(CampaignError, match="not a campaign pack"):
        unpack(work / "state.json", tmp_path / "w4")


def test_install_refuses_an_unfinished_campaign_then_copies_the_products(tree):
    root, work = tree
    make = "import pathlib, sys; w = pathlib.Path(sys.argv[1]); "
    stages = (
        stage(
            "m",
            make + "(w / 'm.json').write_text('{}'); (w / 'cache.jsonl').write_text('c')",
            installs=(("m.json", "validation/data/m.json"),),
        ),
        stage("n", COUNTER, budgeted=True),
    )
    run(stages, tree, commit="0123456789abcdef")
    with pytest.raises(CampaignError, match=r"not every stage is done: n \(partial\)"):
        install(stages, work, root)
    assert not (root / "validation").exists()
    run(stages, tree, commit="0123456789abcdef")
    run(stages, tree, commit="0123456789abcdef")
    written = install(stages, work, root)
    assert [p.relative_to(root).as_posix() for p in written] == ["validation/data/m.json"]
    assert (root / "validation/data/m.json").read_text() == "{}"
    # The products only: no caches, no rows, and the logs and the state stay in W.
    assert {p.name for p in root.rglob("*") if p.is_file() and work not in p.parents} == {"m.json"}
    assert install(stages, work, root) == []  # nothing changed


def test_an_early_install_reaches_the_tree_before_every_later_stage(tree):
    root, work = tree
    fit = stage(
        "fit",
        "import pathlib, sys; pathlib.Path(sys.argv[1], 'p.json').write_text('P')",
        installs=(("p.json", "prof/p.json"),),
        early_install=True,
    )
    use = "import pathlib, sys; pathlib.Path(sys.argv[1], '{0}').write_text(open('prof/p.json').read())"  # noqa: E501
    rc, _, out = run((fit, stage("use", use.format("seen"))), tree)
    assert rc == EXIT_DONE and (work / "seen").read_text() == "P" and "installed prof/p.json" in out
    # A fresh machine has the tree's own files again: they are installed before the next stage.
    (root / "prof" / "p.json").write_text("committed")
    rc, _, out = run(
        (fit, stage("use", use.format("seen")), stage("use2", use.format("seen2"))), tree
    )
    assert rc == EXIT_DONE and (work / "seen2").read_text() == "P"


def test_the_script_one_line_errors_pack_and_plan(tree, tmp_path, capsys, monkeypatch):
    root, work = tree
    cli = h100_campaign
    monkeypatch.setenv("SSVKIT_GIT_COMMIT", "feedbee")
    stages = (stage("a", touch("a")),)

    def main(*argv, stages=stages):
        return cli.main(["--work", str(work), *argv], stages=stages, root=root)

    for argv, msg in [
        (("--budget-s", "0"), "budget_s must be > 0"),
        (("--budget-s", "20"), "budget_s must exceed floor_s (30.0 s), got 20.0"),
        (("--stages", "a,nope"), "unknown stage ['nope']"),
        (("--install",), "has no state.json"),
        (("--unpack", str(tmp_path / "none.tar.gz")), "not a campaign pack"),
        (("--pack", str(tmp_path / "no" / "s.tar.gz")), "does not exist"),
    ]:
        assert main(*argv) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not work.exists()
    dest = tmp_path / "s.tar.gz"
    assert main("--pack", str(dest)) == EXIT_DONE and (work / "a").exists()
    assert "packed" in capsys.readouterr().out and tarfile.is_tarfile(dest)
    monkeypatch.setenv("SSVKIT_GIT_COMMIT", "0ther")
    assert main() == 2 and "--restart" in capsys.readouterr().err
    assert main("--restart") == EXIT_DONE and load_state(work, stages)["commit"] == "0ther"
    assert main("--install") == EXIT_DONE  # a done campaign without products installs nothing
    assert "0 files changed" in capsys.readouterr().out
    # The real plan: every stage's command, the sweeps with a budget, nothing run.
    assert main("--dry-run", stages=cli.STAGES) == EXIT_DONE
    plan = capsys.readouterr().out
    assert [s.name for s in cli.STAGES] == [
        "ops",
        "kernels",
        "kernels_tiny",
        "fit",
        "planner",
        "validation",
        "verify_breakdown",
    ]
    assert [s.name for s in cli.STAGES if s.budgeted] == ["ops", "kernels", "kernels_tiny"]
    assert (
        "-m ssvkit.calibration.kernel_sweep --out build/campaign/profile --geometry tiny --budget-s"
        in plan
    )
    assert "--resume build/campaign/planner-runs.jsonl" in plan and "/dev/null" not in plan


# The kernel rows the fit-stage test copies: the ceiling ops', dense verification's and the
# selection's (whose runs measured the highest copy and GEMM rates, so the ceilings are the
# committed ones). The whole folder's refit is ``test_fit_validate``'s; here, the stage's.
FIT_STAGE_OPS = {"device_copy", "empty_triton_kernel", "dense_verify", "select_blocks"}


def test_the_fit_stage_fits_a_folder_as_the_committed_fit_does(tmp_path, capsys, monkeypatch):
    """Committed rows copied elsewhere (the op sweep's and the kernel rows of
    ``FIT_STAGE_OPS``) fit to the committed ceilings (their row count aside) and to classes that
    predict those rows as the committed profile's do (``calibration.validate.fit_agreement``),
    written there and not in the committed folder. The fit's interval residuals leave out the
    leave-one-out sets (``without_leave_one_out``)."""
    from ssvkit.perfmodel.rows import load_rows

    without_leave_one_out(monkeypatch)
    committed = ceilings.PROFILES / "h100-sxm"
    rows = tmp_path / "profile"
    rows.mkdir()
    shutil.copy(committed / "op_sweep.jsonl", rows / "op_sweep.jsonl")
    kernels = [r for r in load_rows(committed / "kernel_bench.jsonl") if r["op"] in FIT_STAGE_OPS]
    (rows / "kernel_bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kernels))
    before = {p.name: p.stat().st_mtime_ns for p in committed.iterdir()}
    assert h100_campaign.main(["--fit", str(rows)]) == EXIT_DONE
    got, want = (json.loads((d / "ceilings.json").read_text()) for d in (rows, committed))
    assert got["ceilings"] == want["ceilings"] and got["gpu"] == want["gpu"]
    assert got["derived_from"]["rows"] == len(kernels) + len(load_rows(rows / "op_sweep.jsonl"))
    fitted, committed_fit = (
        json.loads((d / "profile.json").read_text()) for d in (rows, committed)
    )
    assert "dense_verify" in fitted["classes"] and "gemm" in fitted["classes"]
    assert set(fitted["classes"]) < set(committed_fit["classes"])
    same = {k: committed_fit["classes"][k] for k in fitted["classes"]}
    agree = fit_agreement(
        ceilings.profile_rows("h100-sxm", rows), fitted, {**committed_fit, "classes": same}
    )
    assert not disagreements(agree), agree
    assert {p.name: p.stat().st_mtime_ns for p in committed.iterdir()} == before
    assert h100_campaign.main(["--fit", str(tmp_path / "none")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_the_sweeps_exit_3_only_when_the_budget_left_configs_out(tmp_path, monkeypatch):
    import torch
    from ssvkit.calibration import kernel_sweep, runner, sweep
    from ssvkit.kernels import timing as tm

    assert sweep.STOPPED_AT_BUDGET == kernel_sweep.STOPPED_AT_BUDGET == STAGE_STOPPED
    # Past the budget, a config already in the file is no stop; a missing one is.
    r = runner.Runner(tmp_path / "rows.jsonl", 1.0, config=tm.QUICK_TIMING, timings=("graph",))
    r.done = {runner.row_key("op", "graph", {"m": 1})}
    work = dict(num_inputs=1, unique_bytes=1.0, flops=1.0)
    r.time_op("op", {"m": 1}, lambda i: pytest.fail("timed a done config"), **work)
    assert not r.stopped
    r.time_op("op", {"m": 2}, lambda i: pytest.fail("timed past the budget"), **work)
    assert r.stopped and not r.path.exists()

    def fake_runner(*args, **kwargs):
        r = runner.Runner(tmp_path / "rows.jsonl", 600.0, config=tm.QUICK_TIMING)
        r.ceil = dict(copy_bytes_per_s=1e12, gemm_flops_per_s=1e15, launch=1e-6, graph=1e-6)
        r.measure_ceilings = dict
        return r

    prov = dict(device_name="fake", torch_version="-", triton_version="-", git_commit="-")
    monkeypatch.setattr(tm, "provenance", lambda: prov)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(sweep, "new_runner", fake_runner)
    monkeypatch.setattr(kernel_sweep, "new_runner", fake_runner)
    monkeypatch.setattr(kernel_sweep, "write_ceilings", lambda r: None)
    for stop in (False, True):
        monkeypatch.setattr(sweep, "gemm_sweep", lambda s, stop=stop: setattr(s, "stopped", stop))
        argv = ["--out", str(tmp_path), "--ops", "gemm"]
        assert sweep.main(argv) == (STAGE_STOPPED if stop else 0)
        dense = lambda r, cfg, seed, mod, stop=stop: setattr(r, "stopped", stop)
        monkeypatch.setitem(kernel_sweep.STEPS_RUN, "dense", (lambda mod: None, None))
        monkeypatch.setattr(kernel_sweep.ops, "run_config", dense)
        argv = ["--out", str(tmp_path), "--ops", "dense"]
        assert kernel_sweep.main(argv) == (STAGE_STOPPED if stop else 0)
