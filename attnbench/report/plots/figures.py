"""Report figures (matplotlib, Agg backend, PNG), drawn from the rows of one machine.

Each figure is small multiples: one panel per implementation family, at most ``MAX_SERIES``
lines a panel (a larger family takes several panels), each line one workload at its newest
measurement (a search on the whole device before one under a limit, then the newest; series a
newer version of the code measured again, and older runs of the same workload, stay in the
CSVs and the tables). Where a line's search stopped, the first failed length is marked by what
stopped it. Each legend sits below its own panel, inside the figure. Functions return a Figure,
or None when there is nothing to draw.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnbench import impls
from attnbench.report.data import describe, heads_text, ok, peak_per_gpu, world_size
from attnbench.report.plots.drawing import pyplot
from attnbench.report.tables.sweep import max_seq_summary, series_groups
from attnbench.results.schema import Row, Trial
from attnbench.results.series import is_superseded, row_date
from attnbench.units import flop_unit, format_gib, short_tokens

if TYPE_CHECKING:
    from attnbench.report.tables.multigpu import SpeedupCase

MAX_SERIES = 8
COLUMNS = 2
PANEL = (6.2, 3.4)  # inches of one panel, its legend below it
# what stopped a search (``analysis.search``'s words), as a marker at its first failed length,
# and the marker's words in a figure's title
STOP_MARKERS = {
    "memory": "X",
    "host memory": "X",
    "time": "^",
    "killed": "v",
    "unsupported shape": "s",
    "search time budget": "D",
    "search interrupted": "o",
}
MARKER_WORDS = {
    "X": "out of memory",
    "^": "time limit",
    "v": "killed",
    "s": "unsupported shape",
    "D": "search time budget",
    "o": "search interrupted",
}


def stop_note(stopped_by: list[str]) -> str:
    """What each marker drawn means (those of ``stopped_by`` alone), or "" where none is drawn."""
    marks = dict.fromkeys(STOP_MARKERS[why] for why in stopped_by if why in STOP_MARKERS)
    if not marks:
        return ""
    return ", ".join(f"{m}: {MARKER_WORDS[m]}" for m in marks) + ", at the first length that failed"


@dataclass
class Line:
    """One workload's series as a figure draws it."""

    label: str
    family: str
    trials: list[Trial]  # successful trials, by length
    stop: tuple[int, str] | None  # (first failed length, what stopped it)


# the panel of the implementations of no family of their own
OTHERS = "dense and others"


def family(head: Trial) -> str:
    """The panel a series is drawn in: its implementation's family (``impls.family``)."""
    return impls.family(head.impl, head.impl_source) or OTHERS


def lines(rows: list[Row], value) -> list[Line]:
    """One line per workload (identity without length, plus its memory limit): its newest
    series that is not superseded, with successful trials where ``value`` has a number."""
    stops = {s.series: s for s in max_seq_summary(rows)}
    newest: dict[str, list[Trial]] = {}
    for group in series_groups(rows).values():
        head = group[0]
        if is_superseded(head.label):
            continue
        key = head.identity_key(seq_len=False, memory_limit=head.memory_limit)
        if key not in newest or _rank(head) > _rank(newest[key][0]):
            newest[key] = group
    out = []
    for group in newest.values():
        good = [r for r in ok(group) if value(r)]
        if not good:
            continue
        head = group[0]
        s = stops.get(head.series)
        stop = (s.first_failure, s.stopped_by) if s and s.first_failure else None
        out.append(Line(_label(head), family(head), good, stop))
    out.sort(key=lambda line: (line.family, line.label))
    seen: dict[tuple[str, str], int] = {}
    for line in out:  # distinct labels within a family: a second run of one label is numbered
        n = seen[(line.family, line.label)] = seen.get((line.family, line.label), 0) + 1
        if n > 1:
            line.label += f" #{n}"
    return out


def _rank(head: Trial) -> tuple:
    """Which series of one workload a figure draws: a search before points, then the newest."""
    return (head.kind == "max-seq", row_date(head), head.series)


def _label(head: Trial) -> str:
    """The series' name without its code version, and the settings that tell it apart."""
    label = describe(head).split(" @ ")[0]
    p = world_size(head)
    settings = [head.dtype]
    settings += [f"B{head.batch}"] if head.batch != 1 else []
    shape = f"{heads_text(head)} D{head.head_dim}"
    settings += [shape] if shape != "H8 D64" else []
    settings += ["causal"] if head.causal else []
    settings += ["train"] if head.mode == "fwd_bwd" else []
    settings += [f"under {format_gib(head.memory_limit)}"] if head.memory_limit and " under " not in label else []
    return f"{label}, {' '.join(settings)}" + (f" ({p} GPUs)" if p > 1 and f"x{p}" not in label else "")


def panels(found: list[Line]) -> list[tuple[str, list[Line]]]:
    """Lines by family, at most MAX_SERIES a panel."""
    by_family: dict[str, list[Line]] = {}
    for line in found:
        by_family.setdefault(line.family, []).append(line)
    out = []
    for name, members in by_family.items():
        chunks = math.ceil(len(members) / MAX_SERIES)
        size = math.ceil(len(members) / chunks)  # even panels: 9 lines are 5 and 4, not 8 and 1
        for i in range(chunks):
            part = members[i * size : (i + 1) * size]
            out.append((name + (f" ({i + 1} of {chunks})" if chunks > 1 else ""), part))
    return out


def _grid(n: int, title: str):
    plt = pyplot()
    cols = min(COLUMNS, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(PANEL[0] * cols, PANEL[1] * rows + 0.6), layout="constrained", squeeze=False
    )
    fig.suptitle(title, fontsize=11)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _legend(ax) -> None:
    """Below the panel, inside the figure: two columns, or one where a label is long."""
    labels = ax.get_legend_handles_labels()[1]
    columns = 1 if max(map(len, labels), default=0) > 38 else 2
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=columns, frameon=False)


def _log_ticks(ax) -> None:
    """Lengths at powers of two written as 64K, 1M; values written plainly (0.3, 100), with
    labelled steps between powers of ten where the axis spans less than three decades."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=9))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(_length_tick))
    if ax.yaxis.get_scale() != "log":
        return
    plain = FuncFormatter(_plain_tick)
    ax.yaxis.set_major_formatter(plain)
    low, high = ax.get_ylim()
    span = high / low if low > 0 else float("inf")
    if span >= 1000:
        ax.yaxis.set_minor_formatter(NullFormatter())
        return
    # within a few decades: labelled steps between the powers of ten, so values can be read off
    subs = (2, 5) if span >= 10 else (1.2, 1.4, 1.6, 1.8, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_minor_formatter(plain)


def _length_tick(v: float, _) -> str:
    return short_tokens(round(v))


def _plain_tick(v: float, _) -> str:
    return f"{v:g}"


def _series_figure(rows: list[Row], value, title: str, ylabel: str, yscale: str = "log", floor=None):
    found = lines(rows, value)
    if not found:
        return None
    groups = panels(found)
    note = stop_note([line.stop[1] for line in found if line.stop])
    fig, axes = _grid(len(groups), f"{title}\n{note}" if note else title)
    for ax, (name, members) in zip(axes, groups):
        ax.set(title=name, xlabel="sequence length (tokens)", ylabel=ylabel, xscale="log", yscale=yscale)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(which="both", labelsize=7)
        for line in members:
            xs = [r.seq_len for r in line.trials]
            ys = [value(r) for r in line.trials]
            (drawn,) = ax.plot(xs, ys, "o-", markersize=3, label=textwrap.fill(line.label, 60))
            if floor:
                floors = [(r.seq_len, floor(r)) for r in line.trials if floor(r)]
                if floors:
                    ax.plot(*zip(*floors), "--", color=drawn.get_color(), alpha=0.5, linewidth=1)
            if line.stop and line.stop[1] in STOP_MARKERS:
                ax.plot([line.stop[0]], [ys[-1]], STOP_MARKERS[line.stop[1]], color=drawn.get_color(), ms=8)
        _log_ticks(ax)
        _legend(ax)
    return fig


def memory_plot(rows: list[Row], machine: str):
    """Peak memory of one device (the fullest rank's) against length, each line's memory floor
    of that device dashed (a ring row's floor is already per rank)."""
    return _series_figure(
        rows,
        lambda r: (peak_per_gpu(r) or 0) / 2**30,
        f"Peak memory per device, floor dashed — {machine}",
        "peak memory (GiB)",
        floor=lambda r: r.floor_bytes / 2**30 if r.floor_bytes else None,
    )


def time_plot(rows: list[Row], machine: str):
    return _series_figure(rows, lambda r: r.time_ms, f"Time per call — {machine}", "median time (ms)")


def tflops_plot(rows: list[Row], machine: str):
    """Useful throughput against length, in the unit the terminal and the tables give these
    rates (``flop_unit``: GFLOP/s where every rate is under one TFLOP/s, a CPU's)."""
    top = max((r.tflops_useful for r in rows if isinstance(r, Trial) and r.tflops_useful), default=0.0)
    unit, factor = flop_unit(top)
    return _series_figure(
        rows,
        lambda r: r.tflops_useful * factor if r.tflops_useful else None,
        f"Useful {unit} (attended pairs) — {machine}",
        f"{unit} (useful)",
        yscale="linear",
    )


def speedup_plot(cases: list[SpeedupCase], machine: str):
    """Bars, log scale: speedup over one GPU per (length x batch) case and strategy. A speedup
    whose efficiency lies above 1 beyond its interval is an anomaly: hatched and marked."""
    cases = [c for c in cases if c.speedup]
    if not cases:
        return None
    plt = pyplot()
    labels = sorted({(c.row.seq_len, c.row.batch or 1) for c in cases})
    kinds = sorted({_kind(c) for c in cases})[:MAX_SERIES]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.5 * len(labels) * len(kinds) + 3), 4.6), layout="constrained")
    width = 0.8 / len(kinds)
    for j, kind in enumerate(kinds):
        xs, ys, anomalous = [], [], []
        for i, case in enumerate(labels):
            hit = [c for c in cases if (c.row.seq_len, c.row.batch or 1) == case and _kind(c) == kind]
            if hit:
                c = max(hit, key=lambda c: row_date(c.row))
                xs.append(i + j * width)
                ys.append(c.speedup)
                anomalous.append(bool(c.efficiency_ci and c.efficiency_ci.low > 1))
        strategy, p, impl, mode = kind
        # from 1 (as fast as one GPU): a slowdown hangs below the line, a speedup stands above it
        bars = ax.bar(xs, [y - 1 for y in ys], width, bottom=1, label=f"{impl} {mode}: {strategy}, {p} GPUs")
        for bar, y, odd in zip(bars, ys, anomalous):
            if odd:
                bar.set_hatch("//")
            ax.annotate(
                f"{y:.2g}x" + ("\nanomaly" if odd else ""),
                (bar.get_x() + bar.get_width() / 2, y),
                ha="center",
                va="bottom" if y >= 1 else "top",
                fontsize=6,
            )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    values = [c.speedup for c in cases]
    ax.set_ylim(min(min(values), 1) / 3, max(max(values), 1) * 3)  # room for the labels
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], [f"N={n:,}\nB={b}" for n, b in labels], fontsize=7)
    ax.set(
        title=f"Speedup over one GPU (log scale; hatched: efficiency above 1, an anomaly) — {machine}",
        ylabel="single time / multi-GPU time",
    )
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper left", frameon=True)
    return fig


def _kind(c: SpeedupCase) -> tuple:
    """A bar series: strategy, GPUs, implementation and mode."""
    return (c.row.strategy, world_size(c.row), c.row.impl, c.row.mode)


# the answer's bars: a configuration's attribute, its colour and its legend entry
ANSWER_MODES = (("forward", "tab:blue", "forward"), ("training", "tab:orange", "training (forward + backward)"))


def answer_plot(machines: list[tuple[str, list[Any]]]):
    """The answer in one figure: per machine a panel of bars, the longest forward and training
    sequence of each configuration (log scale), the end marked by what stopped the search."""
    shown = [(name, configs) for name, configs in machines if configs]
    if not shown:
        return None
    plt = pyplot()
    heights = [max(1.2, 0.32 * len(configs) + 0.9) for _, configs in shown]
    fig, axes = plt.subplots(
        len(shown),
        1,
        figsize=(10, sum(heights) + 0.8),
        layout="constrained",
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    searches = [s.summary for _, configs in shown for c in configs for s in (c.forward, c.training) if s]
    note = stop_note([s.stopped_by for s in searches if s.first_failure])
    fig.suptitle(
        "Longest sequence per configuration (log scale)\n"
        + (f"{note}; " if note else "")
        + "hollow: search not finished",
        fontsize=10,
    )
    lengths = [x for s in searches for x in (s.max_seq_len, s.first_failure) if x]
    span = (2 ** math.floor(math.log2(min(lengths))) / 2, 2 ** math.ceil(math.log2(max(lengths))) * 2)
    for ax, (name, configs) in zip(axes[:, 0], shown):
        ys = list(range(len(configs)))
        for offset, (mode, color, _) in zip((-0.18, 0.18), ANSWER_MODES):
            for y, c in zip(ys, configs):
                if not _has_bar(c, mode):
                    continue
                s = getattr(c, mode).summary
                ax.barh(y + offset, s.max_seq_len, 0.34, color=color, alpha=0.85 if s.complete else 0.35)
                end = s.max_seq_len
                marker = STOP_MARKERS.get(s.stopped_by)
                if marker and s.first_failure:
                    ax.plot([s.first_failure], [y + offset], marker, color="black", ms=6)
                    end = s.first_failure
                ax.text(end * 1.25, y + offset, short_tokens(s.max_seq_len), va="center", fontsize=6)
        ax.set_yticks(ys, [_answer_label(c) for c in configs], fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(*span)  # one scale for every machine: bars compare across panels
        ax.set_title(name, fontsize=9, loc="left")
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlabel("tokens", fontsize=7)
    # an entry for each mode with a bar: no training entry without training data
    drawn = [
        (color, text) for mode, color, text in ANSWER_MODES if any(_has_bar(c, mode) for _, cs in shown for c in cs)
    ]
    handles = [plt.Rectangle((0, 0), 1, 1, color=color, alpha=0.85) for color, _ in drawn]
    axes[0, 0].legend(handles, [text for _, text in drawn], fontsize=7, loc="lower right")
    return fig


def _has_bar(c, mode: str) -> bool:
    """Whether configuration ``c``'s search of ``mode`` (forward, training) ran some length."""
    search = getattr(c, mode)
    return bool(search and search.summary.max_seq_len)


def _answer_label(c) -> str:
    """A configuration and the allocator limit its searches ran under, if any."""
    limits = sorted({format_gib(s.limit) for s in (c.forward, c.training) if s and s.limit})
    return f"{c.label} ({c.settings})" + (f" under {', '.join(limits)}" if limits else "")
