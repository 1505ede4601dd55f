"""Report figures (matplotlib, Agg backend, PNG), drawn from rows of one machine.

Each function returns a Figure, or None when the rows hold nothing to draw; the caller
saves it next to the markdown that embeds it.
"""

from __future__ import annotations

from typing import Any

from attnbench.report.data import describe, ok, peak_per_gpu, trials, world_size
from attnbench.report.sweep_tables import series_groups


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series_points(rows: list[dict[str, Any]], value) -> list[tuple[str, list[dict[str, Any]]]]:
    out = []
    for group in series_groups(trials(rows)).values():
        good = [r for r in ok(group) if value(r)]
        if good:
            p = world_size(good[0])
            out.append((describe(good[0]) + (f" ({p} GPUs)" if p > 1 else ""), good))
    return out


def _figure(title: str, xlabel: str, ylabel: str):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 5), layout="constrained")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel, xscale="log", yscale="log")
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def _legend(ax) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def memory_plot(rows: list[dict[str, Any]], machine: str):
    """Peak memory per GPU against sequence length, with each series' memory floor dashed."""
    data = _series_points(rows, peak_per_gpu)
    if not data:
        return None
    fig, ax = _figure(
        f"Peak memory per GPU vs sequence length — {machine}", "sequence length (tokens)", "peak memory (GB)"
    )
    for label, good in data:
        n = [r["seq_len"] for r in good]
        (line,) = ax.plot(n, [peak_per_gpu(r) / 1e9 for r in good], "o-", label=label)
        floors = [(r["seq_len"], r["floor_bytes"] / 1e9 / world_size(r)) for r in good if r.get("floor_bytes")]
        if floors:
            ax.plot(*zip(*floors), "--", color=line.get_color(), alpha=0.6)
    ax.plot([], [], "--", color="gray", label="dashed: memory floor (q, k, v, output)")
    _legend(ax)
    return fig


def _per_length_plot(rows: list[dict[str, Any]], field: str, title: str, ylabel: str):
    """One line per series: ``field`` of each successful trial against its sequence length."""
    data = _series_points(rows, lambda r: r.get(field))
    if not data:
        return None
    fig, ax = _figure(title, "sequence length (tokens)", ylabel)
    for label, good in data:
        ax.plot([r["seq_len"] for r in good], [r[field] for r in good], "o-", label=label)
    _legend(ax)
    return fig


def time_plot(rows: list[dict[str, Any]], machine: str):
    return _per_length_plot(rows, "time_ms", f"Time vs sequence length — {machine}", "median time per call (ms)")


def tflops_plot(rows: list[dict[str, Any]], machine: str):
    return _per_length_plot(
        rows,
        "tflops_executed",
        f"Achieved TFLOP/s (executed FLOPs) vs sequence length — {machine}",
        "TFLOP/s (executed)",
    )


def speedup_plot(cases: list[dict[str, Any]], machine: str):
    """Bars: speedup over one GPU per (length x batch) case, one bar per strategy and GPU count."""
    cases = [c for c in cases if c.get("speedup")]
    if not cases:
        return None
    plt = _pyplot()
    labels = sorted({(c["seq_len"], c["batch"] or 1) for c in cases})
    kinds = sorted({(c["strategy"], c["world_size"], c["impl"]) for c in cases})
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(labels) * len(kinds) + 3), 5), layout="constrained")
    width = 0.8 / len(kinds)
    for j, (strategy, p, impl) in enumerate(kinds):
        xs, ys = [], []
        for i, case in enumerate(labels):
            hit = [
                c["speedup"]
                for c in cases
                if (c["seq_len"], c["batch"] or 1) == case
                and (c["strategy"], c["world_size"], c["impl"]) == (strategy, p, impl)
            ]
            if hit:
                xs.append(i + j * width)
                ys.append(hit[-1])
        ax.bar(xs, ys, width, label=f"{impl}: {strategy}, {p} GPUs")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], [f"N={n:,}\nB={b}" for n, b in labels])
    ax.set(title=f"Speedup over one GPU — {machine}", ylabel="speedup (single time / multi-GPU time)")
    _legend(ax)
    return fig


def save(fig, path) -> None:
    """Write a PNG so a reader never sees half of it, and free the figure."""
    import io

    from attnbench.results import write_bytes_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes_atomic(path, buf.getvalue())
    _pyplot().close(fig)
