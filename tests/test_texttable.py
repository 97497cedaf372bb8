"""The one table renderer (clusterproof.core.texttable): columns as wide as their widest cell, numbers
right-aligned where asked, no trailing spaces, and markdown cells that cannot break their row."""
from __future__ import annotations

import pytest

from clusterproof.core.texttable import markdown_table, text_table

pytestmark = pytest.mark.unit


def test_a_column_is_as_wide_as_its_widest_cell_and_numbers_align_right():
    got = text_table(["suite", "tests", "time"], [["gang_scheduling", 12, "7.0 s"], ["burst", 3, "1:05.0"]], "<>>")
    assert got.splitlines() == ["suite            tests    time",
                                "gang_scheduling     12   7.0 s",
                                "burst                3  1:05.0"]


def test_no_line_ends_in_spaces_and_missing_or_none_cells_are_empty():
    got = text_table(["a", "b", "c"], [["x", None], ["longer", "y", "z"]])
    assert got.splitlines() == ["a       b  c", "x", "longer  y  z"]
    assert not [line for line in got.splitlines() if line != line.rstrip()]


def test_without_a_header_the_rows_still_line_up_after_the_indent():
    got = text_table((), [["startup p99", "4", "s"], ["creates", "n/a", "pods"]], "<>", gap=1, indent="  ")
    assert got.splitlines() == ["  startup p99   4 s", "  creates     n/a pods"]
    assert text_table((), []) == ""


def test_a_header_row_alone_is_a_table():
    assert text_table(["pool", "ready"], [], "<>") == "pool  ready"


def test_markdown_escapes_pipes_and_marks_right_aligned_columns():
    got = markdown_table(["figure", "value"], [["a | b", 1.5], ["c", ""]], "<>")
    assert got.splitlines() == ["| figure | value |", "|---|---:|", "| a \\| b | 1.5 |", "| c |  |"]


def test_a_short_row_is_padded_to_the_header():
    assert markdown_table(["x", "y", "z"], [["only"]]).splitlines()[-1] == "| only |  |  |"


@pytest.mark.parametrize("align", ["<>^", "x", "<<<<"])
def test_an_alignment_that_is_not_one_of_left_or_right_per_column_is_refused(align):
    with pytest.raises(ValueError, match="align"):
        text_table(["a", "b", "c"], [], align)


def test_a_markdown_table_needs_a_header():
    with pytest.raises(ValueError, match="header"):
        markdown_table((), [["a"]])
