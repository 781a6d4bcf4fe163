"""The NSA launch benchmark's calls and check, run once in the CPU interpreter on a small case (a
call renamed or re-signed fails here rather than on the GPU machine), its tables from a row as
it writes them, and its refusal without a GPU."""

import json

import pytest
import torch
from ssvkit.validation import launch_times as lt
from ssvkit.validation import nsa_launches as nl
from ssvkit.validation import nsa_launches_table as nt
from ssvkit.validation import nsa_stages as ns


@pytest.mark.parametrize("batch", [1, 2])
def test_every_call_runs_and_passes_its_check(small_nsa, batch):
    config = nl.dataclasses.replace(nl.DEFAULT_CONFIG, rows_per_tile=2)
    sets = ns.input_sets(batch, 4, 384, 388, nl.NUM_SETS)
    unions = [
        nl.nv.nsa_union_plan(a[0], a[1], idx, block_size=ns.KW["block_size"], config=config)
        for a, idx in sets
    ]
    nl.check(sets, unions, config, batch)  # every call; SystemExit on a mismatch or NaN
    o, idx = nl._call("refresh", sets, unions, config, 1)
    assert not torch.isnan(o).any() and idx.shape[-1] == ns.KW["top_n"]


def test_a_wrong_call_stops_the_run(small_nsa, monkeypatch):
    sets = ns.input_sets(1, 4, 384, 388, nl.NUM_SETS)
    unions = [nl.nv.nsa_union_plan(a[0], a[1], i, block_size=ns.KW["block_size"]) for a, i in sets]
    real = nl._call

    def off(name, *args):
        o, idx = real(name, *args)
        return (o + 1 if name == "reuse_unfused" else o), idx

    monkeypatch.setattr(nl, "_call", off)
    with pytest.raises(SystemExit, match="reuse_unfused differs"):
        nl.check(sets, unions, nl.DEFAULT_CONFIG, 1)


def test_kernel_names_lose_their_template_arguments():
    torch_fill = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>(int)"
    )
    assert lt.kernel_name(torch_fill) == "at::native::vectorized_elementwise_kernel"
    assert lt.kernel_name("nsa_fwd_kernel") == "nsa_fwd_kernel"


def test_tables_show_each_launch_against_the_floor(capsys):
    launches = [
        {"kernel": "nsa_fwd_kernel", "median_s": 12.8e-6},
        {"kernel": "stored_block_score_kernel", "median_s": 3.3e-6},
        {"kernel": "at::native::vectorized_elementwise_kernel", "median_s": 1.2e-6},
        {"kernel": "threshold_blocks_kernel", "median_s": 5.5e-6},
        {"kernel": "nsa_fwd_kernel", "side_stream": True, "median_s": 5.0e-6},
    ]
    call = dict(graph_s=36.8e-6, kernel_sum_s=27.8e-6, launches=launches)
    row = dict(batch=1, num_query_tokens=1, context_len=131072, rows_per_tile=0, floor_s=9.2e-6)
    row["calls"] = {"refresh": call}
    md = nt.launches_markdown([row])
    assert "| b1 t1 128K r0 | `refresh` | 9.2 | 36.8 | 4.00 | 27.8 |" in md
    assert "fwd 12.8, scores 3.3, fill 1.2, pick 5.5, fwd* 5.0" in md
    nt.print_table([row])
    assert "fwd 12.8, scores 3.3, fill 1.2, pick 5.5, fwd* 5.0" in capsys.readouterr().out


def test_without_a_gpu_it_refuses_in_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(nl.torch.cuda, "is_available", lambda: False)
    out = tmp_path / "launches.json"
    with pytest.raises(SystemExit) as e:
        nl.main(["--out", str(out)])
    assert e.value.code == 2 and not out.exists()
    assert (
        capsys.readouterr().err.strip()
        == "nsa_launches: needs a CUDA GPU (device-side launch times)"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cases", "1:1:131072"], "--cases '1:1:131072': expected batch:draft rows:context"),
        (["--cases", "0:1:8192:0"], "--cases '0:1:8192:0': expected batch:draft rows:context"),
        (["--cases", "1:x:8192:0"], "--cases '1:x:8192:0': expected batch:draft rows:context"),
        (["--set", "warps=8"], "--set 'warps=8': expected name=value with a name of block_m"),
        (["--set", "num_warps=eight"], "--set 'num_warps=eight': 'eight' is no int"),
        (["--set", "pdl=maybe"], "--set 'pdl=maybe': 'maybe' is no bool"),
        (["--set", "num_warps=3"], "num_warps must be a power of two <= 16, got 3"),
    ],
)
def test_bad_cases_and_settings_are_refused_in_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "launches.json"
    with pytest.raises(SystemExit) as e:
        nl.main(["--out", str(out), *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and not out.exists()
    assert err.startswith(f"nsa_launches: {message}") and "\n" not in err


def test_cases_and_settings_reach_each_case(monkeypatch, tmp_path):
    """``--cases``, ``--calls`` and ``--set`` give ``run_case`` its shapes, calls and configs:
    every case under each setting, ``default`` the default config."""
    seen = []

    def fake_run_case(batch, t, ctx, rows, copy_bps, calls, base):
        seen.append((batch, t, ctx, rows, calls, base))
        row = dict(batch=batch, num_query_tokens=t, context_len=ctx, rows_per_tile=rows)
        return dict(row, floor_s=1e-5, config=nl.changed_fields(base), calls={})

    monkeypatch.setattr(nl.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(nl.tm, "copy_bytes_per_s", lambda: 4e12)
    monkeypatch.setattr(nl, "run_case", fake_run_case)
    from ssvkit.validation import bench_documents as bd

    monkeypatch.setattr(bd, "provenance", lambda: {"device_name": "a GPU"})
    out = tmp_path / "launches.json"
    argv = ["--out", str(out), "--cases", "1:1:131072:0", "2:16:8192:4"]
    argv += ["--calls", "refresh", "--set", "default", "ctas_per_sm=2, num_warps=8"]
    assert nl.main(argv) == 0
    assert [s[:5] for s in seen] == [
        (1, 1, 131072, 0, ("refresh",)),
        (2, 16, 8192, 4, ("refresh",)),
    ] * 2
    assert [s[5] for s in seen[:2]] == [nl.DEFAULT_CONFIG] * 2
    assert seen[2][5].ctas_per_sm == 2 and seen[2][5].num_warps == 8
    doc = json.loads(out.read_text())
    assert [r["config"] for r in doc["rows"]] == [{}, {}, *[{"ctas_per_sm": 2, "num_warps": 8}] * 2]
    assert nt.case_label(doc["rows"][2]) == "b1 t1 128K r0 num_warps=8,ctas_per_sm=2"
    assert nt.case_label(doc["rows"][0]) == "b1 t1 128K r0"


@pytest.mark.gpu
def test_a_case_on_the_gpu_lists_every_launch_of_each_call():
    """At 8K, batch 1: the reference check passes, each call's launches are matched across the
    profiled calls, and the unfused calls' branches show on their side streams."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    row = nl.run_case(1, 4, 8192, 4, copy_bps=4e12)
    assert set(row["calls"]) == set(nl.CALLS)
    for name, call in row["calls"].items():
        kernels = [x["kernel"] for x in call["launches"]]
        assert "nsa_fwd_kernel" in kernels or "nsa_pair_fwd_kernel" in kernels, name
        assert call["graph_s"] > 0 and call["kernel_sum_s"] > 0
        side = any(x["side_stream"] for x in call["launches"])
        assert side == name.endswith("_unfused"), name
    assert "threshold_blocks_kernel" in [x["kernel"] for x in row["calls"]["refresh"]["launches"]]


def test_profiling_tears_cupti_down_at_the_session_end(monkeypatch):
    """``launch_times`` sets ``TEARDOWN_CUPTI=1`` before its profiler session (an attached CUPTI
    slows every later launch the process times) and matches each call's launches by stream and
    place."""
    from types import SimpleNamespace

    cuda = lt.torch.autograd.DeviceType.CUDA
    seen_env = []

    def event(name, start, dur, stream=7):
        return SimpleNamespace(
            name=name,
            device_type=cuda,
            device_resource_id=stream,
            time_range=SimpleNamespace(start=start, end=start + dur),
        )

    class FakeProfile:
        def __init__(self, activities):
            pass

        def __enter__(self):
            seen_env.append(lt.os.environ.get("TEARDOWN_CUPTI"))
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            calls = [(0, 4.0, 2.0), (100, 6.0, 2.0), (200, 5.0, 3.0)]
            return [
                e
                for c, fwd, merge in calls
                for e in (event("fwd", c, fwd), event("merge", c + 10, merge))
            ]

    import torch.profiler

    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(lt.torch.cuda, "synchronize", lambda: None)
    got = lt.launch_times(lambda i: None, calls=3)
    assert seen_env == ["1"]
    assert [x["kernel"] for x in got] == ["fwd", "merge"]
    assert [x["median_s"] for x in got] == pytest.approx([5.0e-6, 2.0e-6])
    assert not any(x["side_stream"] for x in got)


def test_profiler_teardown_refuses_without_a_gpu(tmp_path, capsys, monkeypatch):
    from ssvkit.validation import profiler_teardown as pt

    monkeypatch.setattr(pt.torch.cuda, "is_available", lambda: False)
    out = tmp_path / "teardown.json"
    with pytest.raises(SystemExit) as e:
        pt.main(["--out", str(out)])
    assert e.value.code == 2 and not out.exists()
    assert capsys.readouterr().err.strip() == "profiler_teardown: needs a CUDA GPU"


def test_profiler_teardown_table_shows_each_setting():
    from ssvkit.validation import profiler_teardown as pt

    rows = [
        {"teardown_cupti": s, "before": {"host_s": 8e-6, "event_s": 4e-4},
         "after": {"host_s": h, "event_s": 4e-4 + h}}
        for s, h in (("0", 2.1e-4), ("1", 9e-6))
    ]  # fmt: skip
    lines = pt.table(rows).splitlines()
    assert len(lines) == 3
    assert lines[1].split()[:4] == ["0", "8.0", "->", "210.0"]
    assert lines[2].split()[:4] == ["1", "8.0", "->", "9.0"]


@pytest.mark.gpu
def test_gpu_profiler_teardown_measures_both_settings(tmp_path):
    if not lt.torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ssvkit.validation import profiler_teardown as pt

    out = tmp_path / "teardown.json"
    assert pt.main(["--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["teardown_cupti"] for r in doc["rows"]] == ["0", "1"]
    for r in doc["rows"]:
        for when in ("before", "after"):
            assert r[when]["host_s"] > 0 and r[when]["event_s"] > 0
