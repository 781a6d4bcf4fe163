import numpy as np
import pytest
from ssvkit.perfmodel.baselines import compare
from ssvkit.perfmodel.costs import kv_capacity_tokens
from ssvkit.perfmodel.hardware import get_gpu
from ssvkit.perfmodel.models import get_model
from ssvkit.perfmodel.strategy import Strategy, Workload
from ssvkit.sweep.grid import spec_from_doc
from ssvkit.sweep.partition import partitions
from ssvkit.sweep.runner import grid_strategies, run_sweep

SMALL = {
    "context_len": ["4K", "32K"],
    "batch": [1, 8],
    "acceptance": [0.6, 0.8],
    "vary": {"group_size": [2, 4]},
}


def _equal(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        x, y = a[k], b[k]
        same = np.array_equal(x, y, equal_nan=True) if x.dtype.kind == "f" else np.array_equal(x, y)
        assert same, k


@pytest.fixture(scope="module")
def small():
    return run_sweep(spec_from_doc(SMALL), workers=1)


def test_matches_perfmodel_compare_point_by_point():
    spec = spec_from_doc({"context_len": ["8K", "64K"], "acceptance": [0.8], "batch": [2]})
    t = run_sweep(spec, workers=1).table
    rows = compare(
        get_model("llama-3.1-8b"),
        get_gpu("h100-sxm"),
        [
            Strategy.from_name(n)
            for n in ("ar_dense", "ar_sparse", "sd_dense", "sd_sparse_naive", "ssv")
        ],
        [8192, 65536],
        Workload(acceptance=0.8, batch=2),
    )
    assert len(rows) == 10
    # the naive baseline's one-row NSA path is priced by a stand-in class, labelled so; the
    # other points' ops all have classes
    nsa = {r["strategy"] for r in rows if any("per_query" in x for x in r["stand_ins"])}
    assert nsa == {"sd_sparse_naive"}
    stood = {r["strategy"] for r in rows if r["provenance"].endswith(":stand-in")}
    assert stood == {"sd_sparse_naive"}
    for r in rows:
        i = np.flatnonzero(
            (t["strategy"] == r["strategy"]) & (t["context_len"] == r["context_len"])
        )
        assert len(i) == 1
        i = i[0]
        for k in ("tokens_per_s", "round_s", "speedup_vs_ar_dense", "speedup_vs_ar_sparse"):
            assert t[k][i] == pytest.approx(r[k], rel=1e-12), k
        assert t["provenance"][i] == r["provenance"]
        assert t["tpot_s"][i] == pytest.approx(r["round_s"] / r["tokens_per_round"], rel=1e-12)


def test_speedups_and_best_per_cell(small):
    t = small.table
    assert small.num_points == 6 * 8  # 4 baselines + ssv at 2 group sizes, 2 x 2 x 2 cells
    cells = list(zip(t["context_len"], t["batch"], t["acceptance"], strict=True))
    for cell in set(cells):
        rows = [i for i, c in enumerate(cells) if c == cell]
        ref = next(i for i in rows if t["strategy"][i] == "ar_dense")
        assert t["speedup_vs_ar_dense"][ref] == 1.0
        for i in rows:
            assert t["speedup_vs_ar_dense"][i] == pytest.approx(
                t["tokens_per_s"][i] / t["tokens_per_s"][ref], rel=1e-14
            )
        ok = [i for i in rows if t["feasible"][i] and t["fits_memory"][i]]
        best = [i for i in rows if t["best"][i]]
        assert len(best) == (1 if ok else 0)
        if ok:
            assert t["tokens_per_s"][best[0]] == max(t["tokens_per_s"][i] for i in ok)


def test_hidden_anchors_are_dropped_but_speedups_kept():
    spec = spec_from_doc({"strategies": ["ssv"], "context_len": ["16K"]})
    strategies, requested = grid_strategies(spec)
    assert [s.label for s in strategies] == ["ssv", "ar_dense", "ar_sparse"]
    assert requested.tolist() == [True, False, False]
    t = run_sweep(spec, workers=1).table
    assert t["strategy"].tolist() == ["ssv"]
    full = run_sweep(spec_from_doc({"context_len": ["16K"]}), workers=1).table
    i = full["strategy"].tolist().index("ssv")
    assert t["speedup_vs_ar_sparse"][0] == full["speedup_vs_ar_sparse"][i]


def test_infeasible_and_memory_flags():
    spec = spec_from_doc(
        {
            "context_len": [512, "128K"],
            "batch": [1, 128],
            "tp": [1, 3],
            "strategies": ["ar_dense", "ar_sparse"],
        }
    )
    t = run_sweep(spec, workers=1).table
    sparse_short = (t["strategy"] == "ar_sparse") & (t["context_len"] == 512)
    tp3 = t["tp"] == 3  # 32 query heads do not split over 3 ranks
    assert not t["feasible"][sparse_short | tp3].any()
    assert np.isnan(t["tokens_per_s"][sparse_short | tp3]).all()
    assert t["feasible"][~(sparse_short | tp3)].all()
    cap = kv_capacity_tokens(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), 1, 2)
    need = t["batch"] * (t["context_len"] + t["num_draft_tokens"] + 1)
    assert (t["fits_memory"] == (need <= cap))[~tp3].all()
    assert not t["fits_memory"][(t["batch"] == 128) & (t["context_len"] == 131072)].any()
    assert not t["best"][~t["fits_memory"] | ~t["feasible"]].any()


def test_partitions_tile_the_grid_in_order():
    spec = spec_from_doc({**SMALL, "models": ["llama-3.1-8b", "qwen3-8b"]})
    strategies, _ = grid_strategies(spec)
    total = len(spec.models) * len(strategies) * spec.num_workload_points
    for size in (1, 3, 8, 20, 10_000):
        parts = partitions(spec, strategies, size)
        covered = np.concatenate([np.arange(p.start, p.start + p.num_points) for p in parts])
        assert covered.tolist() == list(range(total)), size
        per_context = spec.num_workload_points // len(spec.context_len)
        assert all(p.num_points <= max(size, per_context) for p in parts)


def test_partition_size_and_executor_do_not_change_results(small):
    spec = spec_from_doc(SMALL)
    for size in (1, 7, 64):
        other = run_sweep(spec, workers=1, partition_points=size).table
        for k, v in small.table.items():
            if v.dtype.kind == "f":
                np.testing.assert_allclose(other[k], v, rtol=1e-12, err_msg=k)
            else:
                assert np.array_equal(other[k], v), k
    procs = run_sweep(spec, workers=2, partition_points=7)
    assert procs.facts["executor"] == "processes:2"
    serial = run_sweep(spec, workers=1, partition_points=7)
    _equal(procs.table, serial.table)


def test_dask_local_cluster_is_identical_to_serial():
    distributed = pytest.importorskip("dask.distributed")
    spec = spec_from_doc(SMALL)
    serial = run_sweep(spec, workers=1, partition_points=5)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        dask = run_sweep(spec, scheduler=cluster.scheduler_address, partition_points=5)
    assert dask.facts["executor"].startswith("dask:")
    assert dask.facts["partitions"] > 4
    _equal(dask.table, serial.table)


def test_drafter_models_never_share_a_partition():
    spec = spec_from_doc(
        {
            "models": ["llama-3.1-70b"],
            "context_len": ["16K"],
            "strategies": [
                "sd_dense",
                {
                    "name": "sd_small",
                    "base": "sd_dense",
                    "drafter": {"kind": "draft_model", "model": "llama-3.1-8b"},
                },
                "ssv",
            ],
        }
    )
    strategies, _ = grid_strategies(spec)
    parts = partitions(spec, strategies, 10_000)
    models = [{s.strategy.drafter.model for s in p.strategies if s.speculative} for p in parts]
    assert all(len(m) == 1 for m in models) and len(parts) == 3
    t = run_sweep(spec, workers=1).table
    drafted = t["strategy"] == "sd_small"
    eagle = t["strategy"] == "sd_dense"
    assert t["draft_s"][drafted][0] > t["draft_s"][eagle][0]  # an 8B draft model costs more


def test_simulated_points_track_the_analytic_model():
    spec = spec_from_doc(
        {
            "context_len": ["8K"],
            "strategies": ["ar_dense", "ssv"],
            "simulate": {"num_tokens": 96, "seed": 3},
        }
    )
    t = run_sweep(spec, workers=1).table
    assert np.isfinite(t["sim_tokens_per_s"]).all()
    assert all(p.startswith("sim:") and "seed=3" in p for p in t["sim_provenance"])
    ratio = t["sim_tokens_per_s"] / t["tokens_per_s"]
    assert ratio[0] == pytest.approx(1.0, rel=0.05)  # AR: no acceptance noise
    assert 0.6 < ratio[1] < 1.4


def test_progress_bar_counts_the_points_off_a_terminal_when_asked(capsys):
    spec = spec_from_doc({"context_len": ["8K"], "batch": [1, 2]})
    run_sweep(spec, workers=1, progress=True)
    err = capsys.readouterr().err
    total = len(grid_strategies(spec)[0]) * 2
    assert "sweep: " in err and f"/{total} [" in err and "points" in err
    run_sweep(spec, workers=1)
    assert capsys.readouterr().err == ""
