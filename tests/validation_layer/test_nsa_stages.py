"""The NSA stage benchmark's calls, each run once in the CPU interpreter on a small case, so a
kernel step renamed or re-signed fails here rather than on the GPU machine; and its run cache
and stop rule, with the timing replaced."""

import json

import torch
from ssvkit.calibration import kernel_inputs as ki
from ssvkit.validation import nsa_stages as ns
from ssvkit.validation import nsa_stages_table as nt

# Every name the tables print.
PRINTED = {*nt.COLUMNS, *nt.PDL_PAIRS, *(f"{n}_pdl" for n in nt.PDL_PAIRS)}


def test_every_timed_call_of_the_benchmark_runs(small_nsa):
    sets, plan, slots, rslots, unions, parts = ns.prepare(1, 2, 256, 258, num_sets=1)
    calls = ns.calls(sets, plan, slots, rslots, unions, parts)
    assert {"reuse", "refresh", "stage_scores", "stage_topk", "stage_merge"} <= set(calls)
    assert PRINTED <= set(calls)
    out = {name: fn(0) for name, fn in calls.items()}
    o, idx = out["refresh"]
    assert not torch.isnan(o).any() and idx.shape == (1, ki.NUM_KV_HEADS, 2, ns.KW["top_n"])
    o_sep, idx_sep = out["refresh_folded"]
    assert torch.equal(idx, idx_sep)
    torch.testing.assert_close(o, o_sep, atol=1e-5, rtol=1e-5)
    for name in ns.CALLS:  # the same arithmetic with and without PDL
        for x, x_pdl in zip(out[name], out[f"{name}_pdl"], strict=True):
            assert torch.equal(x, x_pdl)
    assert torch.equal(out["select"], out["select_pdl"])


def fake_case(bsz, t, ctx, capacity, copy_bps):
    """A row as ``run_case`` writes it, with made-up times."""
    times = {name: 1e-5 * (i + 1) for i, name in enumerate(sorted(PRINTED))}
    return dict(
        batch=bsz,
        num_query_tokens=t,
        context_len=ctx,
        capacity=capacity or ctx + t,
        floor_s=5e-6,
        copy_bytes_per_s=copy_bps,
        times_s=times,
    )


def test_stop_after_and_resume_go_on_where_the_run_stopped(monkeypatch, tmp_path, capsys):
    ran = []

    def case(*args):
        ran.append(args[:4])
        return fake_case(*args)

    monkeypatch.setattr(ns, "run_case", case)
    monkeypatch.setattr(ns.tm, "copy_bytes_per_s", lambda: 4e12)
    out, cache = tmp_path / "stages.json", tmp_path / "stages.jsonl"
    args = ["--out", str(out), "--resume", str(cache)]
    assert ns.main([*args, "--stop-after", "0"]) == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["rows"] == [] and ran == []
    assert "run again with --resume" in capsys.readouterr().out
    assert ns.main(args) == 0
    assert len(ran) == len(ns.CASES)
    assert ns.main(args) == 0  # every case from the cache: nothing runs again
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and len(ran) == len(doc["rows"]) == len(ns.CASES)
    printed = capsys.readouterr().out
    assert "fold saves" in printed and "b1 t16 128K" in printed
    assert "with PDL" in printed and "r_select" in printed


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_results_tables_put_each_call_in_its_column():
    """The results page's blocks (``calls_markdown``, ``pdl_markdown``): every call's time in
    its own column, a context run in a larger cache labelled so, PDL beside the default."""
    rows = [
        fake_case(1, 16, 32 * 1024, 128 * 1024 + 17, 4e12),
        fake_case(16, 1, 64 * 1024, 0, 4e12),
    ]
    calls = nt.calls_markdown(rows).splitlines()
    header, first = _cells(calls[0]), _cells(calls[2])
    assert first[:4] == ["1", "16", "32K (cache 128K)", "5.0"]
    assert _cells(calls[3])[:3] == ["16", "1", "64K"] and len(calls) == 4
    times = {k: f"{v * 1e6:.1f}" for k, v in rows[0]["times_s"].items()}
    assert len(set(times.values())) == len(times)  # distinct: a column swap would show
    for name, label in nt.MARKDOWN_CALLS.items():
        assert first[header.index(label)] == times[name]
    pdl = nt.pdl_markdown(rows).splitlines()
    header, first = _cells(pdl[0]), _cells(pdl[2])
    for name in nt.MARKDOWN_PDL:
        assert (
            first[header.index(name.replace("_", " "))] == f"{times[name]} / {times[name + '_pdl']}"
        )
