from ssvkit.perfmodel.strategy import DrafterSpec, Strategy

from ssvkit.cli.decode_report import predict


def test_an_autoregressive_run_is_predicted_whatever_its_drafter():
    """``ssvkit decode`` of an autoregressive baseline keeps the engine's drafter (here a draft
    checkpoint the registry does not know) on its strategy; nothing drafts, so it is not priced."""
    for name in ("ar_dense", "ar_sparse"):
        s = Strategy.from_name(name, drafter=DrafterSpec(kind="draft_model", model="tiny-draft"))
        p = predict(s, "llama-3.1-8b", None, 32768, 4, 0.7, None, "h100-sxm", elementwise="fused")
        assert "error" not in p, p
        assert p["draft_s"] == 0 and p["tokens_per_round"] == 1 and p["tokens_per_s"] > 0


def test_a_speculative_run_prices_its_draft_model():
    s = Strategy.from_name("sd_dense", drafter=DrafterSpec(kind="draft_model", model="x"))
    p = predict(
        s, "llama-3.1-8b", "llama-3.1-8b", 32768, 4, 0.7, None, "h100-sxm", elementwise="fused"
    )
    assert "error" not in p and p["draft_s"] > 0 and p["tokens_per_round"] > 1
