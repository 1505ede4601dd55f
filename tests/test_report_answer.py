"""The report answers first and regenerates byte for byte: the answer table of every machine on
the first screen (the committed report included), text from rows escaped so it cannot write a
heading, an unfinished search shown as a lower bound, a section added by one module, and two
runs of `attnbench report` on committed rows giving the same bytes but for the one line that
says when."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from attnbench.errors import AttnbenchError
from attnbench.report.build import render
from attnbench.report.data import load
from attnbench.report.tables.sweep import max_seq_summary
from attnbench.results import load_rows

from conftest import ROOT, run_cli, typed_row

ENV = {"machine": "GPU box", "date": "2026-11-23T10:00:00+00:00", "commit": "abc", "gpus": [{"index": 0}]}
REPORT = ROOT / "results" / "report" / "report.md"


def write_rows(directory: Path, rows) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "trials.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    return directory


def search(label: str, lengths_ok: list[int], failed: int | None, finished: bool = True, series: str = "s"):
    """A max-seq search of ``label`` (a 4 KB-a-token workload) as the runner writes it."""
    rows = [
        typed_row(
            kind="max-seq",
            series=series,
            label=label,
            seq_len=n,
            peak_bytes=4096 * n,
            floor_bytes=4096 * n,
            peak_over_floor=1.0,
            time_ms=1.0,
            times_ms=[1.0, 1.0, 1.0],
            env=ENV,
        )
        for n in lengths_ok
    ]
    if failed:
        rows.append(
            typed_row(kind="max-seq", series=series, label=label, seq_len=failed, status="oom", message="oom", env=ENV)
        )
    if finished:
        rows.append(typed_row(kind="max-seq-result", series=series, label=label, seq_len=max(lengths_ok), env=ENV))
    return rows


def test_text_from_rows_never_writes_a_heading_or_a_table_row(tmp_path):
    evil = "evil\n# injected heading\n| a | b |"
    doc = render(load(write_rows(tmp_path / "run", search(evil, [1024, 2048], 4096))))
    for text in (doc.text(), *doc.files.values()):
        lines = text.splitlines()
        assert "# injected heading" not in lines and not any(line.startswith("| a | b |") for line in lines)
    assert "evil # injected heading \\| a \\| b \\|" in doc.text()  # in one cell, pipes escaped


def test_an_unfinished_search_is_a_lower_bound(tmp_path):
    rows = search("dilated", [1024, 2048], None, finished=False)
    md = render(load(write_rows(tmp_path / "run", rows))).text()
    answer = md.split("## The answer")[1].split("\n## ")[0]
    assert "| dilated | bf16 H8 D64 | ≥ 2K | search interrupted |" in answer


def test_a_length_whose_confirmation_failed_is_not_the_answer(tmp_path):
    """The search ran 2K once, failed to confirm it in a fresh process and settled on 1K: the
    answer, the stop and the peak are the result row's, not the largest length that once ran."""
    rows = search("sdpa", [1024, 2048], 4096)
    rows[-1] = typed_row(kind="max-seq-result", series="s", label="sdpa", seq_len=1024, env=ENV)
    failed_confirm = typed_row(kind="max-seq", series="s", label="sdpa", seq_len=2048, status="oom", env=ENV)
    rows.insert(-1, failed_confirm)
    (summary,) = max_seq_summary(rows)
    assert (summary.max_seq_len, summary.first_failure, summary.peak_bytes) == (1024, 2048, 4096 * 1024)
    md = render(load(write_rows(tmp_path / "run", rows))).text()
    answer = md.split("## The answer")[1].split("\n## ")[0]
    assert "| sdpa | bf16 H8 D64 | 1K – 2K (2K ran once, then failed) | memory |" in answer


def test_the_answer_names_each_machine_and_its_device(tmp_path):
    gpu = search("dilated", [1024, 2048], 4096)
    cpu_env = {"machine": "cpu: Some CPU", "date": "2026-11-23T10:00:00+00:00", "cpu_count": 2}
    cpu = [typed_row(**{**r.to_json(), "device": "cpu", "env": cpu_env}) for r in search("naive", [256], 512)]
    write_rows(tmp_path / "a", gpu)
    write_rows(tmp_path / "b", cpu)
    first = render(load(tmp_path)).text().splitlines()[:40]
    assert "### GPU box (one GPU)" in first and "### cpu: Some CPU (2 cores, no GPU)" in first
    assert sum(line.startswith("| Configuration |") for line in first) == 2


def test_a_machines_answer_shows_only_the_columns_its_rows_fill(tmp_path):
    """The GPU's search timed 64K and the CPU's never reached it: the CPU's table has no
    TFLOP/s column of dashes; neither machine ran a training search."""
    gpu = search("dilated", [1024, 65536], 131072)
    gpu[1] = typed_row(**{**gpu[1].to_json(), "tflops_useful": 300.0})
    cpu_env = {"machine": "cpu: Some CPU", "date": "2026-11-23T10:00:00+00:00", "cpu_count": 2}
    cpu = [typed_row(**{**r.to_json(), "device": "cpu", "env": cpu_env}) for r in search("naive", [256], 512)]
    write_rows(tmp_path / "a", gpu)
    write_rows(tmp_path / "b", cpu)
    text = render(load(tmp_path)).text()
    headers = [line for line in text.splitlines()[:40] if line.startswith("| Configuration")]
    # no row measures a seed's workload: the seeds' pages are left out
    assert "## Against the seeds" not in text and "seeds.md" not in text
    common = "| Configuration | Settings | Longest forward | Stopped by | Per token | Peak/floor |"
    # the CPU's speed is the time of its one row at its longest length, 256
    assert headers == [f"{common} Fwd TFLOP/s at 64K |", f"{common} Fwd time at 256 |"], headers


def test_the_committed_report_answers_every_machine_on_its_first_screen():
    rows, _ = load_rows(ROOT / "results")
    machines = {r.env.machine for r in rows if r.env and r.kind == "max-seq"}
    lines = REPORT.read_text().splitlines()
    headings = {re.sub(r" \([^)]*\)$", "", line[4:]) for line in lines[:40] if line.startswith("### ")}
    assert machines <= headings, machines - headings
    assert all(len(line) <= 200 for line in lines[:60])
    assert (REPORT.parent / "seeds.md").exists() and "[seeds.md](seeds.md)" in "\n".join(lines[:60])


def test_a_section_is_one_registered_module(tmp_path, monkeypatch, request):
    from attnbench.report import sections as package
    from attnbench.report.document import Machine

    (tmp_path / "zz_models.py").write_text(
        "from attnbench.report.sections import Section, register\n\n"
        "def render(doc, machine):\n"
        '    doc.add(f"{len(machine.rows)} rows seen\\n")\n\n'
        'register(Section(35, "Models: one line per model", render))\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "zz_models", raising=False)
    request.addfinalizer(lambda: package.SECTIONS.entries().pop("Models: one line per model", None))
    importlib.import_module("zz_models")
    found = package.sections()
    orders = [s.order for s in found]
    assert orders == sorted(orders) and "Models: one line per model" in [s.title for s in found]
    before = [s.title for s in found if s.order < 35]
    assert before == [
        "How long: every max-seq search",
        "How fast: fixed-length measurements",
        "Training: forward plus backward",
    ]
    doc = render(load(write_rows(tmp_path / "run", search("dilated", [1024], 2048))))
    assert "## Models: one line per model\n\n### GPU box\n3 rows seen" in doc.text()
    assert isinstance(Machine("m", []).rows, list)


@pytest.mark.slow
def test_the_report_regenerates_byte_for_byte_but_its_timestamp(tmp_path):
    """Committed rows of a CPU, one and two GPUs (searches, points, speedups, rings, seed
    verdicts), reported twice in fresh processes with different hash seeds."""
    tree = tmp_path / "results"
    shutil.copytree(ROOT / "tests" / "fixtures" / "results" / "cpu-tiny", tree / "cpu-tiny")
    for run in ("2026-11-22-h200x2-speedup", "2026-11-22-h200x2-ring-max-seq", "2026-11-25-cpu-seeds"):
        (tree / run).mkdir()
        shutil.copy(ROOT / "results" / run / "trials.jsonl", tree / run / "trials.jsonl")
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"report-{seed}"
        done = run_cli("report", tree, "--out", out, env={"PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        outs.append(out)
    files = [sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) for out in outs]
    assert files[0] == files[1] and len(files[0]) > 20
    for name in files[0]:
        a, b = ((out / name).read_bytes() for out in outs)
        if name.name == "report.md":
            a, b = (re.sub(rb"\nGenerated [^\n]*\n", b"\n", x, count=1) for x in (a, b))
        assert a == b, name
        if name.suffix in (".md", ".csv"):
            assert not re.search(rb"(?<![\w.])-0\.0+(?![\d.])", a), name  # no negative zero


def test_the_first_screen_deals_rows_to_every_machine_and_names_each_implementation_first():
    """Eight rows for three machines: the small machine shows all it has, the others take turns;
    a machine cut short spends a row saying so, and shows each implementation before a second
    configuration of one."""
    from types import SimpleNamespace

    from attnbench.report.answer import first_screen

    def config(impl):
        return SimpleNamespace(head=SimpleNamespace(impl=impl), impl=impl)

    big = [config(i) for i in ("dilated", "dilated", "dilated", "sdpa", "naive")]
    other = [config(i) for i in ("sdpa", "sdpa", "sdpa", "sdpa")]
    small = [config("ring")]
    shown = first_screen([big, other, small], 8)
    assert [len(s) for s in shown] == [3, 2, 1]  # 6 rows and a "more" line for each machine cut short: 8
    assert [c.impl for c in shown[0]] == ["dilated", "sdpa", "naive"]  # every implementation, in table order
    assert first_screen([big, small], 20) == [big, small]  # room for all: nothing is cut
    assert [len(s) for s in first_screen([big, other, small], 0)] == [1, 1, 1]  # no room: a row each still


def test_a_forward_and_a_training_search_of_one_label_are_told_apart():
    """The summary of searches (sweep.md, the console, max_seq.csv) names the mode: a forward
    and a training search of one configuration share their label."""
    import dataclasses

    from attnbench.report.tables.sweep import summary_table

    forward = search("sdpa", [1024, 2048], 4096, series="f")
    training = [dataclasses.replace(r, mode="fwd_bwd") for r in search("sdpa", [1024], 2048, series="t")]
    summary = max_seq_summary(forward + training)
    assert sorted((s.mode, s.max_seq_len) for s in summary) == [("fwd", 2048), ("fwd_bwd", 1024)]
    lines = summary_table(summary).splitlines()
    assert "Mode" in lines[0] and any("| sdpa | bf16 | fwd_bwd |" in line for line in lines)


PAIR_ENV = {
    "machine": "GPU pair x2",
    "date": "2026-11-26T10:00:00+00:00",
    "commit": "abc",
    "gpus": [{"index": 0}, {"index": 1}],
}


def data_parallel_rows() -> list:
    """sdpa on one GPU at w ms per call (its work) and each strategy on a line of its own: DataParallel
    2 ms + w / 2, one process per GPU 0.1 ms + w / 2, a new thread on one GPU 1 ms + w."""
    from attnbench.sweeps.kinds.speedup.runner import trial_key

    lines = {"single": (0.0, 1.0, 1), "dp": (2.0, 0.5, 2), "mp": (0.1, 0.5, 2), "thread": (1.0, 1.0, 1)}
    rows = []
    for n, work in ((2048, 0.5), (8192, 4.0), (32768, 60.0)):
        for strategy, (fixed, per, world) in lines.items():
            ms = fixed + per * work
            fields = dict(
                strategy=strategy, world_size=world, seq_len=n, batch=2, impl="sdpa", config={"backend": "flash"}
            )
            rows.append(
                typed_row(
                    "speedup",
                    key=trial_key(fields),
                    case=f"{n}x2",
                    time_ms=ms,
                    times_ms=[ms] * 5,
                    backend="flash" if strategy == "single" else None,
                    env=PAIR_ENV,
                    **fields,
                )  # fmt: skip
            )
    return rows


def test_a_machine_of_two_gpus_answers_whether_a_second_gpu_helps(tmp_path):
    """The first screen of a two-GPU machine: per kernel, DataParallel's and one process per GPU's
    fixed cost per call (from the line through their times: 2 ms and 0.1 ms here), their speedup
    at the largest case, and what a new thread alone costs (1 ms)."""
    md = render(load(write_rows(tmp_path / "pair", data_parallel_rows()))).text()
    first = md.split("\n## ")[1]  # the answer, the report's first section (no seed page: no seed rows)
    assert first.startswith("The answer") and "#### Does adding GPUs help?" in first
    (row,) = [line for line in first.splitlines() if line.startswith("| GPU pair x2 | sdpa (flash) |")]
    cells = [c.strip() for c in row.strip("|").split("|")][1:]  # after the Machine column
    assert cells[1].startswith("2 ms") and cells[3].startswith("1 ms") and cells[4].startswith("0.1 ms")
    assert cells[2].startswith("1.88") and cells[2].endswith("at 32768x2")  # 60 / (2 + 30)
    assert all(len(line) <= 200 for line in first.splitlines())
    # the section says where DataParallel's fixed cost comes from, with the thread rows beside it
    assert "- sdpa (flash): DataParallel 2 ms" in md and "a new thread alone 1 ms" in md


def test_a_superseded_run_stays_out_of_every_answer_and_is_listed(tmp_path):
    old = [typed_row(**{**r.to_json(), "run": "old"}) for r in search("dilated", [1024, 2048], 4096, series="o")]
    new = search("sdpa", [1024], 2048)
    write_rows(tmp_path / "old", old)
    write_rows(tmp_path / "new", new)
    (tmp_path / "superseded.toml").write_text('[[run]]\nrun = "old"\nby = "r"\nwhy = "measured by replaced code"\n')
    md = render(load(tmp_path)).text()
    body, appendix = md.split("## Superseded runs (appendix)")
    assert "| dilated |" not in body and "| sdpa |" in body
    assert "| old | GPU box | 4 | r | measured by replaced code |" in appendix
    (tmp_path / "superseded.toml").write_text('[[run]]\nrun = "old"\n')
    with pytest.raises(AttnbenchError, match="must hold exactly run, by and why"):
        load(tmp_path)


def test_where_64k_does_not_answer_how_fast_each_row_is_timed_at_the_longest_length_all_ran(tmp_path):
    """Three searches ran 1K and 2K; only one ran 4K and one 8K: each row's speed is its own
    2K trial's time, named in the column's header."""
    rows = []
    for impl, lengths, call_ms in (
        ("naive", [1024, 2048, 4096], 3.0),
        ("sdpa", [1024, 2048], 5.0),
        ("flex", [1024, 2048, 8192], 7.0),
    ):
        for r in search(impl, lengths, 2 * max(lengths), series=impl):
            times = [call_ms] * 3 if r.kind == "max-seq" and r.seq_len == 2048 else [1.0] * 3
            timed = {"time_ms": times[0], "times_ms": times} if r.kind == "max-seq" else {}
            rows.append(typed_row(**{**r.to_json(), "impl": impl, "config": {}, **timed}))
    md = render(load(write_rows(tmp_path / "run", rows))).text()
    answer = md.split("## The answer")[1].split("\n## ")[0]
    (header,) = [line for line in answer.splitlines() if line.startswith("| Configuration")]
    assert header.endswith("| Fwd time at 2K |")
    cells = [
        line.strip("| ").split(" | ") for line in answer.splitlines() if line.startswith("| ") and "---" not in line
    ]
    assert {c[0]: c[-1] for c in cells[1:]} == {
        "flex": "7 ms ±0 (n=3)",
        "naive": "3 ms ±0 (n=3)",
        "sdpa": "5 ms ±0 (n=3)",
    }


def test_a_search_its_time_budget_stopped_is_a_lower_bound_for_the_report_and_the_check(tmp_path):
    from attnbench.check.loading import searches
    from attnbench.results.schema import MaxSeqResult, Trial

    rows = search("dilated", [1024, 2048], None)
    rows[-1] = typed_row(
        kind="max-seq-result", series="s", label="dilated", seq_len=2048, stop_status="budget", env=ENV
    )
    md = render(load(write_rows(tmp_path / "run", rows))).text()
    answer = md.split("## The answer")[1].split("\n## ")[0]
    assert "| dilated | bf16 H8 D64 | ≥ 2K | search time budget |" in answer
    trials = [r for r in rows if isinstance(r, Trial)]
    results = [r for r in rows if isinstance(r, MaxSeqResult)]
    assert [s.complete for s in searches(trials, results).values()] == [False]


def test_where_searches_started_apart_the_speed_is_at_the_length_most_rows_ran(tmp_path):
    rows = []
    for impl, lengths in (("naive", [1024, 2048]), ("sdpa", [1024, 2048, 4096]), ("flex", [16384, 32768])):
        for r in search(impl, lengths, 2 * max(lengths), series=impl):
            rows.append(typed_row(**{**r.to_json(), "impl": impl, "config": {}}))
    answer = render(load(write_rows(tmp_path / "run", rows))).text().split("## The answer")[1].split("\n## ")[0]
    cells = [
        line.strip("| ").split(" | ") for line in answer.splitlines() if line.startswith("| ") and "---" not in line
    ]
    assert cells[0][-1] == "Fwd time at 2K"
    assert {c[0]: c[-1] for c in cells[1:]} == {"flex": "-", "naive": "1 ms ±0 (n=3)", "sdpa": "1 ms ±0 (n=3)"}


def test_a_case_measured_by_two_runs_names_each_rows_run(tmp_path):
    """The same case measured again by a later run is a row of its own, and the table says whose;
    a table of one run has no Run column."""
    again = [typed_row(**{**r.to_json(), "run": "later"}) for r in data_parallel_rows()]
    write_rows(tmp_path / "one", data_parallel_rows())
    alone = render(load(tmp_path)).text()
    write_rows(tmp_path / "two", again)
    both = render(load(tmp_path)).text()
    assert "| Run |" not in _first_table(alone, "#### DataParallel:")[0]
    header, *rows = _first_table(both, "#### DataParallel:")
    assert "| Run |" in header
    assert [r.split(" | ")[2] for r in rows] == ["r", "later"] * 3  # by length, each run's row


def _first_table(md: str, heading: str) -> list[str]:
    """The header and body lines of the first table under ``heading``."""
    lines = md.split(heading)[1].split("\n")[1:]
    table = lines[: next(i for i, line in enumerate(lines) if not line.startswith("|"))]
    return [table[0], *table[2:]]


def test_the_gpu_curve_gives_each_count_its_time_efficiency_and_memory_at_one_length():
    """ring on 1, 2 and 4 GPUs beside sdpa on one: at the longest length all three counts ran
    (16K: 8K ran on 1 and 2 only), each count's efficiency is sdpa's time over the ring's over
    the count (4 ms / (2.5 ms x 2) = 0.8, 4 / (1.25 x 4) = 0.8), and its rank's peak over the
    shard's floor; its longest sequence from its searches."""
    from attnbench.report.tables.second_gpu import curve, sequence_parallel

    env = {"machine": "GPU quad x4", "gpus": [{"name": "GPU quad"}] * 4}
    rows = [typed_row(impl="sdpa", seq_len=n, time_ms=ms, times_ms=[ms] * 5, env=env, series="sd", label="sdpa")
            for n, ms in ((8192, 1.0), (16384, 4.0))]  # fmt: skip
    for world, lengths in ((1, (8192, 16384)), (2, (8192, 16384)), (4, (16384,))):
        for n in lengths:
            ms = 4.0 * n / 16384 / world * (1 if world == 1 else 1.25)
            rows.append(
                typed_row(
                    impl="ring",
                    strategy="ring",
                    world_size=world,
                    seq_len=n,
                    time_ms=ms,
                    times_ms=[ms] * 5,
                    floor_bytes=1000,
                    peak_bytes=1500,
                    env=env,
                    series=f"r{world}",
                    label=f"ring x{world}",
                )
            )
        rows += search("ring", [1 << (20 + world)], 1 << (21 + world), series=f"m{world}")
        rows[-3:] = [typed_row(**{**r.to_json(), "impl": "ring", "world_size": world, "env": env}) for r in rows[-3:]]
    points = [p for p in curve(rows) if p.impl == "ring"]
    assert [(p.gpus, p.at) for p in points] == [(1, 16384), (2, 16384), (4, 16384)]
    assert [round(p.pair.efficiency, 3) for p in points] == [1.0, 0.8, 0.8]
    assert [p.longest for p in points] == ["2M", "4M", "16M"]
    table = sequence_parallel(rows, 4).markdown()
    assert "| ring | 4 | 16M | 16K |" in table and "1.50x" in table


def test_the_gpu_curve_takes_the_newest_code_where_a_point_was_measured_twice():
    """The same ring point and searches measured by an older and a newer commit: the curve shows
    the newer (the older is superseded, whichever file the reader met last): its time, its
    finished search's longest sequence, not the older one's unfinished '≥', and sdpa's newer
    one-GPU search as the first point."""
    from attnbench.report.tables.second_gpu import curve
    from attnbench.results.series import separate_code_versions

    def env(commit, date):
        return {"machine": "GPU pair x2", "gpus": [{"name": "GPU pair"}] * 2, "commit": commit, "date": date}

    rows = []
    for commit, date, ring_ms in (("bbbbbbb", "2026-11-28T12:00:00", 2.5), ("aaaaaaa", "2026-11-27T12:00:00", 5.0)):
        e = env(commit, date)
        rows.append(
            typed_row(impl="sdpa", seq_len=16384, time_ms=4.0, times_ms=[4.0] * 5, env=e, series="sd", label="sdpa")
        )
        rows.append(typed_row(impl="ring", strategy="ring", world_size=2, seq_len=16384, time_ms=ring_ms,
                              times_ms=[ring_ms] * 5, env=e, series="r2", label="ring x2"))  # fmt: skip
        newer = commit == "bbbbbbb"
        found = search("ring x2", [1 << 20, 1 << 21] if newer else [1 << 20], 1 << 22, finished=newer, series="m2")
        rows += [typed_row(**{**r.to_json(), "impl": "ring", "world_size": 2, "env": e}) for r in found]
        found = search("sdpa", [1 << (19 if newer else 22)], 1 << 23, series="m1")
        rows += [typed_row(**{**r.to_json(), "impl": "sdpa", "env": e}) for r in found]
    points = [p for p in curve(separate_code_versions(rows)) if p.impl == "ring"]
    assert [(p.gpus, p.longest) for p in points] == [(1, "512K (sdpa)"), (2, "2M")]
    assert [(p.pair.row.time_ms, round(p.pair.efficiency, 3)) for p in points if p.gpus == 2] == [(2.5, 0.8)]


def test_the_gpu_curve_starts_at_the_counterparts_one_gpu_search_where_the_ring_has_none():
    """ring searched on 2 GPUs under an 8 GiB limit, sdpa on one under the same limit and on
    the whole GPU: one GPU's point is sdpa's search under the ring's limit, both named; 2 GPUs
    the ring's own."""
    from attnbench.report.tables.second_gpu import curve

    env = {"machine": "GPU pair x2", "gpus": [{"name": "GPU pair"}] * 2}
    rows = []
    for impl, world, ok, limit in (
        ("sdpa", 1, [1 << 20], 8 << 30),
        ("sdpa", 1, [1 << 24], None),
        ("ring", 2, [1 << 21], 8 << 30),
    ):
        found = search(impl, ok, 2 * ok[-1], series=f"{impl}{limit}")
        rows += [typed_row(**{**r.to_json(), "impl": impl, "world_size": world, "env": env, "memory_limit": limit})
                 for r in found]  # fmt: skip
    assert {p.gpus: p.longest for p in curve(rows) if p.impl == "ring"} == {
        1: "1M (sdpa, 8 GiB limit)",
        2: "2M (8 GiB limit)",
    }


def test_a_stop_names_one_cause_and_a_length_that_ran_once_then_failed_is_not_the_answer(tmp_path):
    """Stopped by time under a memory limit says the call's time limit, not the memory limit;
    by memory, the memory limit; 2K ran once and failed its confirmation by time: the answer
    is 1K – 2K and says that 2K ran once."""

    def step(n, status="ok", series="t", **more):
        timed = {"time_ms": 1.0, "times_ms": [1.0] * 3, "peak_bytes": 4096 * n} if status == "ok" else {}
        return typed_row(kind="max-seq", series=series, label=series, seq_len=n, status=status, message=status,
                         memory_limit=512 << 20, max_trial_seconds=2.0, env=ENV, **timed, **more)  # fmt: skip

    def result(best, failure, status, series, **more):
        return typed_row(kind="max-seq-result", series=series, label=series, seq_len=best, first_failure=failure,
                         stop_status=status, memory_limit=512 << 20, env=ENV, **more)  # fmt: skip

    rows = [step(1024), step(2048), step(4096, "time-limit"), step(2048, "time-limit")]
    rows += [result(1024, 2048, "time-limit", "t")]
    sdpa = {"series": "m", "impl": "sdpa"}
    rows += [step(1024, **sdpa), step(2048, "oom", **sdpa), result(1024, 2048, "oom", **sdpa)]
    md = render(load(write_rows(tmp_path / "run", rows))).text()
    answer = md.split("## The answer")[1].split("\n## ")[0]
    assert "| t | bf16 H8 D64 | 1K – 2K (2K ran once, then failed) | time (2 s a call) |" in answer
    assert "| m | bf16 H8 D64 | 1K – 2K | memory (512 MiB limit) |" in answer


def test_an_unconfirmed_answer_and_a_bracket_wider_than_promised_are_marked(tmp_path):
    """8K ran, 9K failed, the search promised 1% (at least its 256-token resolution): a 1K
    bracket is 12% of 8K and says so; the answer never ran again in a fresh process."""
    rows = search("sdpa", [8192], 9216)
    rows[-1] = typed_row(kind="max-seq-result", series="s", label="sdpa", seq_len=8192, first_failure=9216,
                         stop_status="oom", confirmed=False, resolution=256, granularity=128, env=ENV)  # fmt: skip
    md = render(load(write_rows(tmp_path / "run", rows))).text()
    answer = md.split("## The answer")[1].split("\n## ")[0]
    assert "| sdpa | bf16 H8 D64 | 8K – 9K (not confirmed; bracket 12% wide) | memory |" in answer
    rows[-1] = typed_row(kind="max-seq-result", series="s", label="sdpa", seq_len=8192, first_failure=9216,
                         stop_status="oom", confirmed=True, resolution=1024, env=ENV)  # fmt: skip
    md = render(load(write_rows(tmp_path / "again", rows))).text()
    assert "| sdpa | bf16 H8 D64 | 8K – 9K | memory |" in md


# --- the user's own implementations lead ----------------------------------------------------------

OWN = {
    "import_path": "mypkg.attn:window",
    "package": "mypkg",
    "version": "1.2.3",
    "source_sha256": "0123456789abcdef",
    "memory_order": 1,
}


def own_search(verified: bool):
    """A plugin's search as the runner writes it: its provenance, how its pairs were obtained."""
    rows = []
    for r in search("mypkg.attn:window(window=64)", [1024, 2048], 4096, series="own"):
        fields = r.to_json() | {"impl": "mypkg.attn:window", "verified": verified, "impl_source": OWN}
        if r.kind == "max-seq" and r.status == "ok":
            why = "counting the pairs was stopped (killed in phase counting after 602 s (limit 602 s))"
            fields |= {"pairs_counted": "unknown", "flops_unknown": why} if r.seq_len == 2048 else {}
            fields |= {"pairs_counted": "blocks", "pairs_useful": 129 * r.seq_len} if r.seq_len == 1024 else {}
        rows.append(typed_row(**fields))
    return rows


def test_a_report_of_your_own_implementation_leads_with_it_and_marks_it_unverified(tmp_path):
    rows = search("sdpa", [1024, 2048, 4096], 8192) + own_search(verified=False)
    md = render(load(write_rows(tmp_path / "run", rows))).text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    # the answer first, its own rows leading; then where they came from
    assert sections[0].startswith("## The answer") and sections[1] == "## Your implementations"
    own = md.split("## Your implementations")[1].split("\n## ")[0]
    row = next(line for line in own.splitlines() if line.startswith("| [unverified] mypkg.attn:window"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:] == [
        "GPU box",
        "mypkg 1.2.3",
        "mypkg.attn:window",
        "0123456789abcdef",
        "counted by tiles, unknown",
        "no",
        "2,048 (2K)",
    ]
    assert "- [unverified] mypkg.attn:window(window=64) at 2,048 (2K): counting the pairs was stopped" in own
    answer = md.split("## The answer")[1].split("\n## ")[0]
    first = next(line for line in answer.splitlines() if line.startswith("| ") and "Configuration" not in line)
    assert first.startswith("| [unverified] mypkg.attn:window")  # first, ahead of a longer sdpa
    how_long = md.split("## How long")[1].split("\n## ")[0]
    assert "[unverified] mypkg.attn:window" in how_long and "[unverified] sdpa" not in md


def test_a_verified_plugin_is_not_marked_and_a_report_without_one_has_no_such_section(tmp_path):
    md = render(load(write_rows(tmp_path / "a", own_search(verified=True)))).text()
    assert "[unverified]" not in md and "| yes |" in md.split("## Your implementations")[1].split("\n## ")[0]
    plain = render(load(write_rows(tmp_path / "b", search("sdpa", [1024], 2048)))).text()
    assert "## Your implementations" not in plain


def test_a_bench_only_report_answers_with_speed_and_memory_at_the_length_every_row_ran(tmp_path):
    """sdpa timed at 1K, 2K and 4K, naive at 1K and 2K, no search: the answer gives each one's
    time at 2K (the longest both ran: 3 ms and 8 ms, the rows' medians), its peak per token and
    over its floor there, says that no search ran, and draws no longest-sequence figure."""

    def point(impl, n, ms, peak):
        return typed_row(kind="points", series=impl, label=impl, impl=impl, seq_len=n, time_ms=ms, times_ms=[ms] * 5,
                         peak_bytes=peak, floor_bytes=n * 1024, peak_over_floor=peak / (n * 1024), env=ENV)  # fmt: skip

    rows = [point("sdpa", n, ms, 2048 * n) for n, ms in ((1024, 1.0), (2048, 3.0), (4096, 9.0))]
    rows += [point("naive", n, ms, 8192 * n) for n, ms in ((1024, 2.0), (2048, 8.0))]
    md = render(load(write_rows(tmp_path / "bench", rows))).text()
    answer = md.split("## The answer")[1].split("\n## ")[0]
    assert "| Configuration | Settings | Longest forward | Per token | Peak/floor | Fwd time at 2K |" in answer
    assert "| sdpa | bf16 H8 D64 | - | 2.00 KiB | 2.00x | 3 ms ±0 (n=5) |" in answer
    assert "| naive | bf16 H8 D64 | - | 8.00 KiB | 8.00x | 8 ms ±0 (n=5) |" in answer
    assert "### GPU box (one GPU; no max-seq search: speed and memory at one length)" in answer
    assert "answer.png" not in md


def test_the_batch_tables_columns_are_the_strategies_declared_for_it(monkeypatch):
    """The first screen's table of a second GPU for a batch shows each strategy that declares a
    batch column, where it declares it: a new strategy joins it by its declaration alone, and one
    that declares none leaves it."""
    from dataclasses import replace

    from attnbench.plan import strategies
    from attnbench.report.tables.multigpu import speedup_cases
    from attnbench.report.tables.second_gpu import data_parallel

    rows, _ = load_rows(ROOT / "results" / "2026-11-27-h100x2-multi-gpu")
    cases = speedup_cases(rows)
    as_shipped = data_parallel(cases)
    assert as_shipped.headers == [
        "Kernel",
        "DataParallel: fixed cost per call",
        "speedup at largest case",
        "New thread alone",
        "Multi-process: fixed cost per call",
        "speedup at largest case ",
    ]
    # multi-process leaves the table; the new thread is declared first, with a speedup of its own
    declared = tuple(
        replace(d, batch_column=None)
        if d.name == "mp"
        else replace(d, batch_column=strategies.BatchColumn(-1, "Thread: fixed cost"))
        if d.name == "thread"
        else d
        for d in strategies.DECLARED
    )
    monkeypatch.setattr(strategies, "DECLARED", declared)
    table = data_parallel(cases)
    assert table.headers == [
        "Kernel",
        "Thread: fixed cost",
        "speedup at largest case",
        "DataParallel: fixed cost per call",
        "speedup at largest case ",
    ]
    # the cells under a heading are that strategy's, whatever its place
    kernel_rows = {r["Kernel"]: r for r in as_shipped.records}
    assert table.records and len(table.records) == len(as_shipped.records)
    for r in table.records:
        assert r["Thread: fixed cost"] == kernel_rows[r["Kernel"]]["New thread alone"]
        assert r["DataParallel: fixed cost per call"] == kernel_rows[r["Kernel"]]["DataParallel: fixed cost per call"]


def test_a_gpu_curve_without_an_equal_work_baseline_says_what_would_time_one(tmp_path):
    """ring searched on 1 and 2 GPUs with no one-GPU implementation timed beside it: the curve
    gives each count's longest sequence and says why it has no time and how to get one; with
    sdpa timed at a length both counts ran, it has a time and no such line."""
    from attnbench.report.tables.second_gpu import NO_EQUAL_WORK

    env = {"machine": "GPU pair x2", "gpus": [{"name": "GPU pair"}] * 2}
    rows = []
    for world in (1, 2):
        rows.append(typed_row(impl="ring", strategy="ring", world_size=world, seq_len=16384, time_ms=2.0 / world,
                              times_ms=[2.0 / world] * 5, env=env, series=f"r{world}", label=f"ring x{world}"))  # fmt: skip
        found = search("ring", [1 << (20 + world)], 1 << (21 + world), series=f"m{world}")
        rows += [typed_row(**{**r.to_json(), "impl": "ring", "world_size": world, "env": env}) for r in found]
    note = NO_EQUAL_WORK.split(":")[0]
    first = render(load(write_rows(tmp_path / "alone", rows))).text().split("\n## ")[1]
    assert "| GPU pair x2 | ring | 2 | 4M |" in first and note in first
    sdpa = typed_row(impl="sdpa", seq_len=16384, time_ms=4.0, times_ms=[4.0] * 5, env=env, series="sd", label="sdpa")
    first = render(load(write_rows(tmp_path / "paired", [*rows, sdpa]))).text().split("\n## ")[1]
    assert "| GPU pair x2 | ring | 2 | 4M | 16K |" in first and note not in first
