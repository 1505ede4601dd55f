"""The report's answer, first: per machine, one row per implementation configuration (its
workload but the length and the mode) at its newest measurement. The longest sequence a
forward and a training search ran (the bracket and what stopped it), memory per token and peak
over the floor there, and useful TFLOP/s at the reference length with its interval.

A configuration is listed when a max-seq search measured it; the newest search of each mode
answers (a search on the whole device before one under an allocator limit), so a series a
newer version of the code measured again shows only its newest numbers.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnbench.analysis.search import answering
from attnbench.report import data as d
from attnbench.report.intervals import ms_cell, tflops_cell, tflops_interval, time_interval
from attnbench.report.markdown import Columns, Table
from attnbench.report.tables.sweep import MaxSeqSummary, search_bracket
from attnbench.results.schema import Trial
from attnbench.results.series import row_date
from attnbench.units import format_bytes, format_gib, short_tokens

REFERENCE_LEN, REFERENCE_TEXT = 65536, "64K"  # where throughput is compared across configurations
# The answer's columns, each a configuration's cell (None: nothing to show).
ANSWER_COLUMNS: dict[str, Callable[[Configuration], Any]] = {
    "Configuration": lambda c: c.label,
    "Settings": lambda c: c.settings,
    "Longest forward": lambda c: c.forward.length_text() if c.forward else None,
    "Stopped by": lambda c: c.forward.stop_text() if c.forward else None,
    "Per token": lambda c: c.per_token_text(),
    "Peak/floor": lambda c: f"{c.forward_ratio:.2f}x" if c.forward_ratio else None,
    # at a length every configuration of the machine ran (``common_speeds``)
    "Fwd time at {length}": lambda c: ms_cell(time_interval(c.speed)) if c.speed else None,
    f"Fwd TFLOP/s at {REFERENCE_TEXT}": lambda c: tflops_cell(c.forward_tflops) if c.forward_tflops else None,
    "Longest training": lambda c: c.training_text(),
    f"Train TFLOP/s at {REFERENCE_TEXT}": lambda c: tflops_cell(c.training_tflops) if c.training_tflops else None,
}


@dataclass
class Search:
    """One max-seq search as the answer shows it."""

    summary: MaxSeqSummary
    best: Trial | None  # the successful trial at its longest length

    @property
    def head(self) -> Trial:
        return self.summary.head

    @property
    def limit(self) -> int | None:
        return self.head.memory_limit

    def length_text(self) -> str:
        text = search_bracket(self.summary, short_tokens)
        s = self.summary
        notes = [f"{short_tokens(n)} ran once, then failed" for n in s.unstable if n > s.max_seq_len][:1]
        if s.complete and s.max_seq_len and s.confirmed is False:
            notes.append("not confirmed")
        if s.wider_than_promised:
            notes.append(f"bracket {(s.first_failure - s.max_seq_len) / s.max_seq_len:.0%} wide")
        return text + (f" ({'; '.join(notes)})" if notes else "")

    def stop_text(self) -> str:
        """What stopped the search, with the one limit that names that cause."""
        stop, head = self.summary.stopped_by, self.head
        if stop in ("memory", "host memory") and self.limit:
            return f"{stop} ({format_gib(self.limit)} limit)"
        if stop == "time" and head.max_trial_seconds:
            return f"time ({head.max_trial_seconds:g} s a call)"
        return stop


@dataclass
class Configuration:
    label: str
    settings: str
    world_size: int
    forward: Search | None
    training: Search | None
    forward_tflops: Any  # Interval or None
    training_tflops: Any
    key: str = ""  # configuration_key: its trials
    speed: Trial | None = None  # its forward trial at the machine's common length (common_speeds)
    head: Trial | None = None  # a row of it (without a search: one of its timed lengths)

    @property
    def searched(self) -> bool:
        return bool(self.forward or self.training)

    @property
    def measured_at(self) -> Trial | None:
        """The row its memory is read at: the longest forward length its search ran, or without a
        search the length its speed is given at."""
        return self.forward.best if self.forward else None if self.searched else self.speed

    @property
    def forward_ratio(self) -> float | None:
        """Peak over the floor at the longest forward length (without a search: at its speed's)."""
        return self.measured_at.peak_over_floor if self.measured_at else None

    def per_token_text(self) -> str | None:
        best = self.measured_at
        peak = d.peak_per_gpu(best) if best else None
        return format_bytes(peak / (d.tokens(best) / self.world_size)) if peak else None

    def training_text(self) -> str | None:
        fwd, train = self.forward, self.training
        if not train:
            return None
        ratio = train.best.peak_over_floor if train.best else None
        # the limit is said once, beside the forward, where both ran under the same one
        stop = train.summary.stopped_by if fwd and fwd.limit == train.limit else train.stop_text()
        return f"{train.length_text()}, {stop}" + (f", {ratio:.2f}x floor" if ratio else "")


def _search_csv(name: str, mode: str) -> Columns:
    """The CSV columns of a configuration's forward or training search: raw values, lengths in
    tokens, memory in bytes."""

    def of(get):
        return lambda c: get(getattr(c, mode)) if getattr(c, mode) else None

    return {
        f"{name} Longest": of(lambda s: s.summary.max_seq_len),
        f"{name} First Failure": of(lambda s: s.summary.first_failure),
        f"{name} Stopped By": of(lambda s: s.summary.stopped_by),
        f"{name} Search Finished": of(lambda s: s.summary.complete),
        f"{name} Memory Limit": of(lambda s: s.limit),
        f"{name} Peak per GPU": of(lambda s: d.peak_per_gpu(s.best)),
        f"{name} Peak / Floor": of(lambda s: s.best.peak_over_floor if s.best else None),
    }


CSV_COLUMNS = {  # the answer's numbers raw, each TFLOP/s with its interval
    "Configuration": "label",
    "Settings": "settings",
    "GPUs": "world_size",
    **_search_csv("Forward", "forward"),
    **_search_csv("Training", "training"),
    f"Forward TFLOP/s at {REFERENCE_TEXT}": "forward_tflops",
    f"Training TFLOP/s at {REFERENCE_TEXT}": "training_tflops",
}


def answer_table(configs: list[Configuration], shown: list[Configuration]) -> Table:
    """The ``shown`` rows of a machine's answer, in the columns that hold a value for some of
    its ``configs`` (a CPU run that never reaches the reference length gets no TFLOP/s column of
    dashes); the first three always, so a table still names what it is about. The speed
    column's header names the length its times are at."""
    speed = next((c.speed for c in configs if c.speed), None)
    length = short_tokens(speed.seq_len) if speed else ""
    columns = {
        header.format(length=length): cell
        for i, (header, cell) in enumerate(ANSWER_COLUMNS.items())
        if i < 3 or any(cell(c) is not None for c in configs)
    }
    return Table.of("answer", columns, shown)


def common_speeds(configs: list[Configuration], trials: dict[str, list[Trial]]) -> None:
    """How fast, where the reference length does not answer it for every row: each
    configuration's forward trial at the longest length all of them ran (searches start short
    and double, so there is one), the newest there; where searches started apart, the length
    most of them ran (the rest show none)."""
    if all(c.forward_tflops for c in configs):
        return
    ran = [
        {r.seq_len: r for r in sorted(_forward_ok(trials.get(c.key, []), c.searched), key=row_date)} for c in configs
    ]
    counts = Counter(n for lengths in ran for n in lengths)
    if not counts:
        return
    length, count = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
    if count > 1 or len(configs) == 1:
        for c, lengths in zip(configs, ran):
            c.speed = lengths.get(length)


def _forward_ok(trials: list[Trial], searched: bool = True) -> list[Trial]:
    """Timed forward trials: a search's, or where the configuration has none, its fixed lengths'."""
    kind = "max-seq" if searched else "points"
    return [r for r in d.ok(trials) if (r.mode or "fwd") == "fwd" and r.time_ms and r.kind == kind]


def configuration_key(row: Trial) -> str:
    """What one answer row stands for: the workload but its length and mode."""
    return row.identity_key(seq_len=False, without=("mode",))


def clean_label(label: str) -> str:
    """A series label without the code version and allocator limit the report adds to tell
    series apart (the answer shows one version and says the limit beside the length), and
    without its model preset (the settings name it)."""
    return re.sub(r" for [\w.-]+$", "", label.split(" @ ")[0].split(" under ")[0])


def settings_text(row: Trial) -> str:
    """The shape in a few characters: `bf16 H8 D64`, `llama3-8b bf16 H32/8 D128 causal` (query
    heads / key-value heads)."""
    extra = f" B{row.batch}" if row.batch != 1 else ""
    model = f"{row.model} " if row.model else ""
    return f"{model}{row.dtype}{extra} {d.heads_text(row)} D{row.head_dim}" + (" causal" if row.causal else "")


def _reference_tflops(trials: list[Trial], mode: str):
    at = [r for r in d.ok(trials) if r.seq_len == REFERENCE_LEN and (r.mode or "fwd") == mode and r.tflops_useful]
    if not at:
        return None
    return tflops_interval(max(at, key=lambda r: (row_date(r), r.series)))


def _configuration(head: Trial, key: str, rows: list[Trial], fwd=None, train=None) -> Configuration:
    """One answer row: its searches where it has any, its rows' TFLOP/s at the reference length."""
    return Configuration(
        label=clean_label(head.label),
        settings=settings_text(head),
        world_size=d.world_size(head),
        forward=fwd,
        training=train,
        forward_tflops=_reference_tflops(rows, "fwd"),
        training_tflops=_reference_tflops(rows, "fwd_bwd"),
        key=key,
        head=head,
    )


def configurations(machine) -> list[Configuration]:
    """The answer rows of one machine (``document.Machine``), longest forward sequence first."""
    by_key: dict[str, list[Trial]] = {}
    for r in machine.trials:
        by_key.setdefault(configuration_key(r), []).append(r)
    searches: dict[str, dict[str, list[Search]]] = {}
    for s in machine.summaries:
        mode = s.head.mode or "fwd"
        searches.setdefault(configuration_key(s.head), {}).setdefault(mode, []).append(Search(s, machine.at_max(s)))
    out = []
    for key, modes in searches.items():
        fwd, train = (answering(modes.get(mode, []), lambda s: s.head) for mode in ("fwd", "fwd_bwd"))
        out.append(_configuration((fwd or train).head, key, by_key.get(key, []), fwd, train))
    # a machine without a search (bench only) answers with speed: its fixed lengths' configurations
    for key, rows in by_key.items() if not searches else ():
        timed = _forward_ok(rows, searched=False)
        if timed:
            out.append(_configuration(timed[0], key, rows))
    common_speeds(out, by_key)

    def order(c: Configuration) -> tuple:
        longest = c.forward.summary.max_seq_len if c.forward else 0
        outside = bool(c.head.impl_source)  # the user's own code leads
        return (not outside, c.world_size, -(longest or 0), c.speed is None, c.label, c.settings)

    return sorted(out, key=order)


def first_screen(configs: list[list[Configuration]], rows: int) -> list[list[Configuration]]:
    """Which answer rows of each machine fit in ``rows`` lines of tables: dealt one at a time to
    every machine in turn (one with fewer takes what it has), and a machine that shows fewer
    than it has spends a line on saying so. Within a machine each implementation's first
    configuration comes before any second one, so every implementation is seen; rows keep their
    order."""
    picks = [sorted(range(len(c)), key=lambda i, c=c: (_rank_in_impl(c, i), i)) for c in configs]
    sizes = [len(c) for c in configs]
    shown = _deal(sizes, rows)
    while True:  # each machine cut short costs a line: deal again with fewer until that holds
        cut = sum(n < size for n, size in zip(shown, sizes))
        again = _deal(sizes, rows - cut)
        if again == shown:
            break
        shown = again
    shown = [max(n, min(1, size)) for n, size in zip(shown, sizes)]  # too many machines: one row each still
    return [[c[i] for i in sorted(order[:n])] for c, order, n in zip(configs, picks, shown)]


def _deal(sizes: list[int], rows: int) -> list[int]:
    shown = [0] * len(sizes)
    while rows > 0 and any(n < size for n, size in zip(shown, sizes)):
        for m, size in enumerate(sizes):
            if shown[m] < size and rows > 0:
                shown[m], rows = shown[m] + 1, rows - 1
    return shown


def _rank_in_impl(configs: list[Configuration], i: int) -> int:
    """How many configurations of the same implementation come before ``configs[i]``."""
    impl = _impl(configs[i])
    return sum(1 for c in configs[:i] if _impl(c) == impl)


def _impl(c: Configuration) -> str:
    return c.head.impl


def machine_words(machine) -> str:
    """What the machine is, in a few words: 'one GPU, 140 GiB', 'two GPUs, 140 GiB each',
    '2 cores, no GPU'."""
    env = next((r.env for r in machine.rows if r.env), None)
    if machine.on_cpu:
        cores = env.cpu_count if env else None
        return f"{f'{cores} cores, ' if cores else ''}no GPU"
    gpus = (env.gpus if env else None) or []
    count = {1: "one GPU", 2: "two GPUs", 4: "four GPUs", 8: "eight GPUs"}.get(len(gpus), f"{len(gpus)} GPUs")
    size = gpus[0].get("memory_total_bytes") if gpus else None
    return f"{count}{f', {size / 2**30:.0f} GiB each' if size and len(gpus) > 1 else f', {size / 2**30:.0f} GiB' if size else ''}"
