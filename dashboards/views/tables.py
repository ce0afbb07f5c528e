"""Tables that fit and rows that open.

Every table the results pages show goes through :func:`show`: each column is as wide as its
widest cell (estimated from the text; the grid draws on a canvas, so nothing can measure it
later), columns of numbers (counts, estimates with units, intervals, p-values) are
right-aligned, and a table whose columns would add up to more than :data:`BUDGET_PX` gives
its free-text column (a name, a reason) what is left instead of pushing the last columns out
of sight. :data:`BUDGET_PX` is the main area's width at a 1,280 px window with the sidebar
open (818 px), less a margin; wider windows stretch the columns. Long tables scroll inside
themselves (at most :data:`MAX_ROWS` rows high).

With ``open_rows``, a click on any cell of a row selects it (single-cell selection: no
checkbox column to aim at) and :func:`show` returns that row's position.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

import pandas as pd
import streamlit as st

BUDGET_PX = 800
MAX_ROWS = 12
ROW_PX = 35
CELL_PADDING_PX = 20  # the grid's 8 px each side, and a little slack
MAX_COLUMN_PX = 420
MIN_FLEX_PX = 120
_NUMBER = re.compile(r"^[\s\[(<>≤≥~]*[-+−]?[$€]?\d")


def text_px(text: object) -> int:
    """About how wide the grid's 14 px Source Sans draws ``text``, a little over rather than
    under (calibrated on canvas measurements of the cells these pages show)."""
    width = 0.0
    for ch in str(text):
        if unicodedata.east_asian_width(ch) in ("W", "F") or ord(ch) >= 0x1F000:
            width += 18  # emoji
        elif unicodedata.category(ch) in ("Mn", "Cf"):  # combining marks, joiners, variation selectors
            continue
        elif ch.isupper() or ch in "mw%_":
            width += 8.6
        elif ch.isdigit():
            width += 6.6
        elif ch.isalpha():
            width += 6.0
        elif ch == " ":
            width += 3.4
        else:
            width += 4.4
    return int(width * 1.06 + 0.5)


def is_numeric(column: pd.Series) -> bool:
    """A column of numbers, formatted or not (``412 ms``, ``$0.17 / 1k``, ``-3.0% [...]``,
    ``< 0.001``); "—" cells do not count either way."""
    if pd.api.types.is_numeric_dtype(column):
        return True
    cells = [str(v) for v in column if str(v).strip() not in ("", "—", "-", "None", "nan")]
    return bool(cells) and all(_NUMBER.match(c) for c in cells)


def column_widths(frame: pd.DataFrame, *, budget: int = BUDGET_PX, flex: Iterable[str] = ()) -> dict[str, int]:
    """Each column's width in pixels: its widest cell or header. Over ``budget``, the ``flex``
    columns (free text) share what the others leave, down to ``MIN_FLEX_PX`` each."""
    widths = {}
    for name in frame.columns:
        cells = [text_px(name) + 8]  # the header's sort arrow
        cells += [text_px(v) for v in frame[name].tolist()]
        widths[str(name)] = min(MAX_COLUMN_PX, max(cells) + CELL_PADDING_PX)
    flex = [f for f in flex if f in widths]
    over = sum(widths.values()) - budget
    if over > 0 and flex:
        fixed = sum(w for name, w in widths.items() if name not in flex)
        share = max(MIN_FLEX_PX, (budget - fixed) // len(flex))
        for name in flex:
            widths[name] = min(widths[name], share)
    return widths


def show(frame: pd.DataFrame, *, key: str | None = None, open_rows: bool = False, flex: Iterable[str] = (),
         help: dict[str, str] | None = None, height: int | None = None, budget: int = BUDGET_PX) -> int | None:
    """``st.dataframe`` with fitted, aligned columns; the clicked row's position with ``open_rows``.
    ``budget``: the narrowest width the table has at 1,280 px (less in a column)."""
    widths = column_widths(frame, flex=flex, budget=budget)
    config = {}
    for name in frame.columns:
        kw = {"width": widths[str(name)], "help": (help or {}).get(str(name))}
        if is_numeric(frame[name]):
            config[name] = st.column_config.Column(str(name), alignment="right", **kw)
        else:
            config[name] = st.column_config.Column(str(name), alignment="left", **kw)
    if height is None and len(frame) > MAX_ROWS:
        height = ROW_PX * (MAX_ROWS + 1) + 3  # the header and MAX_ROWS rows; the rest scrolls inside
    args = {"hide_index": True, "width": "stretch", "column_config": config}
    if height is not None:
        args["height"] = height
    if not open_rows:
        st.dataframe(frame, key=key, **args)
        return None
    event = st.dataframe(frame, key=key, on_select="rerun", selection_mode="single-cell", **args)
    selection = getattr(event, "selection", None) or {}
    cells = selection.get("cells") or []
    rows = selection.get("rows") or []
    if cells:
        return int(cells[0][0])
    if rows:
        return int(rows[0])
    return None
