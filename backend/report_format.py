"""The reports' formats (issue 47): a markdown table, a number in a table cell, a report written as .json and .md.

Standard library only: the client (a client-only install), the load tests, the harness and the campaigns all write
their reports through it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

NONE = "n/a"   # what number() writes for a value that was not measured


def number(value, digits: int = 1, *, grouping: bool = True, percent: bool = False, none: str = NONE) -> str:
    """`value` with `digits` after the point, thousands separated by commas unless not `grouping`, as a percentage
    (0.5 -> 50%) with `percent`; `none` where value is None.

    >>> number(12345.678), number(0.25, 0, percent=True), number(40000, 0, grouping=False), number(None, none="-")
    ('12,345.7', '25%', '40000', '-')
    """
    if value is None:
        return none
    return format(value, f"{',' if grouping else ''}.{digits}{'%' if percent else 'f'}")


def row(cells: Iterable) -> str:
    """One line of a markdown table: each cell str()'d, between pipes."""
    return "| " + " | ".join(map(str, cells)) + " |"


def table(header: Sequence[str], rows: Iterable[Iterable] = (), align: str = "") -> list[str]:
    """A markdown table's lines: the header, its separator, one line per row (each cell str()'d).

    `align`: a letter per column, "l" left (`---`) or "r" right (`---:`, for numbers); columns past its end are
    left-aligned. An empty header cell is written `| |` (a column of marks under no title).

    >>> table(["model", "img/s", ""], [["custom", 1200, "met"]], "lr")
    ['| model | img/s | |', '|---|---:|---|', '| custom | 1200 | met |']
    """
    if set(align) - {"l", "r"} or len(align) > len(header):
        raise ValueError(f"align {align!r}: one of l or r per column, {len(header)} at the most")
    return ["|" + "|".join(f" {title} " if title else " " for title in header) + "|",
            "|" + "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(header), "l")),
            *(row(cells) for cells in rows)]


def write_json_and_markdown(path: Path, results, markdown: str, indent: int = 1,
                            default: Callable | None = None) -> tuple[Path, Path]:
    """`results` as JSON at `path` with the suffix .json, `markdown` beside it with the suffix .md; both paths."""
    path = Path(path)
    json_path, markdown_path = path.with_suffix(".json"), path.with_suffix(".md")
    json_path.write_text(json.dumps(results, indent=indent, default=default) + "\n")
    markdown_path.write_text(markdown)
    return json_path, markdown_path
