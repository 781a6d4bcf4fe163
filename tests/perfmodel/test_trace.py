import json

import pytest
from ssvkit.perfmodel.trace import dumps_trace, loads_trace, make_header, make_round

HEAD = make_header("engine", "llama-3.1-8b", 2, {"ssv": {"tree": "chain:4"}}, gpu="h100-sxm")


def _round(**kw):
    base = dict(
        round_index=0,
        request=0,
        strategy="ssv",
        context_len=100,
        drafted=4,
        accepted=2,
        step_s={"draft": 0.001, "verify": 0.004},
        t_s=0.0,
        group_overlap=[0.5, 0.75],
        layer_overlap=[0.0, 0.9],
    )
    base.update(kw)
    return make_round(**base)


def test_round_trip_is_byte_identical():
    text = dumps_trace(HEAD, [_round(), _round(round_index=1, accepted=4, predict_hit=[1, 0.5])])
    t = loads_trace(text)
    assert t.header["gpu"] == "h100-sxm"
    assert t.column("accepted").tolist() == [2, 4]
    assert t.layer_column("group_overlap").tolist() == [[0.5, 0.75], [0.5, 0.75]]
    assert t.layer_column("predict_hit")[0].tolist() != t.layer_column("predict_hit")[1].tolist()
    assert dumps_trace(t.header, t.rounds) == text


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda r: r.update(accepted=5), "accepted=5 exceeds drafted=4"),
        (lambda r: r.update(strategy="x"), "not in the header's strategies"),
        (lambda r: r.update(group_overlap=[0.5]), "num_layers=2"),
        (lambda r: r.update(layer_overlap=[0.5, 1.5]), "must lie in [0, 1]"),
        (lambda r: r["step_s"].update(verify=-1.0), "step_s['verify']"),
        (lambda r: r.pop("context_len"), "lacks 'context_len'"),
        (lambda r: r.update(extra=1), "unknown round keys"),
        (lambda r: r.update(drafted=1.5), "drafted must be an integer"),
    ],
)
def test_validation_names_line_and_problem(mutate, needle):
    r = _round()
    mutate(r)
    text = json.dumps(HEAD) + "\n" + json.dumps(_round()) + "\n" + json.dumps(r) + "\n"
    with pytest.raises(ValueError) as e:
        loads_trace(text, "t.jsonl")
    assert "t.jsonl:3" in str(e.value) and needle in str(e.value)


def test_header_checks():
    bad = dict(HEAD, version=2)
    with pytest.raises(ValueError, match="version 2 is not supported"):
        loads_trace(json.dumps(bad))
    with pytest.raises(ValueError, match="format"):
        loads_trace(json.dumps(dict(HEAD, format="other")))
    with pytest.raises(ValueError, match="'trace:1' is not valid JSON"):
        loads_trace("{nope")
    with pytest.raises(ValueError, match="empty trace"):
        loads_trace("")
    with pytest.raises(ValueError, match="exceeds"):
        dumps_trace(HEAD, [_round(accepted=9)])  # an invalid trace is never written
