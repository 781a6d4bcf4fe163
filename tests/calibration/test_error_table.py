from ssvkit.calibration.error_table import ape_markdown_row, ape_percents, ape_text_lines

STATS = {"n": 24, "median_ape": 0.05, "p90_ape": 0.1134, "max_ape": 1.5}


def test_percents_and_no_rows():
    assert ape_percents(STATS) == ("5.0%", "11.3%", "150.0%")
    assert ape_percents({"n": 0, "median_ape": 0.1}) == ("-", "-", "-")
    assert ape_percents({}) == ("-", "-", "-")


def test_text_lines_align_the_header_over_the_cells():
    rows = [("verify step", STATS), ("empty", {"n": 0})]
    head, full, empty = ape_text_lines(
        "figure", rows, name_width=12, n_width=4, percent_widths=(8, 7, 7)
    )
    assert head == "figure          n   median     p90     max"
    assert full == "verify step    24     5.0%   11.3%  150.0%"
    assert empty == "empty           -        -       -       -"
    assert len(head) == len(full) == len(empty)


def test_markdown_row_with_an_extra_cell():
    assert ape_markdown_row("fit", STATS) == "| fit | 24 | 5.0% | 11.3% | 150.0% |"
    assert ape_markdown_row("heldout", {}, "2.0%") == "| heldout | 0 | - | - | - | 2.0% |"
