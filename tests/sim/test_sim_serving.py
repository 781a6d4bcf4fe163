import csv
import io

import pytest
from simrun import run, value
from ssvkit.sim.config import ServeConfig
from ssvkit.sim.writers import requests_csv

SLO = ServeConfig(rate=6.0, max_batch=16, slo_ttft_s=0.5, slo_tpot_s=0.004)


def _serve(**kw):
    return run(
        "serve",
        context_len=4096,
        num_tokens=200,
        num_requests=120,
        length_spread=0.6,
        serve=SLO,
        **kw,
    )


def test_request_invariants():
    r = _serve()
    for q in r.requests:
        assert q.arrival_s <= q.admitted_s < q.first_token_s <= q.finish_s
        assert 0 < q.ttft_s <= q.e2e_s
        assert q.output_tokens == q.target_tokens
    assert value(r, "tokens") == sum(q.output_tokens for q in r.requests)


def test_goodput_counts_requests_meeting_both_slos():
    r = _serve()
    rows = list(csv.DictReader(io.StringIO(requests_csv(r))))
    met = [
        float(x["ttft_s"]) <= SLO.slo_ttft_s and float(x["tpot_s"]) <= SLO.slo_tpot_s for x in rows
    ]
    assert value(r, "slo_met") == sum(met) == sum(x["slo_met"] == "True" for x in rows)
    assert 0 < sum(met) < len(rows)  # the SLOs bite: the count is not trivially all or none
    span = max(float(x["finish_s"]) for x in rows) - min(float(x["arrival_s"]) for x in rows)
    assert value(r, "goodput_requests_per_s") == pytest.approx(sum(met) / span)


def test_kv_capacity_is_never_exceeded():
    cap = 30000
    r = _serve(kv_capacity_tokens=cap)
    assert value(r, "max_kv_tokens") <= value(r, "max_reserved_kv_tokens") <= cap
    roomy = _serve()
    # the small cache queues requests: later admissions and longer waits than with a roomy one
    wait = lambda res: sum(q.admitted_s - q.arrival_s for q in res.requests)
    assert wait(r) > 2 * wait(roomy)


def test_heavier_load_worsens_latency():
    kw = dict(context_len=4096, num_tokens=200, num_requests=400, length_spread=0.6)
    light = run("serve", serve=SLO, **kw)
    heavy = run("serve", serve=ServeConfig(rate=60.0, max_batch=16), **kw)
    assert value(heavy, "ttft_p50_s") > value(light, "ttft_p50_s")
    assert value(heavy, "simulated_tokens_per_s") > value(light, "simulated_tokens_per_s")
    # arrival-bound (light) and GPU-bound (heavy) runs both sit just under perfmodel's capacity
    # bound: less the drain after the last arrival, and (GPU-bound) less the rounds run at a
    # smaller batch than the bound's, which the calibrated profile's per-call costs make dearer
    for r in (light, heavy):
        sim, bound = value(r, "simulated_tokens_per_s"), value(r, "analytic_tokens_per_s")
        assert 0.9 * bound <= sim <= 1.01 * bound


def test_arrivals_file(tmp_path):
    p = tmp_path / "arrivals.csv"
    p.write_text("arrival_s,prompt_len,output_len\n0.5,2048,10\n0.0,4096,20\n0.5,1024,5\n")
    r = run(
        "serve",
        serve=ServeConfig(arrival="trace", arrivals_file=str(p)),
        context_len=1024,
    )
    got = [(q.arrival_s, q.prompt_len, q.target_tokens) for q in r.requests]
    assert got == [(0.0, 4096, 20), (0.5, 2048, 10), (0.5, 1024, 5)]


def test_impossible_capacity_is_an_input_error():
    with pytest.raises(ValueError, match="impossible capacity: request 0 needs"):
        _serve(kv_capacity_tokens=1000)
