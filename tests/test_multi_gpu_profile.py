"""The multi-gpu profile: speedup runs inside profiles, equal-work baselines, clipping to the
visible GPUs, bytes and bandwidth per sequence-parallel row, and the whole CPU twin run end to
end with gloo on two processes, interrupted, resumed and reported."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.plan import PROFILE_DIR, build_plan
from attnbench.report.tables.multigpu import ring_pairs
from attnbench.results.schema import GpuMemory, Trial, join, row_from_json
from attnbench.runtime.jobs import RankEnded
from attnbench.sweeps import runner, seqpar
from attnbench.sweeps.seqpar import combine, traffic
from attnbench.trials.placed import RankResult
from attnbench.trials.workload import Workload

from conftest import typed_row

ROOT = Path(__file__).resolve().parent.parent


def _profile(name: str) -> dict:
    return tomllib.loads((PROFILE_DIR / f"{name}.toml").read_text())


# --- the CPU twin holds what the GPU profile holds ------------------------------------------------


def _parts(profile: dict) -> list[tuple]:
    """What a profile measures, sizes aside."""
    speedups = [
        (
            "speedup",
            e.get("part"),
            e["impl"],
            tuple(e.get("strategies", ())),
            e.get("module", "attention"),
            e.get("mode", profile.get("mode")),
            "grad_compression" in e,
        )
        for e in profile.get("speedup", [])
    ]
    sweeps = [
        (
            "sweep",
            e.get("part"),
            e["impl"],
            e.get("kind", profile.get("kind")),
            e.get("label"),
            e.get("equal_work", False),
        )
        for e in profile.get("sweep", [])
    ]
    return speedups + sweeps


def _runs_on_cpu(part: tuple) -> bool:
    return "cpu" in impls.spec(part[2]).devices


def test_cpu_profile_has_every_part_of_the_gpu_profile():
    """Part for part, but for what has no CPU kernel (PyTorch's context parallel)."""
    gpu = _parts(_profile("multi-gpu"))
    assert _parts(_profile("multi-gpu-cpu")) == [p for p in gpu if _runs_on_cpu(p)]
    assert any(p[2] == "context-parallel" and p[1] == "ring" for p in gpu)
    assert _profile("multi-gpu-cpu")["parts"] == _profile("multi-gpu")["parts"]
    assert _profile("multi-gpu-cpu")["device"] == "cpu" and _profile("multi-gpu")["device"] == "cuda"


def test_gpu_profile_holds_the_seed_cases_and_the_communication_bound_ring():
    p = _profile("multi-gpu")
    sparse = next(e for e in p["speedup"] if e["impl"] == "block-sparse")
    assert sparse["cases"] == ["2048x8", "4096x4", "8192x2", "16384x1", "131072x8"]
    ring = next(e for e in p["sweep"] if e["impl"] == "ring")
    assert ring["seq_lens"] == ["8K", "16K", "32K", "64K"] and ring["equal_work"]
    # ring-dilated whose longest segment is longer than a shard on two GPUs, so K/V crosses ranks
    crossing = next(e for e in p["sweep"] if e["impl"] == "ring-dilated" and e["part"] == "ring")
    peer = next(e for e in p["sweep"] if e["impl"] == "context-parallel")
    assert peer["part"] == "ring" and peer["seq_lens"] == ring["seq_lens"] and peer["equal_work"]
    lengths = {"1M": 1 << 20}
    assert all(max(crossing["segment_lengths"]) > lengths[n] // 2 for n in crossing["seq_lens"])


# --- plan: speedup tables and equal-work baselines ------------------------------------------------


def test_plan_reads_speedup_tables_and_adds_equal_work_baselines():
    plan = build_plan("multi-gpu-cpu", [], {}, {}, "multi-gpu-cpu")
    assert [
        (s.impl, s.settings.speedup.module, s.settings.mode, s.settings.speedup.grad_compression) for s in plan.speedups
    ] == [
        ("sdpa", "attention", "fwd", None),
        ("sdpa", "attention", "fwd", None),
        ("sdpa", "attention", "fwd", None),
        ("block-sparse", "attention", "fwd", None),
        ("dilated", "attention", "fwd", None),
        ("dilated", "multihead", "fwd_bwd", "fp16"),
    ]
    first = plan.speedups[0].settings
    assert (
        first.speedup.strategies == ("dp", "mp", "thread")
        and first.min_samples == 2
        and first.part == "data-parallel-flash"
    )
    names = [(s.impl, s.world_size) for s in plan.series if s.settings.kind != "speedup"]
    # each equal-work baseline right before the sequence-parallel series it serves
    i = names.index(("ring", 1))
    assert names[i - 1] == ("sdpa", 1)
    crossing = next(s for s in plan.series if s.impl == "ring-dilated" and s.settings.kind == "points")
    before = plan.series[plan.series.index(crossing) - 1]
    assert before.impl == "dilated" and before.config["segment_lengths"] == crossing.config["segment_lengths"]
    assert before.config["dilation_rates"] == crossing.config["dilation_rates"]
    assert before.settings.points.seq_lens == crossing.settings.points.seq_lens and before.settings.gpus == ()
    # the max-seq search gets no baseline: equal work is a points comparison
    assert sum(1 for s in plan.series if s.impl == "block-sparse" and s.settings.kind != "speedup") == 1


def test_a_part_runs_alone_and_parts_run_in_the_profile_order():
    whole = build_plan("multi-gpu-cpu", [], {}, {}, "multi-gpu-cpu")
    assert whole.parts[0] == "data-parallel-flash" and whole.parts[-1] == "seed-rings" and len(whole.parts) == 8
    order = [s.settings.part for s in whole.series]
    assert order == sorted(order, key=whole.parts.index)  # speedup tables first, as the parts say
    ring = build_plan("multi-gpu-cpu", [], {}, {}, "multi-gpu-cpu", parts=["seed-rings"])
    assert {s.settings.part for s in ring.series} == {"seed-rings"} and ring.selected == ("seed-rings",)
    assert not ring.speedups and any(s.impl == "dilated" for s in ring.series)  # equal-work baselines come along
    with pytest.raises(AttnbenchError, match="no such part; its parts: data-parallel-flash, data-parallel-cudnn"):
        build_plan("multi-gpu-cpu", [], {}, {}, "multi-gpu-cpu", parts=["rings"])
    with pytest.raises(AttnbenchError, match="has no parts"):
        build_plan("default-cpu", [], {}, {}, "default-cpu", parts=["x"])


def test_a_table_naming_an_undeclared_part_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('device = "cpu"\nparts = ["a"]\n[[sweep]]\nimpl = "sdpa"\npart = "b"\n')
    with pytest.raises(AttnbenchError, match="part 'b' is not in its parts"):
        build_plan("bad", [], {}, {}, str(bad))
    bad.write_text('device = "cpu"\n[[sweep]]\nimpl = "sdpa"\npart = "Big Part"\n')
    with pytest.raises(AttnbenchError, match="'part' must be a part's name"):
        build_plan("bad", [], {}, {}, str(bad))


def test_unknown_key_in_a_speedup_table_names_it(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('device = "cpu"\n[[speedup]]\nimpl = "sdpa"\ncases = ["256x2"]\nstrategy = ["dp"]\n')
    with pytest.raises(AttnbenchError, match="unknown key 'strategy'"):
        build_plan("bad", [], {}, {}, str(bad))
    bad.write_text('device = "cpu"\n[[speedup]]\nimpl = "sdpa"\n')
    with pytest.raises(AttnbenchError, match="missing key 'cases'"):
        build_plan("bad", [], {}, {}, str(bad))


@pytest.mark.slow
def test_bad_speedup_table_exits_2_with_one_line_and_no_results(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('device = "cpu"\n[[speedup]]\nimpl = "sdpa"\ncases = ["256x2"]\ngpus = 0\n')
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "attnbench", "run", "--profile", str(bad), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "'gpus' must be a positive number" in proc.stderr
    assert "Traceback" not in proc.stderr and not (out / "trials.jsonl").exists()


# --- clipping to the visible GPUs -----------------------------------------------------------------


def _fake_gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(runner, "cuda_available", lambda: True)
    monkeypatch.setattr(runner, "visible_gpus", lambda: n)
    monkeypatch.setattr(seqpar, "max_ranks", lambda device: n)


def test_rank_lists_and_gpu_counts_are_clipped_to_the_visible_gpus(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    plan = runner.resolve(build_plan("multi-gpu", [], {}, {}, "multi-gpu"))
    assert {s.world_size for s in plan.series} == {1, 2}
    assert all(sp.settings.gpus == (2,) and sp.settings.speedup.strategies for sp in plan.speedups)
    # every dropped rank count is named: 4 and 8 of each sequence-parallel entry
    entries = _profile("multi-gpu")
    ranked = [e for e in entries["sweep"] if "gpus" in e]
    dropped = [c for c in plan.clipped if "not run" in c]
    assert len(dropped) == sum(len([g for g in e["gpus"] if g > 2]) for e in ranked) == 2 * len(ranked)
    assert all(" x4:" in c or " x8:" in c for c in dropped)
    assert sum("8 GPUs asked, 2 visible" in c for c in plan.clipped) == len(entries["speedup"]) + len(ranked)


def test_one_gpu_keeps_the_single_gpu_halves(monkeypatch):
    _fake_gpus(monkeypatch, 1)
    plan = runner.resolve(build_plan("multi-gpu", [], {}, {}, "multi-gpu"))
    assert {s.world_size for s in plan.series} == {1}
    # what needs two GPUs is dropped; a new thread per call on one GPU still means something
    assert all(
        sp.settings.gpus == (1,)
        and sp.settings.speedup.strategies in ((), ("thread",))
        and sp.settings.speedup.grad_compression is None
        for sp in plan.speedups
    )
    assert any(sp.settings.speedup.strategies == ("thread",) for sp in plan.speedups)
    assert sum("only its one-GPU strategies ran" in c for c in plan.clipped) == len(_profile("multi-gpu")["speedup"])


def test_ranks_asked_on_the_command_line_are_not_clipped(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    with pytest.raises(AttnbenchError, match="only 2 CUDA GPU"):
        runner.resolve(
            build_plan("bench", ["ring"], {"kind": "points", "seq_lens": "8K", "gpus": "4", "device": "cuda"}, {})
        )


# --- bytes and bandwidth; the equal-work efficiency ------------------------------------------------


def test_traffic_is_the_busiest_ranks_bytes_over_the_call_time():
    def rank(sent):
        return RankResult(status="ok", times_ms=[], sent_bytes=sent)

    assert traffic([rank(3_000_000), rank(5_000_000)], 2.0) == (5_000_000, 5e6 / 2e-3 / 1e9)
    assert traffic([rank(0)], 2.0) == (0, None)
    assert traffic([rank(None)], 2.0) == (None, None)


def test_ranks_on_gpus_combine_into_one_trial_row_the_slowest_call_and_the_fullest_gpu():
    wl = Workload(impl="ring", config={"backend": "auto"}, batch=1, seq_len=1024, heads=2, head_dim=8)
    wl = replace(wl, dtype="fp32", device="cuda")

    def sent(rank, times, peak):  # a rank's part as the launcher hands it back
        nvml = [GpuMemory(index=rank, nvml_index=rank, nvml_used_peak=peak + 50)]
        part = RankResult(status="ok", times_ms=times, timer="cuda-event", devices=[rank], nvml=nvml)
        part.first_call_ms, part.sent_bytes, part.link_gbps, part.max_memory_allocated = 10 + rank, 1000, 90.0, peak
        return RankEnded.finished(rank, part)

    m = combine([sent(0, [1.0, 3.0], 100), sent(1, [2.0, 2.0], 300)], wl, 2)
    assert m.times_ms == [2.0, 3.0] and m.first_call_ms == 11 and m.link_gbps == 90.0
    assert m.peak_bytes == 300 and m.floor_bytes == wl.floor_bytes // 2  # the fullest rank against its shard
    assert [r.time_ms for r in m.ranks] == [2.0, 2.0]
    row = join(
        Trial, m, kind="points", run="r", series="s", label="ring x2", world_size=2, strategy="ring", **wl.to_dict()
    )
    again = row_from_json(json.loads(json.dumps(row.to_json())))
    assert [(g.index, g.rank, g.max_memory_allocated, g.nvml_used_peak) for g in again.gpus] == [
        (0, 0, 100, 150),
        (1, 1, 300, 350),
    ]


def _row(impl, world, time_ms, config=None, **extra):
    return typed_row(
        **{
            "kind": "points",
            "status": "ok",
            "impl": impl,
            "world_size": world,
            "time_ms": time_ms,
            "strategy": "ring" if impl.startswith("ring") else "single",
            "seq_len": 8192,
            "config": config or {},
            "dtype": "bf16",
            "batch": 1,
            "heads": 8,
            "head_dim": 64,
            "mode": "fwd",
            "causal": False,
            "device": "cuda",
            **extra,
        }
    )


def test_efficiency_is_against_equal_work_with_same_split_beside_it():
    rows = [
        _row("sdpa", 1, 12.0, {"backend": "auto"}),
        _row("ring", 1, 15.0, {"backend": "auto"}),
        _row("ring", 2, 10.0, {"backend": "auto"}, sent_bytes=4_000_000, algbw_gbps=0.4),
    ]
    two = next(p for p in ring_pairs(rows) if p.world_size == 2)
    assert two.baseline_text == "equal work: sdpa"
    assert two.efficiency_ci.value == pytest.approx(12.0 / (2 * 10.0))
    assert two.efficiency_same_split == pytest.approx(15.0 / (2 * 10.0))
    assert two.sent_bytes == 4_000_000 and two.row.algbw_gbps == 0.4
    # without the sdpa row, the same split is the baseline and says so
    alone = next(p for p in ring_pairs(rows[1:]) if p.world_size == 2)
    assert alone.baseline_text == "same split: ring" and alone.efficiency_ci.value == pytest.approx(0.75)


def test_dilated_baseline_matches_the_dilation_rates():
    on, off = (
        {"segment_lengths": [64, 128], "dilation_rates": [1, 2]},
        {"segment_lengths": [64, 128], "dilation_rates": [1, 1]},
    )
    rows = [_row("dilated", 1, 8.0, on), _row("dilated", 1, 6.0, off), _row("ring-dilated", 2, 5.0, off)]
    (p,) = ring_pairs(rows)
    assert p.baseline_text == "equal work: dilated" and p.efficiency_ci.value == pytest.approx(6.0 / 10.0)


# --- the whole CPU profile: gloo, two processes, interrupted, resumed, reported --------------------


def _trial_key(r: dict) -> str:
    if r["kind"] == "speedup":
        return "speedup:" + r["key"]
    # a failed search probe is retried once in a fresh process: the retry is its own trial
    return f"{r['kind']}:{r['series']}:{r['seq_len']}:{r.get('attempt', 1)}:{r.get('process', 0)}"


@pytest.mark.slow
def test_cpu_profile_runs_every_part_resumes_and_reports(tmp_path, in_process):
    """The commands run through the entry point in this process (each trial still runs in a
    fresh process or torchrun launch of its own, as on a GPU machine): an interpreter start and
    torch import fewer per command."""
    _attnbench = in_process
    out = tmp_path / "run"
    # part by part into one directory, as a GPU machine lent by the quarter hour runs it
    first = _attnbench("run", "--profile", "multi-gpu-cpu", "--part", "data-parallel-flash", "--out", str(out))
    assert first.returncode == 0, first.stderr[-2000:]
    rows_first = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert {r["impl"] for r in rows_first} == {"sdpa"}
    parts = _profile("multi-gpu-cpu")["parts"][1:]
    rest = [arg for part in parts for arg in ("--part", part)]
    first = _attnbench("run", "--profile", "multi-gpu-cpu", *rest, "--out", str(out), "--resume")
    assert first.returncode == 0, first.stderr[-2000:]
    lines = (out / "trials.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    trials = [r for r in rows if r["kind"] in ("points", "max-seq", "speedup")]
    kinds = Counter(r["kind"] for r in trials)
    assert kinds["points"] and kinds["max-seq"] and kinds["speedup"]
    assert {r["kind"] for r in rows} >= {"verify", "max-seq-result"}
    # in each run, every verify row comes before every trial (a part checks its own configurations)
    for argv in {tuple(r["env"]["argv"]) for r in rows}:
        run = [r for r in rows if tuple(r["env"]["argv"]) == argv]
        first_trial = next(i for i, r in enumerate(run) if r["kind"] != "verify")
        assert all(r["kind"] != "verify" for r in run[first_trial:])
    speedup = {(r["impl"], r["case"], r["strategy"]): r for r in trials if r["kind"] == "speedup"}
    assert speedup[("block-sparse", "256x2", "mp")]["status"] == "ok"
    assert speedup[("block-sparse", "256x2", "dp")]["status"] == "skipped"  # DataParallel needs CUDA
    assert speedup[("block-sparse", "512x1", "mp")]["status"] == "skipped"  # one batch does not split
    assert speedup[("sdpa", "256x2", "thread")]["output_match"] is True  # a new thread per call, same output
    assert speedup[("dilated", "256x2", "mp")]["output_match"] is True
    assert speedup[("dilated", "256x2", "mp")]["grad_compression"] == "fp16"
    ring2 = [r for r in trials if r["kind"] == "points" and r["world_size"] == 2]
    assert ring2 and all(r["sent_bytes"] is not None for r in ring2)
    crossing = next(r for r in ring2 if r["impl"] == "ring-dilated" and r["config"]["segment_lengths"] == [256, 512])
    assert crossing["sent_bytes"] > 0 and crossing["algbw_gbps"] > 0  # K/V really crossed ranks
    assert all(r["link_gbps"] > 0 for r in ring2)  # each row carries what its ranks' link gives
    # the seeds' rings: one segment as long as the sequence, so every one moves K/V
    seeds = [r for r in ring2 if "segment = sequence" in r["label"]]
    assert len(seeds) == 6 and all(r["sent_bytes"] > 0 for r in seeds)
    twins = [r for r in rows if r["kind"] == "verify" and r.get("twin_of")]
    assert all(r["seq_len"] * r["twin_scale"] >= max(r["twin_of"]["segment_lengths"]) for r in twins)
    assert len({_trial_key(r) for r in trials}) == len(trials)

    # an interruption leaves the rows written so far: keep those before the last fixed-length point, which
    # comes after the searches (a search run again may take another path on a busy CPU; a point is one
    # trial), so the resumed run finds every other trial done and redoes that one point
    last_search = max(i for i, r in enumerate(rows) if r["kind"] == "max-seq-result")
    cut = max(i for i, r in enumerate(rows) if r["kind"] == "points")
    assert cut > last_search
    (out / "trials.jsonl").write_text("".join(line + "\n" for line in lines[:cut]))
    again = _attnbench("run", "--profile", "multi-gpu-cpu", "--out", str(out), "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert resumed[:cut] == rows[:cut]  # nothing rewritten
    after = [r for r in resumed if r["kind"] in ("points", "max-seq", "speedup")]
    assert sorted(_trial_key(r) for r in after) == sorted(_trial_key(r) for r in trials)  # none lost, none repeated
    assert sum(r["kind"] == "max-seq-result" for r in resumed) == sum(r["kind"] == "max-seq-result" for r in rows)
    redone = [r for r in resumed[cut:] if r["kind"] in ("points", "max-seq", "speedup")]
    assert redone and all(r["kind"] == "points" for r in redone)

    report = _attnbench("report", str(out), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr[-2000:]
    text = (tmp_path / "report" / "report.md").read_text()
    assert "equal work: sdpa" in text and "equal work: dilated" in text
    assert "no multi-GPU ring rows on this machine" not in text
    assert "no block-sparse speedup rows on this machine" not in text


def test_a_multi_rank_rows_rate_is_one_gpus_and_its_total_is_named_a_total():
    """4e12 FLOPs in 2 ms on 2 GPUs: 2,000 TFLOP/s in all, 1,000 per GPU, the unit a GPU's peak reads in."""
    from attnbench.units import rate_per_device

    assert rate_per_device(2000.0, 2) == "1000.0 TFLOP/s per GPU (2000.0 TFLOP/s in all on 2)"
    assert rate_per_device(0.5, 1) == "500.0 GFLOP/s"
    env = {"machine": "GPU pair x2"}
    single = typed_row(impl="sdpa", seq_len=8192, time_ms=3.0, times_ms=[3.0] * 5, env=env, series="a", label="a")
    ring = typed_row(
        impl="ring",
        strategy="ring",
        world_size=2,
        seq_len=8192,
        time_ms=2.0,
        times_ms=[2.0] * 5,
        flops_executed=4e12,
        env=env,
        series="b",
        label="ring x2",
    )
    (pair,) = [p for p in ring_pairs([single, ring]) if p.row.impl == "ring"]
    assert pair.tflops_per_gpu == pytest.approx(1000.0) and pair.efficiency == pytest.approx(0.75)


def _ring_history(tmp_path):
    """sdpa on one GPU at 16K (8 ms); ring on 2 and 4 GPUs on T_1 / w + 0.1 ms per peer; a
    finished search on 2 GPUs reaching 2M."""
    from attnbench.results.convert import to_json as json_of

    env = {"machine": "GPU quad x4", "gpus": [{"name": "GPU quad"}] * 4}
    rows = [typed_row(impl="sdpa", seq_len=16384, time_ms=8.0, times_ms=[8.0] * 5, env=env, series="sd", label="sdpa")]
    for w in (2, 4):
        ms = 8.0 / w + 0.1 * (w - 1)
        rows.append(
            typed_row(
                impl="ring",
                strategy="ring",
                world_size=w,
                seq_len=16384,
                time_ms=ms,
                times_ms=[ms] * 5,
                env=env,
                series=f"r{w}",
                label=f"ring x{w}",
            )  # fmt: skip
        )
    search = dict(impl="ring", strategy="ring", world_size=2, env=env, series="m2", label="ring x2", device="cuda")
    rows += [
        typed_row(kind="max-seq", seq_len=1 << 21, status="ok", **search),
        typed_row(kind="max-seq", seq_len=1 << 22, status="oom", **search),
        typed_row(kind="max-seq-result", seq_len=1 << 21, first_failure=1 << 22, stop_status="oom", **search),
    ]
    path = tmp_path / "hist"
    path.mkdir()
    (path / "trials.jsonl").write_text("".join(json.dumps(json_of(r)) + "\n" for r in rows))
    return rows, path


def test_predicting_more_gpus_uses_tokens_per_rank_and_the_cost_per_peer(tmp_path, in_process):
    """2M on 2 GPUs is 1M tokens a rank: 8M on 8. 8 ms on one GPU and 0.1 ms per peer:
    8 GPUs take 1 + 0.7 = 1.7 ms (efficiency 8 / (8 x 1.7) = 0.588); each measured count is
    predicted from the other exactly."""
    from attnbench.report.tables import gpu_prediction as gp

    rows, path = _ring_history(tmp_path)
    (eight,) = [p for p in gp.longest(rows, "ring", 8) if p.gpus == 8]
    assert (eight.source, eight.per_rank, eight.predicted, eight.measured) == (2, 1 << 20, 1 << 23, None)
    times = {t.gpus: t for t in gp.time_at(rows, "ring", 8)}
    assert times[8].predicted_ms == pytest.approx(1.7) and times[8].efficiency == pytest.approx(8 / 13.6)
    assert times[4].predicted_ms == pytest.approx(times[4].measured_ms) and times[4].fitted_on == (2,)
    done = in_process("predict", "--impl", "ring", "--from", str(path), "--gpus", "8")
    assert done.returncode == 0, done.stderr
    assert "ring x8 [GPU quad x4]: predicted longest 8,388,608 (8M)" in done.stdout
    assert "ring x4 [GPU quad x4] at 16,384 (16K): predicted 2.3 ms" in done.stdout and "(+0%)" in done.stdout
    bad = in_process("predict", "--impl", "ring", "--from", str(path))
    assert bad.returncode == 2 and "--gpu-memory" in bad.stderr and "Traceback" not in bad.stderr
