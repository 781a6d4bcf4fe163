import pytest
from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

from ssvkit.cli.decode_report import predict


def test_an_autoregressive_run_is_predicted_whatever_its_drafter():
    """``ssvkit decode`` of an autoregressive baseline keeps the engine's drafter (here a draft
    checkpoint the registry does not know) on its strategy; nothing drafts, so it is not priced."""
    for name in ("ar_dense", "ar_sparse"):
        s = Strategy.from_name(name, drafter=DrafterSpec(kind="draft_model", model="tiny-draft"))
        kw = {"elementwise": "fused"}
        p = predict(s, "llama-3.1-8b", None, 32768, 4, 0.7, None, "h100-sxm", loop="serial", **kw)
        assert "error" not in p, p
        assert p["draft_s"] == 0 and p["tokens_per_round"] == 1 and p["tokens_per_s"] > 0
        # Pipelined, the loop's host time hides behind the round's GPU work (milliseconds here).
        q = predict(
            s, "llama-3.1-8b", None, 32768, 4, 0.7, None, "h100-sxm", loop="pipelined", **kw
        )
        assert p["loop_s"] > 0 and q["loop_s"] == 0 and q["loop"] == "pipelined"
        assert q["round_s"] == pytest.approx(p["round_s"] - p["loop_s"], rel=1e-12)


def test_a_speculative_run_prices_its_draft_model():
    s = Strategy.from_name("sd_dense", drafter=DrafterSpec(kind="draft_model", model="x"))
    kw = {"elementwise": "fused", "loop": "pipelined"}
    p = predict(s, "llama-3.1-8b", "llama-3.1-8b", 32768, 4, 0.7, None, "h100-sxm", **kw)
    assert "error" not in p and p["draft_s"] > 0 and p["tokens_per_round"] > 1
    # The draft model drafts from the host's copy of the tokens: its rounds stay serial.
    assert p["loop_s"] > 0
