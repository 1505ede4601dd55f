"""The report's figures as a reader needs them: at most eight series a panel with distinct labels
and the legend inside the figure, the newest code version only, the memory floor of a ring at its
per-GPU value, where a search stopped marked, and speedups on a log scale with anomalies marked."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from attnbench.report.plots import figures as plots
from attnbench.report.tables.multigpu import speedup_cases
from attnbench.results.series import separate_code_versions

from conftest import typed_row

ENV = {"machine": "GPU box", "date": "2026-11-23T10:00:00+00:00", "commit": "aaa"}


@pytest.fixture(autouse=True)
def close_figures():
    """Each test inspects its figures and leaves none open for the next."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def trial(series: str, n: int, **fields):
    base = dict(
        kind="max-seq",
        series=series,
        label=series,
        seq_len=n,
        time_ms=1.0,
        times_ms=[1.0, 1.0],
        peak_bytes=4096 * n,
        floor_bytes=4096 * n,
        tflops_useful=1.0,
        env=ENV,
    )
    return typed_row(**{**base, **fields})


def legends_inside(fig) -> list[int]:
    """Entries of every legend, after checking each lies inside the figure."""
    fig.canvas.draw()
    box = fig.bbox
    counts = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        extent = legend.get_window_extent()
        assert box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1 and box.y0 - 1 <= extent.y0, ax.get_title()
        labels = [t.get_text() for t in legend.get_texts()]
        assert len(set(labels)) == len(labels), labels
        counts.append(len(labels))
    return counts


def test_twelve_series_of_a_family_make_two_panels_of_six_with_distinct_labels():
    rows = [trial(f"dilated{i}", n, impl="dilated", heads=i + 1) for i in range(12) for n in (1024, 2048)]
    fig = plots.memory_plot(rows, "GPU box")
    counts = legends_inside(fig)
    assert counts == [6, 6]


def test_only_the_newest_code_version_is_drawn():
    old = [trial("s", n, env={**ENV, "commit": "old", "date": "2026-01-01"}) for n in (1024, 2048)]
    new = [trial("s", n, env={**ENV, "commit": "new", "date": "2026-02-01"}) for n in (1024, 4096)]
    fig = plots.time_plot(separate_code_versions(old + new), "GPU box")
    (ax,) = [a for a in fig.axes if a.get_legend()]
    drawn = [line for line in ax.get_lines() if line.get_label() and not line.get_label().startswith("_")]
    assert len(drawn) == 1 and list(drawn[0].get_xdata()) == [1024, 4096]


def test_a_ring_floor_is_drawn_at_its_per_gpu_value_and_the_stop_is_marked():
    # a ring row's floor_bytes is already its rank's share: drawn as is, never halved again
    rows = [
        trial("ring", n, impl="ring-dilated", world_size=2, strategy="ring", floor_bytes=2048 * n, peak_bytes=2100 * n)
        for n in (1 << 20, 1 << 21)
    ]
    rows.append(trial("ring", 1 << 22, impl="ring-dilated", world_size=2, strategy="ring", status="oom"))
    rows.append(typed_row(kind="max-seq-result", series="ring", seq_len=1 << 21, impl="ring-dilated", world_size=2))
    fig = plots.memory_plot(rows, "GPU box")
    ax = next(a for a in fig.axes if a.get_legend())
    floor = next(line for line in ax.get_lines() if line.get_linestyle() == "--")
    assert list(floor.get_ydata()) == [2048 * n / 2**30 for n in (1 << 20, 1 << 21)]
    stop = next(line for line in ax.get_lines() if line.get_marker() == plots.STOP_MARKERS["memory"])
    assert list(stop.get_xdata()) == [1 << 22]


def test_every_stop_marker_drawn_is_named_in_the_title_and_no_other():
    """A search interrupted after a failed length (no result row) is marked, and the title says
    what its marker means; a figure with no stop drawn names no marker."""
    rows = [trial("s", n) for n in (1024, 2048)] + [trial("s", 4096, status="oom")]
    fig = plots.memory_plot(rows, "GPU box")
    ax = next(a for a in fig.axes if a.get_legend())
    marks = {line.get_marker() for line in ax.get_lines() if line.get_markersize() == 8}
    title = fig._suptitle.get_text()
    assert marks == {plots.STOP_MARKERS["search interrupted"]} and "o: search interrupted" in title
    assert "X:" not in title
    plain = plots.memory_plot([trial("t", n) for n in (1024, 2048)], "GPU box")
    assert "\n" not in plain._suptitle.get_text()


def speedup_row(strategy: str, ms: float, world: int, seq_len: int = 8192, mode: str = "fwd"):
    return typed_row(
        kind="speedup",
        key=f"{strategy}:{seq_len}:{mode}",
        strategy=strategy,
        world_size=world,
        seq_len=seq_len,
        batch=8,
        mode=mode,
        times_ms=[ms, ms, ms],
        time_ms=ms,
        env=ENV,
    )


def test_speedups_are_on_a_log_scale_and_an_efficiency_above_one_is_hatched():
    rows = [
        speedup_row("single", 100.0, 1),
        speedup_row("dp", 20_000.0, 2),  # 0.005x: visible on a log scale
        speedup_row("single", 100.0, 1, mode="fwd_bwd"),
        speedup_row("mp", 30.0, 2, mode="fwd_bwd"),  # 3.3x on 2 GPUs: efficiency 1.67, an anomaly
    ]
    fig = plots.speedup_plot(speedup_cases(rows), "GPU box")
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    bars = [p for p in ax.patches if p.get_height() != 0]
    tops = sorted(round(p.get_y() + p.get_height(), 4) for p in bars)
    assert tops == [0.005, round(100 / 30, 4)]  # each bar ends at its speedup, from 1
    hatched = [p for p in bars if p.get_hatch()]
    assert len(hatched) == 1 and round(hatched[0].get_y() + hatched[0].get_height(), 4) == round(100 / 30, 4)
    assert legends_inside(fig) == [2]


def test_a_legend_names_grouped_key_value_heads():
    """32 query heads over 8 key/value heads is another shape than 32 heads: the legend says
    `H32/8` as the answer table does; the seeds' shape stays unsaid."""
    from attnbench.report.plots.figures import _label

    grouped = typed_row("points", label="sdpa", heads=32, kv_heads=8, head_dim=128, causal=True)
    assert "H32/8 D128 causal" in _label(grouped)
    assert "H8" not in _label(typed_row("points", label="sdpa", kv_heads=8))  # H8 over H8: ungrouped, the default


def test_a_report_holds_its_figures_as_png_bytes_with_none_left_open(tmp_path):
    """A report of many figures draws each, keeps its PNG and frees it: none stays open."""
    import json

    import matplotlib.pyplot as plt

    from attnbench.report.build import render
    from attnbench.report.data import load

    rows = [trial("dilated", n) for n in (1024, 2048, 4096)]
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    plt.close("all")
    doc = render(load(tmp_path))
    assert doc.figures and all(data.startswith(b"\x89PNG") for _, data in doc.figures)
    assert plt.get_fignums() == []


def test_figures_drawn_by_workers_are_the_bytes_drawn_here_with_the_same_missing_glyphs():
    """A report of many figures draws them in worker processes: each PNG byte for byte the one
    this process draws, the characters its font lacks reported as here, none left open."""
    import matplotlib.pyplot as plt

    from attnbench.report.plots.drawing import Drawing

    def figures():  # a figure with a label the font has no glyph for, and one without
        rows = [trial("dilated 注意", n) for n in (1024, 2048, 4096)]
        return [plots.memory_plot(rows, "GPU box"), plots.time_plot([trial("sdpa", 1024)], "GPU box")]

    here = Drawing()
    assert here.workers == 0
    drawn_here = [here.png(fig) for fig in figures()]
    workers = Drawing()
    workers.workers = 2  # whatever this machine's cores
    promised = [(name, workers.png(fig)) for name, fig in zip(("memory.png", "time.png"), figures())]
    assert plt.get_fignums() == []  # each closed here as it was handed over
    workers.finish(promised)
    assert [data for _, data in promised] == drawn_here
    assert workers.missing_glyphs == here.missing_glyphs == {"注", "意"}
    assert workers._pool is None  # the workers are let go


def test_a_report_stopped_while_workers_draw_ends_them_without_drawing_the_rest():
    """An error, an interrupt or a SIGTERM in the report lets no worker draw on: each is ended."""
    import multiprocessing

    from attnbench.report.plots.drawing import Drawing

    drawing = Drawing()
    drawing.workers = 2
    for i in range(6):
        drawing.png(plots.time_plot([trial(f"s{i}", 1024)], "GPU box"))
    assert multiprocessing.active_children()
    drawing.close()
    assert multiprocessing.active_children() == [] and drawing._pool is None


def test_a_cpus_throughput_axis_reads_in_gflops_as_the_terminal_does():
    """Rates under one TFLOP/s (0.0153 TFLOP/s = 15.3 GFLOP/s) are drawn in GFLOP/s, the unit
    the terminal prints them in; a GPU's 312 TFLOP/s stays in TFLOP/s."""
    cpu = [trial("s", n, device="cpu", tflops_useful=t) for n, t in ((1024, 0.0153), (2048, 0.0201))]
    ax = next(a for a in plots.tflops_plot(cpu, "cpu").axes if a.get_legend())
    assert ax.get_ylabel() == "GFLOP/s (useful)" and "GFLOP/s" in ax.figure.get_suptitle()
    drawn = next(line for line in ax.get_lines() if not line.get_label().startswith("_"))
    assert [round(y, 6) for y in drawn.get_ydata()] == [15.3, 20.1]
    gpu = [trial("s", n, tflops_useful=t) for n, t in ((1024, 0.5), (2048, 312.0))]
    ax = next(a for a in plots.tflops_plot(gpu, "GPU box").axes if a.get_legend())
    assert ax.get_ylabel() == "TFLOP/s (useful)" and list(ax.get_lines()[0].get_ydata()) == [0.5, 312.0]


def test_the_answer_figure_has_a_legend_entry_only_for_modes_it_draws():
    """Forward searches alone: one legend entry, forward; a training search adds its own."""
    from types import SimpleNamespace

    def search(n):
        summary = SimpleNamespace(max_seq_len=n, first_failure=2 * n, stopped_by="memory", complete=True)
        return SimpleNamespace(summary=summary, limit=None)

    def config(training):
        return SimpleNamespace(label="sdpa", settings="fp32", forward=search(4096), training=training)

    def legend(configs):
        return [t.get_text() for t in plots.answer_plot([("cpu", configs)]).axes[0].get_legend().get_texts()]

    assert legend([config(None)]) == ["forward"]
    assert legend([config(None), config(search(1024))]) == ["forward", "training (forward + backward)"]
