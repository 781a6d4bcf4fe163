"""The campaign at scale, end to end on the CPU: a tiny random geometry (a config.json of its
own), context 256, batches 1 and 2, two baselines. Checks the rows' schema (measured figures,
synthetic acceptance, overlap, prediction, rounds' trace, provenance, memory arithmetic, the
prefill reused within a group), a cell that cannot fit recorded as skipped, that a second call
reuses every finished cell, and the shards: a campaign split in two and merged holds the cells
and decoded tokens of the unsharded one, in its order, and ``ssvkit report --campaign`` reads
it; the merge refuses documents of other settings and files given twice; ``--plan``."""

from __future__ import annotations

import json

import pytest
from ssvkit.validation import scale_campaign, scale_measure
from ssvkit.validation.full_batch import derived
from ssvkit.validation.records import NSA_SCHEDULE

from ssvkit.cli import main as cli_main

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
# 1 MiB: no cell fits.
ONE_MIB_GIB = str(1 / 1024)


@pytest.fixture(scope="module")
def geometry(tmp_path_factory):
    path = tmp_path_factory.mktemp("geometry") / "config.json"
    path.write_text(json.dumps(CONFIG))
    return f"random:{path}"


def _argv(model, tmp_path, batches="1,2", name="campaign"):
    return [
        "--models",
        model,
        "--contexts",
        "256",
        "--batches",
        batches,
        "--baselines",
        "ar_dense,sd_sparse_naive",
        "--acceptances",
        "0.8",
        "--new-tokens",
        "6",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / f"{name}.json"),
        "--resume",
        str(tmp_path / f"{name}.jsonl"),
    ]


def test_the_campaign_runs_records_and_resumes(geometry, tmp_path, capsys, monkeypatch):
    assert scale_campaign.main(_argv(geometry, tmp_path)) == 0
    doc = json.loads((tmp_path / "campaign.json").read_text())
    rows = doc["rows"]
    assert [(r["batch"], r["baseline"], r["acceptance"]) for r in rows] == [
        (1, "ar_dense", None),
        (1, "sd_sparse_naive", 0.8),
        (2, "ar_dense", None),
        (2, "sd_sparse_naive", 0.8),
    ]
    for r in rows:
        assert r["status"] == "measured" and r["memory"]["fits"]
        m = r["measured"]
        assert m["tokens_per_s"] > 0 and set(m["steps_s"]) >= {"draft", "verify", "accept"}
        assert len(m["accepted_per_sequence"][0]) == r["batch"]
        assert all(len(x) == 3 for x in m["rounds_trace"])
        assert [len(x) for x in m["sequences_per_round"]] == [
            len(x) for x in m["accepted_per_sequence"]
        ]
        # The full-batch figures recorded from the rounds are those a row without them derives
        # from its accepted counts (the wall time aside: measured per round here).
        if "full_batch" in m:
            kept = {k: v for k, v in m.items() if k != "full_batch"}
            again = derived(kept, r["batch"])
            for k in ("rounds", "tokens", "mean_accepted", "tokens_per_round"):
                assert again[k] == pytest.approx(m["full_batch"][k])
        assert r["provenance"]["git_commit"] and r["provenance"]["torch_version"]
        assert "tokens_per_s" in r["prediction"] or "error" in r["prediction"]
    assert all("full_batch" in r["measured"] for r in rows if r["acceptance"] is None)
    sparse = rows[1]
    assert sparse["measured_acceptance"]["source"] == "synthetic:oracle"
    assert sparse["measured_acceptance"]["oracle"] == [0.8]
    assert sparse["selection"]["group_overlap"] is not None
    assert rows[0]["measured_acceptance"]["source"] == "measured"
    # The NSA run records its row schedule (the naive baseline: one draft row a tile).
    assert NSA_SCHEDULE not in rows[0] and sparse[NSA_SCHEDULE] == 1
    assert doc["provenance"]["runs_from_cache"] == 0 and doc["complete"]
    # Each group's first cell prefills; the oracle cell reuses that prefill for its reference
    # pass and its decode, and records the measured seconds of the one it read.
    assert [r["prefill"]["reused"] for r in rows] == [False, True, False, True]
    assert rows[1]["prefill"]["forward_s"] == rows[0]["prefill"]["forward_s"] > 0
    assert doc["cells"] == [
        f"{geometry}|256|{b}|{n}|{a}|{b}"
        for b, n, a in [(1, "ar_dense", None), (1, "sd_sparse_naive", 0.8)]
        + [(2, "ar_dense", None), (2, "sd_sparse_naive", 0.8)]
    ]
    # A second call decodes nothing: every cell comes from the run cache.
    monkeypatch.setattr(scale_measure, "measure_cell", _never)
    assert scale_campaign.main(_argv(geometry, tmp_path)) == 0
    again = json.loads((tmp_path / "campaign.json").read_text())
    assert again["provenance"]["runs_from_cache"] == 4
    assert again["rows"] == rows


def test_stop_after_writes_the_cells_so_far_and_a_later_call_goes_on(geometry, tmp_path):
    assert scale_campaign.main([*_argv(geometry, tmp_path), "--stop-after", "0"]) == 0
    doc = json.loads((tmp_path / "campaign.json").read_text())
    assert doc["rows"] == [] and not doc["complete"]
    assert scale_campaign.main(_argv(geometry, tmp_path, batches="1")) == 0
    doc = json.loads((tmp_path / "campaign.json").read_text())
    assert len(doc["rows"]) == 2 and doc["complete"]


def _never(*args, **kwargs):
    raise AssertionError("a finished cell was decoded again")


def test_a_cell_that_cannot_fit_is_skipped_with_the_arithmetic(geometry, tmp_path, monkeypatch):
    monkeypatch.setattr(scale_measure, "measure_cell", _never)
    argv = [*_argv(geometry, tmp_path, batches="2"), "--available-gib", ONE_MIB_GIB]
    assert scale_campaign.main(argv) == 0
    rows = json.loads((tmp_path / "campaign.json").read_text())["rows"]
    assert all(r["status"] == "skipped" for r in rows)
    assert rows[0]["reason"].startswith("batch 2 at context 256 needs ")
    assert rows[0]["memory"]["need_bytes"] > rows[0]["memory"]["available_bytes"] == 1 << 20


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--models", "tiny"], "random:NAME"),
        (["--baselines", "ar_fast"], "unknown baseline 'ar_fast'"),
        (["--acceptances", "1.5"], "(0, 1]"),
        (["--new-tokens", "0"], "--new-tokens must be >= 1"),
        (["--batches", "1,x"], "x"),
        (["--out", "--shard=2/2"], "0 <= K < N"),
        (["--out", "--shard=1-2"], "K/N"),
        (["--out", "--available-gib=-1"], "--available-gib must be > 0"),
        (["--out", "--available-gib=1e9"], "exceeds the"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(geometry, tmp_path, capsys, change, message):
    argv = _argv(geometry, tmp_path)
    if change[0] == "--out":  # an option of its own, with --out kept
        argv.append(change[1])
    else:
        argv[argv.index(change[0]) + 1] = change[1]
    assert scale_campaign.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "campaign.json").exists()


SHARDED = ["--baselines", "ar_dense,ssv", "--acceptances", "0.8", "--batches", "1,2,max"]


def _sharded(geometry, tmp_path, name, *extra):
    argv = _argv(geometry, tmp_path, name=name)
    argv[argv.index("--baselines") : argv.index("--baselines") + 2] = []
    argv[argv.index("--batches") : argv.index("--batches") + 2] = []
    argv[argv.index("--acceptances") : argv.index("--acceptances") + 2] = []
    argv += [*SHARDED, "--max-batch-limit", "3", "--available-gib", "4", *extra]
    assert scale_campaign.main(argv) == 0
    return json.loads((tmp_path / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def shards(geometry, tmp_path_factory):
    """The sharded settings' campaign, whole (``whole``) and as its two shards (``part0``,
    ``part1``): the folder of their documents and run caches, and the documents. The tests read
    them and write elsewhere."""
    folder = tmp_path_factory.mktemp("shards")
    runs = {"whole": (), "part0": ("--shard", "0/2"), "part1": ("--shard", "1/2")}
    return folder, {name: _sharded(geometry, folder, name, *extra) for name, extra in runs.items()}


def _decoded(row: dict) -> dict:
    """What a deterministic decode of a cell gives whatever its shard or prefill."""
    m = row["measured"]
    keys = ("tokens", "rounds_trace", "accepted_per_sequence", "tokens_crc32", "mean_accepted")
    return {**{k: m[k] for k in keys}, "acceptance": row["measured_acceptance"]}


def test_two_shards_merged_hold_the_unsharded_campaign(shards, tmp_path, capsys):
    folder, docs = shards
    whole, parts = docs["whole"], [docs["part0"], docs["part1"]]
    groups = [tuple(g) for p in parts for g in p["shard"]["groups"]]
    assert len(groups) == len(set(groups)) == 3  # batches 1, 2 and max (3), each in one shard
    assert all(p["shard"]["groups"] and p["complete"] for p in parts)
    assert sorted(len(p["rows"]) for p in parts) != [0, len(whole["rows"])]
    out = tmp_path / "merged.json"
    files = ",".join(str(folder / f"part{k}.json") for k in (1, 0))
    assert scale_campaign.main(["--merge", files, "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["complete"] and merged["cells"] == whole["cells"]
    assert merged["shard"] == {"index": None, "count": 2, "merged": [0, 1]}
    assert [(r["label"], r["baseline"]) for r in merged["rows"]] == [
        (r["label"], r["baseline"]) for r in whole["rows"]
    ]
    for m, w in zip(merged["rows"], whole["rows"], strict=True):
        assert _decoded(m) == _decoded(w)
    assert [s["index"] for s in merged["provenance"]["shards"]] == [0, 1]
    capsys.readouterr()
    assert cli_main(["report", "--campaign", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["campaign"]["complete"] and len(rep["cells"]) == len(whole["rows"])
    # One shard alone: the cells of the other are missing.
    assert scale_campaign.main(["--merge", str(folder / "part0.json"), "--out", str(out)]) == 0
    alone = json.loads(out.read_text())
    assert not alone["complete"] and alone["rows"] == parts[0]["rows"]


def test_merge_refuses_other_settings_and_a_shard_twice(geometry, tmp_path, capsys):
    a = _sharded(geometry, tmp_path, "a", "--shard", "0/2", "--stop-after", "0")
    other = _sharded(
        geometry, tmp_path, "b", "--shard", "1/2", "--stop-after", "0", "--new-tokens", "5"
    )
    assert a["rows"] == other["rows"] == []
    out = tmp_path / "m.json"
    for files, message in [
        (["a", "b"], "in new_tokens: 5 vs 6"),
        (["a", "a"], "a.json is given twice"),
        (["a", "missing"], "missing"),
    ]:
        paths = ",".join(str(tmp_path / f"{f}.json") for f in files)
        assert scale_campaign.main(["--merge", paths, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
        assert not out.exists()
    b = dict(
        a, provenance=dict(a["provenance"], git_commit="0" * 40), shard=dict(a["shard"], index=1)
    )
    (tmp_path / "c.json").write_text(json.dumps(b))
    paths = f"{tmp_path / 'a.json'},{tmp_path / 'c.json'}"
    assert scale_campaign.main(["--merge", paths, "--out", str(out)]) == 2
    assert "in git_commit" in capsys.readouterr().err


def test_plan_prints_each_shard_and_the_largest_batches(geometry, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(scale_measure, "measure_cell", _never)
    argv = _argv(geometry, tmp_path)
    argv[argv.index("--batches") + 1] = "1,max"
    out = tmp_path / "plan.json"
    argv[argv.index("--out") + 1] = str(out)
    argv += ["--plan", "2", "--available-gib", "4", "--max-batch-limit", "8", "--device", "cuda"]
    assert scale_campaign.main(argv) == 0
    text = capsys.readouterr().out
    plan = json.loads(out.read_text())
    assert list(plan["max_batch"].values()) == [8] and "shard 1:" in text
    assert sorted(g["shard"] for g in plan["groups"]) == [0, 1]
    for g in plan["groups"]:
        assert g["estimate_s"] == pytest.approx(g["prefill_s"] + g["decode_s"], abs=0.06)
        assert g["prefill_s"] > 0 and g["decode_s"] > 0
    big = max(plan["groups"], key=lambda g: g["batch"])
    small = min(plan["groups"], key=lambda g: g["batch"])
    assert big["batch"] == 8 and big["prefill_flops"] == pytest.approx(8 * small["prefill_flops"])
    assert not (tmp_path / "campaign.json").exists()


def test_a_max_batch_equal_to_a_fixed_one_decodes_once(geometry, tmp_path, monkeypatch):
    calls = []
    real = scale_measure.run_cell
    monkeypatch.setattr(
        scale_measure, "run_cell", lambda st, r, cell: calls.append(cell.slot) or real(st, r, cell)
    )
    argv = _argv(geometry, tmp_path, batches="1,max")
    argv = argv[: argv.index("--resume")] + ["--max-batch-limit", "1", "--available-gib", "4"]
    assert scale_campaign.main(argv) == 0
    doc = json.loads((tmp_path / "campaign.json").read_text())
    assert [(r["label"], r["batch"]) for r in doc["rows"]] == [("1", 1)] * 2 + [("max", 1)] * 2
    assert len(calls) == 2 and doc["shard"]["groups"] == [[geometry, 256, 1]]
    for a, b in zip(doc["rows"][:2], doc["rows"][2:], strict=True):
        assert {**a, "label": "max"} == b


def test_shards_resume_from_their_joined_caches_and_split_what_is_left(
    geometry, shards, tmp_path, monkeypatch, capsys
):
    """A first call stops shard 0 after one group and shard 1 at once; the joined caches give
    each shard of the next call every finished cell (none decoded again), the split balances
    the rest, and the next call's shards merge into the whole campaign."""
    folder, docs = shards
    first = docs["part0"]
    _sharded(geometry, tmp_path, "c1", "--shard", "1/2", "--stop-after", "0")
    caches = f"{folder / 'part0.jsonl'},{tmp_path / 'c1.jsonl'}"
    joined = tmp_path / "all.jsonl"
    assert scale_campaign.main(["--join", caches, "--out", str(joined)]) == 0
    keys = {(r["batch"], r["baseline"]) for r in first["rows"]}
    assert first["complete"] and f"{len(keys)} cells from 2" in capsys.readouterr().out
    plan_argv = _argv(geometry, tmp_path, name="plan")
    for opt in ("--baselines", "--batches", "--acceptances", "--resume", "--out"):
        del plan_argv[plan_argv.index(opt) : plan_argv.index(opt) + 2]
    plan_argv += [*SHARDED, "--max-batch-limit", "3", "--available-gib", "4"]
    assert scale_campaign.main([*plan_argv, "--plan", "2", "--resume", str(joined)]) == 0
    assert f"{len(keys)} decodes done" in capsys.readouterr().out
    measured = []
    real = scale_measure.measure_cell
    monkeypatch.setattr(
        scale_measure,
        "measure_cell",
        lambda st, r, cell, *a: measured.append(cell.key) or real(st, r, cell, *a),
    )
    for k in (0, 1):
        (tmp_path / f"d{k}.jsonl").write_text(joined.read_text())
        _sharded(geometry, tmp_path, f"d{k}", "--shard", f"{k}/2")
    assert measured and not {k for k in measured if (int(k.split("|")[2]), k.split("|")[3]) in keys}
    out = tmp_path / "merged.json"
    files = ",".join(str(tmp_path / f"d{k}.json") for k in (0, 1))
    assert scale_campaign.main(["--merge", files, "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["complete"] and len(merged["rows"]) == len(merged["cells"])
    by_slot = {(r["label"], r["baseline"]): r for r in merged["rows"]}
    for r in first["rows"]:
        assert _decoded(by_slot[(r["label"], r["baseline"])]) == _decoded(r)


def test_merge_joins_successive_calls_of_one_shard(shards, tmp_path, capsys):
    """Each call of a resumed shard writes the cells it decoded: the calls' documents merge into
    the shard's whole; a cell whose rows differ between two documents is refused."""
    whole = shards[1]["whole"]
    half = len(whole["rows"]) // 2
    for name, rows in (("first", whole["rows"][:half]), ("second", whole["rows"][half:])):
        (tmp_path / f"{name}.json").write_text(json.dumps(dict(whole, rows=rows)))
    out = tmp_path / "m.json"
    files = f"{tmp_path / 'second.json'},{tmp_path / 'first.json'}"
    assert scale_campaign.main(["--merge", files, "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["complete"] and merged["rows"] == whole["rows"]
    other = dict(whole["rows"][0], wall_s=-1.0)
    (tmp_path / "other.json").write_text(json.dumps(dict(whole, rows=[other])))
    files = f"{tmp_path / 'first.json'},{tmp_path / 'other.json'}"
    capsys.readouterr()
    assert scale_campaign.main(["--merge", files, "--out", str(tmp_path / "x.json")]) == 2
    assert "has other rows in" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
