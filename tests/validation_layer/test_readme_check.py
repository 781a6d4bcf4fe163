"""``python -m ssvkit.validation.readme --check``: a generated block whose content differs from
what the data of record renders is named, and nothing is written; without ``--check`` the
blocks are rewritten in place. CI runs the check on every document (``.ci/run``)."""

from __future__ import annotations

from ssvkit.validation.readme import main, render, stale_blocks

BLOCK = "<!-- nsa-stages:begin -->\n{}<!-- nsa-stages:end -->\n"


def _doc(tmp_path, body: str):
    path = tmp_path / "page.md"
    path.write_text("# A page\n\n" + BLOCK.format(body) + "\nprose after\n")
    return path


def test_a_fresh_block_passes_and_a_stale_one_is_named(tmp_path, capsys):
    doc = _doc(tmp_path, "an old table\n")
    assert stale_blocks(doc.read_text()) == ["nsa-stages"]
    assert main(["--check"], documents=(doc,)) == 1
    err = capsys.readouterr().err
    assert "page.md: block 'nsa-stages' is stale" in err
    assert "an old table" in doc.read_text()  # the check writes nothing
    assert main([], documents=(doc,)) == 0
    text = doc.read_text()
    assert "an old table" not in text and text.endswith("\nprose after\n")
    assert render(text) == text and stale_blocks(text) == []
    assert main(["--check"], documents=(doc,)) == 0


def test_text_without_markers_has_no_stale_block():
    assert stale_blocks("# nothing generated here\n") == []
