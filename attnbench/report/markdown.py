"""Tiny markdown helpers shared by every report table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return "-" if v is None else str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


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
    import re

    if not message:
        return ""
    alloc = re.search(r"[Tt]ried to allocate ([0-9.]+ ?[KMGT]i?B)", message)
    if alloc:
        return f"tried to allocate {alloc.group(1)} more"
    return message if len(message) <= limit else message[: limit - 1] + "…"


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
        formats: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.headers = list(headers)
        self.records = list(records)
        self.formats = formats or {}

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
            records.append(flat)
        return pd.DataFrame(records, columns=headers).to_csv(index=False)
