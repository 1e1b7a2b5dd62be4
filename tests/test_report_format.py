"""backend/report_format.py: the reports' tables, numbers and .json + .md pair (CPU, standard library)."""

import json

import pytest

from fusedresnet.backend.report_format import number, row, table, write_json_and_markdown


def test_a_table_aligns_each_column_as_asked_and_the_rest_left():
    assert table(["model", "img/s", "p99 ms", "note"], [["custom", "1,200", 2.5, ""]], "lrr") == [
        "| model | img/s | p99 ms | note |", "|---|---:|---:|---|", "| custom | 1,200 | 2.5 |  |"]


def test_an_empty_header_cell_is_a_column_of_marks():
    assert table(["target", "limit", ""], [["p50", "<= 1 ms", "met"]])[:2] == ["| target | limit | |", "|---|---|---|"]


def test_a_table_refuses_an_alignment_it_cannot_write():
    with pytest.raises(ValueError):
        table(["a"], [], "c")
    with pytest.raises(ValueError):
        table(["a"], [], "lr")


def test_a_row_is_its_cells_between_pipes():
    assert row([1, None, "x"]) == "| 1 | None | x |"


@pytest.mark.parametrize("args, kwargs, text", [
    ((12345.678,), {}, "12,345.7"), ((12345.678, 2), {}, "12,345.68"), ((40000.4, 0), {"grouping": False}, "40000"),
    ((0.257, 0), {"percent": True}, "26%"), ((None,), {}, "n/a"), ((None, 2), {"none": "-"}, "-")])
def test_number_covers_digits_separators_percentages_and_what_was_not_measured(args, kwargs, text):
    assert number(*args, **kwargs) == text


def test_a_report_is_json_with_its_markdown_beside_it(tmp_path):
    paths = write_json_and_markdown(tmp_path / "run.json", {"a": 1}, "# run\n", indent=2)
    assert paths == (tmp_path / "run.json", tmp_path / "run.md")
    assert json.loads(paths[0].read_text()) == {"a": 1} and paths[0].read_text().endswith("\n")
    assert paths[1].read_text() == "# run\n"
