"""Tables as text: the one renderer behind every table the harness prints or writes.

Why one: a terminal summary, an attachment, a CI step summary and the docs'
benchmark tables are all a header and rows; written by hand each time, each
got its own fixed widths (a long suite name pushed its row out of line) and
its own idea of escaping. Here a column is as wide as its widest cell, a
number column is right-aligned when asked, no line ends in spaces, and a
markdown cell never breaks its row with a ``|``.

- ``text_table``: fixed-width columns for a terminal or a text attachment.
- ``markdown_table``: GitHub-flavoured markdown (docs, CI step summaries).

``align`` says each column's alignment, one character per column: ``<``
left, ``>`` right; columns it does not reach are left-aligned. Pure: no
cluster, no I/O.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

LEFT, RIGHT = "<", ">"


def _aligns(align: str, columns: int) -> str:
    if set(align) - {LEFT, RIGHT}:
        raise ValueError(f"align {align!r}: one of {LEFT!r} (left) or {RIGHT!r} (right) per column")
    if len(align) > columns:
        raise ValueError(f"align {align!r} names {len(align)} columns, the table has {columns}")
    return align.ljust(columns, LEFT)


def _cells(header: Sequence[object], rows: Iterable[Sequence[object]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows as strings (None is an empty cell), every row as long as the longest."""
    head = ["" if c is None else str(c) for c in header]
    body = [["" if c is None else str(c) for c in row] for row in rows]
    columns = max([len(head), *(len(r) for r in body)])
    if head:
        head += [""] * (columns - len(head))
    return head, [r + [""] * (columns - len(r)) for r in body]


def text_table(header: Sequence[object], rows: Iterable[Sequence[object]], align: str = "", gap: int = 2,
               indent: str = "") -> str:
    """Fixed-width columns, ``gap`` spaces apart, each line after ``indent``. An empty ``header`` draws
    no header line (a list whose columns line up)."""
    head, body = _cells(header, rows)
    lines = [head, *body] if head else body
    if not lines:
        return ""
    aligns = _aligns(align, len(lines[0]))
    widths = [max(len(r[i]) for r in lines) for i in range(len(aligns))]
    out = []
    for r in lines:
        cells = [c.rjust(w) if a == RIGHT else c.ljust(w) for c, w, a in zip(r, widths, aligns)]
        out.append((indent + (" " * gap).join(cells)).rstrip())
    return "\n".join(out)


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A GitHub-flavoured markdown table; a ``|`` inside a cell is escaped, a right-aligned column is
    marked ``---:``."""
    head, body = _cells(header, rows)
    if not head:
        raise ValueError("a markdown table needs a header")
    aligns = _aligns(align, len(head))

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    rule = "|" + "".join("---:|" if a == RIGHT else "---|" for a in aligns)
    return "\n".join([line(head), rule, *(line(r) for r in body)])
