"""What the report knows of an implementation family comes from its declaration alone: a family
registered from a module of its own, outside attnbench, has its own label, figure panel and
equal-work baseline in a generated report, with nothing under attnbench/report/ naming it."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from attnbench import impls
from attnbench.report.build import render
from attnbench.report.data import load
from attnbench.report.plots import figures

from conftest import typed_row

# A family's declaration, as a module of impls/families/ would hold it: a window of keys on one
# device and over ranks, drawn together, named 'toy:W', the one over ranks compared with the
# one on a device. Its code is never built: the report reads rows only.
FAMILY = """
from attnbench.impls import register
from attnbench.impls.entry import ImplSpec, Lazy, Param

WINDOW = Param("window", 64, "keys each side of a query")


def short_name(config):
    return f"toy:{config['window']}"


for name, ranks in (("toy-window", False), ("toy-window-ring", True)):
    register(
        ImplSpec(
            name=name,
            factory=Lazy("toy_family:build"),
            summary="a window of keys each side of a query",
            params=(WINDOW,),
            distributed=ranks,
            counterpart="toy-window" if ranks else None,
            family="toy windows",
            short_name=short_name,
            shown=("window",),
        )
    )
"""
ENV = {
    "machine": "GPU pair x2",
    "date": "2026-11-26T10:00:00+00:00",
    "commit": "abc",
    "gpus": [{"index": 0}, {"index": 1}],
}


@pytest.fixture
def toy_family(tmp_path, monkeypatch, request):
    """The family registered from its own module; gone from the registry after the test."""
    (tmp_path / "toy_family.py").write_text(FAMILY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_family", raising=False)
    request.addfinalizer(lambda: [impls.BUILT_IN.entries().pop(n, None) for n in ("toy-window", "toy-window-ring")])
    importlib.import_module("toy_family")


def points(impl: str, label: str, n: int, ms: float, world: int = 1, **fields):
    return typed_row(
        impl=impl,
        config={"window": 64} if impl.startswith("toy") else {},
        series=label,
        label=label,
        seq_len=n,
        world_size=world,
        time_ms=ms,
        times_ms=[ms] * 5,
        peak_bytes=1024 * n // world,
        mode="fwd",
        env=ENV,
        **fields,
    )


def rows():
    """The family on one GPU and over two, sdpa beside it."""
    out = [points("toy-window", "toy-window(window=64)", n, n / 1024) for n in (4096, 8192)]
    out.append(points("toy-window-ring", "toy-window-ring(window=64) x2", 8192, 5.0, world=2, strategy="ring"))
    out += [points("sdpa", "sdpa", n, n / 512) for n in (4096, 8192)]
    return out


def write(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "trials.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows()))
    return directory


def test_a_family_registered_from_its_own_module_has_its_label_panel_and_baseline(tmp_path, toy_family):
    results = load(write(tmp_path / "run"))
    md = render(results).text()
    # its label: the short name its declaration gives, the parameter it shows left out
    assert "toy:64" in md and "toy-window(window=64)" not in md
    # its plot series: a panel of its own, its lines there and only there
    drawn = figures.lines(results.rows, lambda r: r.time_ms)
    assert {line.label: line.family for line in drawn} == {
        "toy:64, bf16": "toy windows",
        "toy:64 x2, bf16": "toy windows",
        "sdpa, bf16": figures.OTHERS,
    }
    fig = figures.time_plot(results.rows, ENV["machine"])
    assert sorted(ax.get_title() for ax in fig.axes if ax.get_visible()) == [figures.OTHERS, "toy windows"]
    # its baseline: the ring row against the single-device one its declaration names, equal work
    (ring,) = [line for line in md.splitlines() if line.startswith("| 8,192 (8K) | toy:64 x2 |")]
    assert "equal work: toy-window" in ring
