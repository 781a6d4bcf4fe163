import json

import pytest
from ssvkit.perfmodel.strategy import BASELINES
from ssvkit.sweep.grid import load_grid, spec_from_doc
from ssvkit.sweep.spec import SweepSpec


def test_defaults_are_the_baselines_on_predicts_contexts():
    spec = SweepSpec()
    assert [s.label for s in spec.strategies] == list(BASELINES)
    assert spec.context_len == (8192, 16384, 32768, 65536, 131072)
    assert spec.num_points == 25


def test_doc_parsing_suffixes_scalars_and_aliases():
    spec = spec_from_doc(
        {"model": "qwen3-8b", "context": ["8K", "1M", 3000], "batch": 4, "acceptance": "0.6,0.8"}
    )
    assert spec.models == ("qwen3-8b",)
    assert spec.context_len == (8192, 1024 * 1024, 3000)
    assert spec.batch == (4,)
    assert spec.acceptance == (0.6, 0.8)
    assert spec.num_points == 5 * 3 * 2


def test_vary_applies_by_strategy_kind():
    spec = spec_from_doc({"vary": {"top_n": [16, 32], "group_size": [2, 4], "tree": ["chain:3"]}})
    labels = [s.label for s in spec.strategies]
    by_base = {b: [s for s in spec.strategies if s.base == b] for b in BASELINES}
    # ar_dense: nothing applies; ar_sparse: top_n; sd_dense: tree; sd_sparse_naive: tree x top_n
    # (per_query, not grouped); ssv: tree x top_n x group_size.
    assert [len(by_base[b]) for b in BASELINES] == [1, 2, 1, 2, 4]
    assert "ssv[top_n=32,group_size=4,tree=chain:3]" in labels
    s = next(s for s in spec.strategies if s.label == "ssv[top_n=32,group_size=4,tree=chain:3]")
    assert (s.strategy.top_n, s.strategy.group_size, s.strategy.tree) == (32, 4, "chain:3")
    assert s.strategy.refresh_every == BASELINES["ssv"].refresh_every
    plain = by_base["sd_sparse_naive"][0].strategy
    assert plain.group_size == 1 and plain.mode == "per_query"


def test_custom_strategy_with_drafter_and_round_trip():
    doc = {
        "models": ["llama-3.1-70b"],
        "strategies": [
            "ar_dense",
            {"name": "ssv-c8", "base": "ssv", "group_size": 8, "top_n": "32"},
            {"base": "sd_dense", "drafter": {"kind": "draft_model", "model": "llama-3.1-8b"}},
        ],
        "capacity": {"rates": [5, 20], "slo_tpot_s": 0.03},
        "simulate": True,
    }
    spec = spec_from_doc(doc)
    c8 = spec.strategies[1]
    assert (c8.label, c8.base, c8.strategy.group_size, c8.strategy.top_n) == (
        "ssv-c8",
        "ssv",
        8,
        32,
    )
    drafted = spec.strategies[2].strategy
    assert drafted.drafter.kind == "draft_model" and drafted.drafter.model == "llama-3.1-8b"
    assert spec.capacity.rates == (5.0, 20.0) and spec.capacity.slo_tpot_s == 0.03
    assert spec.simulate is not None
    again = spec_from_doc(json.loads(json.dumps(spec.to_doc())))
    assert again == spec


@pytest.mark.parametrize(
    "doc,needle",
    [
        ({"contexts": [8192]}, "unknown key 'contexts' (did you mean: context"),
        ({"context_len": ["8K", "abc"]}, "context_len[1] 'abc' is not an integer"),
        ({"context_len": [0]}, "context_len must hold integers >= 1, got 0"),
        ({"context_len": ["8K", 8192]}, "context_len lists 8192 twice"),
        ({"acceptance": [0.5, 1.5]}, "acceptance must lie in [0, 1], got 1.5"),
        ({"batch": []}, "batch needs at least one value"),
        ({"models": ["llama-9"]}, "unknown model 'llama-9'"),
        ({"gpus": ["h1000"]}, "unknown GPU 'h1000'"),
        ({"strategies": ["ssv", "nope"]}, "strategies[1]: unknown strategy 'nope'"),
        ({"strategies": [{"name": "x"}]}, "strategies[0]: a custom strategy needs base"),
        ({"strategies": [{"base": "ssv", "grp": 2}]}, "unknown strategy field 'grp'"),
        ({"strategies": [{"base": "ssv", "tree": "best:x"}]}, "strategies[0]: tree 'best:x'"),
        ({"strategies": ["ssv", "ssv"]}, "strategies lists 'ssv' twice"),
        ({"vary": {"name": ["a"]}}, "vary: unknown or fixed field 'name'"),
        ({"vary": {"group_size": [0]}}, "vary on ssv: group_size must be an integer >= 1"),
        ({"capacity": {"attainment": 0}}, "capacity: capacity.attainment must lie in (0, 1]"),
        ({"capacity": {"strategies": ["ssv2"]}}, "capacity strategy 'ssv2' is not in the sweep"),
        ({"capacity": {"rate": [1]}}, "capacity: unknown field 'rate' (did you mean: rates"),
        ({"simulate": {"max_points": 3}}, "simulating 25 points exceeds simulate.max_points=3"),
        ({"roofline": "yes"}, "roofline must be true or false"),
        (
            {
                "strategies": [
                    {"base": "sd_dense", "drafter": {"kind": "draft_model", "model": "x"}}
                ]
            },
            "unknown model 'x'",
        ),
    ],
)
def test_bad_grids_name_the_key_and_value(doc, needle):
    with pytest.raises(ValueError) as e:
        spec_from_doc(doc, "grid.json")
    msg = str(e.value)
    assert msg.startswith("grid.json: ") and needle in msg, msg
    assert "\n" not in msg


def test_grid_files(tmp_path):
    good = tmp_path / "g.yaml"
    good.write_text("models: [qwen3-8b]\ncontext: [4K, 16K]\nvary:\n  group_size: [2, 8]\n")
    spec = spec_from_doc(load_grid(good))
    assert spec.context_len == (4096, 16384) and len(spec.strategies) == 6
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [a\ncontext: 1\n")
    with pytest.raises(ValueError, match=r"bad.yaml: not valid YAML at line \d"):
        load_grid(bad)
    js = tmp_path / "bad.json"
    js.write_text('{"models": ["a",]}')
    with pytest.raises(ValueError, match="bad.json' is not valid JSON"):
        load_grid(js)
    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must be a mapping"):
        load_grid(lst)
    with pytest.raises(ValueError, match="must end in .yaml, .yml or .json"):
        (tmp_path / "g.txt").write_text("{}")
        load_grid(tmp_path / "g.txt")
    with pytest.raises(ValueError, match="does not exist"):
        load_grid(tmp_path / "missing.yaml")
