"""Human tables and --json output, shared by every CLI command."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], out: TextIO | None = None) -> None:
    """Print rows as an aligned text table with the given columns (missing values show '-')."""
    out = out or sys.stdout
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    out.write("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() + "\n")
    for row in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n")


def wrapped_table(rows: Sequence[Mapping[str, Any]], key: str, texts: Sequence[tuple[str, str]], *,
                  width: int = 100, out: TextIO | None = None) -> None:
    """Rows as a table of two columns that fits ``width`` columns: ``key``, and the texts of
    ``texts`` ((column, label) pairs) one after another, each wrapped, the second on labelled
    with ``label:`` (issue 42: ``ordq drill list`` was 400 columns wide)."""
    import textwrap

    out = out or sys.stdout
    key_width = max([len(key)] + [len(_cell(r.get(key))) for r in rows])
    room = max(20, width - key_width - 2)
    title = " / ".join(label.upper() for _column, label in texts)
    out.write(f"{key.upper().ljust(key_width)}  {title}\n")
    for r in rows:
        lines: list[str] = []
        for i, (column, label) in enumerate(texts):
            text = _cell(r.get(column)) if i == 0 else f"{label}: {_cell(r.get(column))}"
            lines += textwrap.wrap(text, room, subsequent_indent="  " if i else "") or ["-"]
        for i, line in enumerate(lines):
            out.write(f"{(_cell(r.get(key)) if i == 0 else '').ljust(key_width)}  {line}".rstrip() + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "-"
    return str(value)


# A list longer than this prints one item a line (``emit_json``).
LONG_LIST = 1000


def emit_json(obj: Any, out: TextIO | None = None) -> None:
    """Print obj as ``json_text`` makes it."""
    (out or sys.stdout).write(json_text(obj))


def json_text(obj: Any) -> str:
    """What ``--json`` prints of obj: indented JSON (one document, a newline after it); a list of
    more than ``LONG_LIST`` items as one item a line, each compact. Also made by the coordinator
    for ``queue list --json`` (its rows as this text, printed as is: ``rows_as_text``).

    Why: with an indent, the standard library encodes in Python, not C: ``queue list --json``
    of 2,000 queues spent 2-3 s of its 3-4 s there, and 10^5 queues took 271 s in all (issue
    43, goal < 10 s). Each line is still one item of the same JSON array."""
    if isinstance(obj, list) and len(obj) > LONG_LIST:
        # one encoder for every item: ``json.dumps`` with options makes one an item (10^5 rows
        # of ``queue list``: 6.7 s of the CLI's 40 s under py-spy, scale43h)
        encode = json.JSONEncoder(sort_keys=True, default=str).encode
        return json_items_text([encode(item) for item in obj])
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"


def json_items_text(items: Sequence[str]) -> str:
    """``json_text`` of a long list (more than ``LONG_LIST`` items) whose items' compact JSON
    texts (keys sorted) are ``items``: one item a line."""
    return "[\n" + ",\n".join("  " + item for item in items) + "\n]\n"


def format_time_ms(ms: int) -> str:
    """A wall-clock time in ms since the epoch, as people read it, with its zone (UTC)."""
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
