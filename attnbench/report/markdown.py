"""Tiny markdown helpers shared by every report table, and the escaping of text that comes
from rows (labels, messages, commands): such text never starts a line of its own, a heading,
a table row or an HTML tag."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

# every character Python's str.splitlines() breaks a line at, and tabs
_LINE_BREAKS = re.compile(r"[\r\n\t\v\f\x1c-\x1e\x85\u2028\u2029]+")


def inline(text: Any) -> str:
    """Text from a row, made safe inside one line of markdown: line breaks become spaces and
    an angle bracket cannot open an HTML tag."""
    return _LINE_BREAKS.sub(" ", str(text)).replace("<", "&lt;")


def heading_text(text: Any) -> str:
    """Text from a row in a heading: one line, and no trailing '#' run that closes it."""
    return inline(text).rstrip("# ") or "-"


def cell_text(v: Any) -> str:
    """A table cell: '-' for None, one line, '|' escaped."""
    return "-" if v is None else inline(v).replace("|", "\\|")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell_text(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def record_table(columns: dict[str, Any], records: Sequence[Any]) -> str:
    """The markdown alone of ``Table.of`` (a results directory's files keep no CSV per table)."""
    return Table.of("", columns, records).markdown()


RESULT_TEXT = {
    "ok": "✓ Success",
    "oom": "✗ OOM",
    "host-oom": "✗ Host OOM (killed)",
    "killed": "✗ Killed",
    "time-limit": "✗ Time limit",
    "unsupported": "✗ Unsupported",
    "error": "✗ Error",
}


def result_text(status: str) -> str:
    return RESULT_TEXT.get(status, status)


def short_message(message: str | None, limit: int = 90) -> str:
    """A failure in a table cell: the allocation that failed, or the message's start."""
    if not message:
        return ""
    alloc = re.search(r"[Tt]ried to allocate ([0-9.]+ ?[KMGT]i?B)", message)
    if alloc:
        return f"tried to allocate {alloc.group(1)} more"
    return message if len(message) <= limit else message[: limit - 1] + "…"


#: what a table shows of a record under one header (``Table.of``): an attribute's name or a
#: function of the record (the raw value the CSV holds), or a pair (that, its markdown cell)
Column = str | Callable[[Any], Any] | tuple[str | Callable[[Any], Any], Callable[[Any], str]]
#: a table's columns, by header
Columns = dict[str, Column]


class Table:
    """One report table: raw values per column for the CSV, formatted cells for the markdown.

    ``records`` map each header to a raw value (times in ms, memory in bytes, lengths in
    tokens); ``formats`` turn a raw value into its markdown cell (default: as is, '-' for None).
    """

    def __init__(
        self,
        name: str,
        headers: Sequence[str],
        records: Sequence[dict[str, Any]],
        formats: dict[str, Callable[[Any], str]] | None = None,
    ) -> None:
        self.name = name
        self.headers = list(headers)
        self.records = list(records)
        self.formats = formats or {}

    @classmethod
    def of(cls, name: str, columns: Columns, records: Sequence[Any]) -> Table:
        """The one table builder: ``columns`` maps each header to what a record shows there, an
        attribute's name or a function of the record (the raw value the CSV holds), or to a pair
        (that, its markdown cell)."""
        get = {h: c[0] if isinstance(c, tuple) else c for h, c in columns.items()}
        cells = [{h: a(r) if callable(a) else getattr(r, a) for h, a in get.items()} for r in records]
        return cls(name, list(columns), cells, {h: c[1] for h, c in columns.items() if isinstance(c, tuple)})

    def cells(self) -> list[list[Any]]:
        def fmt(h: str, v: Any) -> Any:
            return "-" if v is None else self.formats.get(h, lambda x: x)(v)

        return [[fmt(h, rec.get(h)) for h in self.headers] for rec in self.records]

    def markdown(self) -> str:
        return table(self.headers, self.cells())

    def csv(self) -> str:
        import pandas as pd

        from attnbench.measure.stats import Interval

        # an interval is three numbers in the CSV: the value, then its bounds and n
        headers, records = list(self.headers), []
        for h in self.headers:
            if any(isinstance(rec.get(h), Interval) for rec in self.records):
                at = headers.index(h) + 1
                headers[at:at] = [f"{h} CI Low", f"{h} CI High", f"{h} n"]
        for rec in self.records:
            flat = dict(rec)
            for h, v in rec.items():
                if isinstance(v, Interval):
                    flat.update({h: v.value, f"{h} CI Low": v.low, f"{h} CI High": v.high, f"{h} n": v.n})
            records.append({k: _unsigned_zero(v) for k, v in flat.items()})
        return pd.DataFrame(records, columns=headers).to_csv(index=False)


def _unsigned_zero(v: Any) -> Any:
    """-0.0 written as 0.0: a sign that depends on rounding is not a difference between runs."""
    return 0.0 if isinstance(v, float) and v == 0 else v
