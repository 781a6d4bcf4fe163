import pytest
from simrun import run
from ssvkit.sim.config import ServeConfig
from ssvkit.sim.writers import chrome_trace, requests_csv, trace_jsonl

CASES = [
    ("ssv", dict(num_tokens=400, overlap_spread=0.1, per_layer=True)),
    ("prr", dict(num_tokens=100)),
    ("ssd", dict(num_tokens=300, batch=3)),
    ("sparsespec", dict(num_tokens=200, num_requests=12, batch=8, kv_capacity_tokens=30000)),
    ("serve", dict(num_tokens=100, num_requests=40, length_spread=0.5, serve=ServeConfig(rate=8))),
]


def _bytes(result):
    return requests_csv(result), trace_jsonl(result), chrome_trace(result)


@pytest.mark.parametrize("scenario,kw", CASES, ids=[c[0] for c in CASES])
def test_same_seed_same_bytes(scenario, kw):
    a = _bytes(run(scenario, seed=11, **kw))
    b = _bytes(run(scenario, seed=11, **kw))
    assert a == b
    c = _bytes(run(scenario, seed=12, **kw))
    assert c[1] != a[1]  # the seed matters: the trace differs
