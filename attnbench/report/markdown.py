"""Tiny markdown helpers shared by every report table."""

from __future__ import annotations

from typing import Any, Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return "-" if v is None else str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


RESULT_TEXT = {"ok": "✓ Success", "oom": "✗ OOM", "time-limit": "✗ Time limit", "error": "✗ Error"}


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
