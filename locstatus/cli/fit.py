"""Tables that fit the terminal: a narrow one (``COLUMNS=80``) never cuts the columns that
identify a row (a location, a service, a state); the others fold onto more lines or are left
out, named in the table's caption (docs/cli.md, "Reading state").

Rich shrinks and ellipsizes any column when a table is too wide, names included; so the columns
are chosen here, before rich lays them out: the kept ones at their full width, then the others
in priority order while their least width still fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class Col:
    """A column of a table that fits the terminal (:func:`fitted`): ``keep`` columns are never
    cut or wrapped; the others, in the order given, are shown when at least ``least``
    characters are left for them (folded onto more lines when narrower than their text),
    ``wrap=False`` ones only at full width, and left out otherwise."""

    header: str
    keep: bool = False
    least: int = 10
    wrap: bool = True


_FRAME = 3
"""Characters a column costs besides its text in rich's default box: padding and a rule."""

_READABLE = 32
"""Width (characters) a folding column keeps before a fixed column of lower priority is shown."""


def fitted(
    title: Text | str,
    cols: Sequence[Col],
    rows: Sequence[Sequence[Any]],
    width: int | None,
    priority: Sequence[int] | None = None,
) -> Table:
    """A table of ``rows`` (one cell per column of ``cols``) that fits ``width`` characters
    (None: any width): the ``keep`` columns (a location, a service, a state) whole, the others
    added in order (``priority``: column indexes, default left to right) while they fit,
    folded or left out (named in the caption) otherwise, so a
    narrow terminal (``COLUMNS=80``) never cuts a name: docs/cli.md, "Reading state"."""

    def need(i: int) -> int:
        cells = [_cell_len(row[i]) for row in rows]
        return max([len(cols[i].header), *cells])

    shown = [i for i, c in enumerate(cols) if c.keep]
    used = 1 + sum(need(i) + _FRAME for i in shown)
    left_out: list[str] = []
    for i in priority if priority is not None else range(len(cols)):
        col = cols[i]
        if col.keep:
            continue
        full = need(i)
        least = min(full, col.least) if col.wrap else full
        # a fixed column (a number, a date) is not worth folding the text of one shown before
        # it, by priority, narrower than _READABLE (a 60-character reason over 8 lines)
        room = 0 if col.wrap else sum(
            max(min(need(j), _READABLE) - min(need(j), cols[j].least), 0)
            for j in shown if not cols[j].keep and cols[j].wrap
        )
        if width is None or used + least + _FRAME + room <= width:
            shown.append(i)
            used += least + _FRAME
        else:
            left_out.append(col.header)
    shown.sort()
    widths = _share(width - used, {i: (min(need(i), cols[i].least), need(i)) for i in shown
                                    if not cols[i].keep and cols[i].wrap}) if width else {}
    left_out.sort(key=[c.header for c in cols].index)
    caption = None
    if left_out:
        caption = f"left out to fit {width} columns: {', '.join(left_out)} (see --json)"
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for i in shown:
        col = cols[i]
        if col.keep:
            table.add_column(col.header, no_wrap=True, min_width=need(i))
        elif col.wrap and i in widths:
            table.add_column(col.header, overflow="fold", width=widths[i])
        elif col.wrap:
            table.add_column(col.header, overflow="fold", min_width=min(need(i), col.least))
        else:
            table.add_column(col.header, no_wrap=True, min_width=need(i))
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def _share(extra: int, spans: dict[int, tuple[int, int]]) -> dict[int, int]:
    """Widths of the folding columns (index -> (least, full) characters): each its least, then
    ``extra`` characters, one at a time, to the one with the most text still folded, none past
    its full width. They are set here, not left to rich: rich narrows the widest columns to fit
    the terminal, below a column's longest word, then widens them back to it, and the table
    overflows: ``COLUMNS=80`` cut its right edge off (docs/cli.md, "Reading state")."""
    widths = {i: least for i, (least, _) in spans.items()}
    for _ in range(max(extra, 0)):
        short = [i for i, (_, full) in spans.items() if widths[i] < full]
        if not short:
            break
        widest = max(short, key=lambda i: spans[i][1] - widths[i])
        widths[widest] += 1
    return widths


def _cell_len(cell: Any) -> int:
    if isinstance(cell, Text):
        return max((len(line) for line in cell.plain.split("\n")), default=0)
    return len(str(cell))
