from types import SimpleNamespace

import pytest
from simrun import run
from ssvkit.sim.config import ServeConfig
from ssvkit.sim.recorder import Span
from ssvkit.sim.writers import event_kind, gantt_figure, gantt_png, gantt_window


def _fake(rounds_t_s, spans, lanes):
    rec = SimpleNamespace(t_s=list(rounds_t_s), spans=spans, num_rounds=len(rounds_t_s))
    return SimpleNamespace(recorder=rec, lanes=tuple(lanes))


@pytest.mark.parametrize(
    "name,kind",
    [
        ("repair 3 L7", "repair"),
        ("spec attn L12", "spec attn"),
        ("step 4: 8 draft + 2 verify", "step draft + verify"),
        ("decode round b=16", "decode round"),
        ("offload r3", "offload"),
        ("fallback (primary)", "fallback (primary)"),
    ],
)
def test_event_kind_drops_the_numbering(name, kind):
    assert event_kind(name) == kind


def test_window_hand_computed():
    # rounds start at 0, 1, 2, 3 s; lane a has two spans a round, lane b one. The window
    # ends where its last span ends, or at the next round's start.
    spans = [Span("a", f"x {i}", t + d, 0.2) for t in range(4) for i, d in enumerate((0, 0.5))]
    spans += [Span("b", "y", t + 0.3, 0.1) for t in range(4)]
    spans.append(Span("request 0", "decode", 0.0, 10.0))  # a life, not a round
    win = gantt_window(_fake([0.0, 1.0, 2.0, 3.0], spans, ("a", "b")), max_bars_per_lane=5)
    assert (win.start_s, win.end_s, win.num_rounds, win.capped) == (0.0, 1.7, 2, True)
    assert sorted((s.lane, s.start_s) for s in win.spans if s.lane == "a") == [
        ("a", 0.0),
        ("a", 0.5),
        ("a", 1.0),
        ("a", 1.5),
    ]
    assert any(s.lane == "request 0" for s in win.spans)
    whole = gantt_window(_fake([0.0, 1.0, 2.0, 3.0], spans, ("a", "b")), max_bars_per_lane=8)
    assert (whole.end_s, whole.num_rounds, whole.capped) == (3.7, 4, False)
    one = gantt_window(_fake([0.0, 1.0, 2.0, 3.0], spans, ("a", "b")), max_bars_per_lane=1)
    assert (one.end_s, one.num_rounds, one.capped) == (0.7, 1, True)


def _collections(result):
    fig = gantt_figure(result)
    return fig.axes[0], len(fig.axes[0].collections)


def test_long_prr_run_draws_its_window_with_a_bounded_number_of_artists():
    # At 32K the compressed branch costs the selector lane time on every shipped profile
    # (at 8K the H100's prices it at nothing, and a lane of no time draws no bar).
    short = run("prr", num_tokens=64, timeline_rounds=2, context_len=32768)
    long = run("prr", num_tokens=256, timeline_rounds=200, context_len=32768)
    assert len(long.recorder.spans) > 20 * len(short.recorder.spans)
    win = gantt_window(long)
    assert win.capped and 1 <= win.num_rounds < long.recorder.num_rounds
    assert all(s.start_s < win.end_s for s in win.spans)
    per_lane = {lane: sum(s.lane == lane for s in win.spans) for lane in long.lanes}
    assert max(per_lane.values()) <= 150
    ax, n_long = _collections(long)
    _, n_short = _collections(short)
    assert n_long == n_short == len({(s.lane, event_kind(s.name)) for s in win.spans})
    title = ax.get_title()
    assert f"first {win.num_rounds} of {long.recorder.num_rounds} rounds" in title
    assert "at most 150 events per lane" in title
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "select",
        "spec attn",
        "repair",
        "layer",
        "lm head",
        "accept",
    ]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "selector",
        "speculator",
        "repairer",
        "verifier",
        "acceptor",
    ]


def test_serving_request_lanes_do_not_stretch_the_window():
    r = run(
        "serve", num_requests=40, serve=ServeConfig(rate=50.0), num_tokens=64, timeline_rounds=6
    )
    win = gantt_window(r)
    gpu_end = max(s.start_s + s.dur_s for s in r.recorder.spans if s.lane == "gpu")
    life_end = max(s.start_s + s.dur_s for s in r.recorder.spans)
    assert win.end_s <= gpu_end < life_end
    ax, _ = _collections(r)
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert lanes[0] == "gpu" and len(lanes) <= 20


def test_gantt_png_is_deterministic():
    a, b = run("ssd", num_tokens=64), run("ssd", num_tokens=64)
    png = gantt_png(a)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png == gantt_png(b)
