"""`attnbench speedup` on the CPU: mp with gloo and two processes against single, DataParallel
skipped with its reason, DDP gradients of the multi-head module, a failing rank, a wrong
output caught, NVML rows from a fake backend, the tables, and bad input."""

import os
import statistics
import threading
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from attnbench.analysis.ranks import slowest_per_call
from attnbench.errors import AttnbenchError
from attnbench.plan import Case, Plan, parse_cases, speedup_series
from attnbench.results import read_rows
from attnbench.results.convert import SchemaError, to_json
from attnbench.results.schema import GpuMemory
from attnbench.runtime.jobs import RankEnded
from attnbench.sweeps.kinds.speedup.rows import gpu_rows, notes_for
from attnbench.sweeps.kinds.speedup.runner import check_settings
from attnbench.sweeps.runner import SweepRunner
from attnbench.trials import strategies
from attnbench.trials.placed_job import context, measure, rank_job
from attnbench.trials.reference import TOLERANCE

from conftest import ROOT, main_in_process, not_timed_out, run_cli, single_rank_spec, typed_row


def read_ranks(sent: list[dict]) -> list[RankEnded]:
    """Ranks as the launcher hands them back, from what each sent: its rank and status beside
    its result, read as the launch reads it."""
    return [
        RankEnded(d["rank"], d["status"], result=rank_job.read_result(_without(d, "rank"), f"rank {d['rank']}"))
        for d in sent
    ]


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


CPU = ["--device", "cpu", "--dtype", "fp32", "--heads", 4, "--head-dim", 16]
DILATED = ["--impl", "dilated", "--segment-lengths", "64,128", "--dilation-rates", "1,2"]
CASES = "256x2,512x4"


def speedup_rows(out: Path) -> dict[tuple[str, str], dict]:
    rows, problems = read_rows(out)
    assert problems == []
    return {(r["case"], r["strategy"]): r for r in rows if r.get("kind") == "speedup"}


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("speedup") / "run"
    proc = run_cli("speedup", *DILATED, *CPU, "--gpus", 2, "--cases", CASES, "--strategy", "dp,mp", "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc


@pytest.mark.slow
@pytest.mark.distributed
def test_mp_with_gloo_on_two_processes_equals_single_and_writes_timing_rows(cpu_run):
    out, _ = cpu_run
    rows = speedup_rows(out)
    verify = [r for r in read_rows(out)[0] if r.get("kind") == "verify"]
    assert verify and all(r["status"] == "pass" for r in verify)
    for case in CASES.split(","):
        single, mp = rows[(case, "single")], rows[(case, "mp")]
        assert single["status"] == mp["status"] == "ok", (single["message"], mp["message"])
        assert single["world_size"] == 1 and mp["world_size"] == 2 and mp["processes"] == 2
        assert [r["rank"] for r in mp["ranks"]] == [0, 1]
        for r in (single, mp):
            assert r["times_ms"] and r["time_ms"] == statistics.median(r["times_ms"])
            assert r["time_min_ms"] <= r["time_ms"] <= r["time_max_ms"]
            assert r["env"]["command"] and "nccl" in r["env"] and r["started_at"] and r["duration_s"] > 0
        assert mp["output_match"] is True and mp["output_rel_err"] <= TOLERANCE["fp32"]
        assert mp["tolerance"] == TOLERANCE["fp32"]
        assert single.get("output_match") is None  # it is the reference: nothing compared
        assert f"{int(case.split('x')[1]) // 2} per rank" in mp["note"]


def test_mp_time_is_the_slowest_rank_per_iteration():
    assert slowest_per_call([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]
    with pytest.raises(ValueError):
        slowest_per_call([[1.0, 2.0], [1.0]])


@pytest.mark.parametrize("firsts", [(9.0, 7.0), (9.0, None)])
def test_a_speedup_trial_and_a_sequence_parallel_trial_read_their_ranks_alike(firsts):
    """The same ranks' calls give both kinds of multi-rank trial the same call times, the
    same first call (the slowest rank's, none where a rank took none) and the same rank lines."""
    from attnbench.sweeps.kinds.speedup.rows import merge_ranks
    from attnbench.sweeps.seqpar import combine
    from attnbench.trials.placed import RankResult
    from attnbench.trials.workload import Workload

    per_rank = [[2.0, 4.0, 3.0], [3.0, 1.0, 3.5]]
    speedup = merge_ranks(
        read_ranks(
            [
                {"status": "ok", "rank": r, "devices": [r], "times_ms": t, "first_call_ms": f}
                for r, (t, f) in enumerate(zip(per_rank, firsts))
            ]
        ),
        speedup_series(impl="sdpa", config={}, cases=(Case(1024, 2),), gpus=2, device="cpu", dtype="fp32"),
        Case(1024, 2),
        strategies.get("single"),
    )
    wl = Workload(impl="ring", config={}, batch=1, seq_len=1024, heads=2, head_dim=8, dtype="fp32", device="cpu")
    parts = [RankResult(status="ok", times_ms=t, timer="cpu") for t in per_rank]
    for part, first in zip(parts, firsts):
        part.first_call_ms = first
    ring = combine([RankEnded.finished(r, p) for r, p in enumerate(parts)], wl, 2)
    assert speedup.times_ms == ring.times_ms == [3.0, 4.0, 3.5]
    assert speedup.first_call_ms == ring.first_call_ms == (9.0 if None not in firsts else None)
    assert [r.time_ms for r in speedup.ranks] == [r.time_ms for r in ring.ranks] == [3.0, 3.0]


@pytest.mark.parametrize("gpu", [([0.5, 0.6], [0.7, 0.4]), ([0.5, 0.6], None)])
def test_both_multi_rank_trials_take_gpu_time_only_where_every_rank_took_it(gpu):
    """GPU time per call is the slowest rank's where every rank took it (they replayed their calls
    together), and none where one did not: the same rule for a speedup and a ring trial."""
    from attnbench.sweeps.kinds.speedup.rows import merge_ranks
    from attnbench.sweeps.seqpar import combine
    from attnbench.trials.placed import RankResult
    from attnbench.trials.workload import Workload

    per_rank = [[2.0, 4.0], [3.0, 1.0]]
    speedup = merge_ranks(
        read_ranks(
            [
                {"status": "ok", "rank": r, "devices": [r], "times_ms": t, "gpu_times_ms": g, "gpu_timer": "cuda-graph"}
                for r, (t, g) in enumerate(zip(per_rank, gpu))
            ]
        ),
        speedup_series(impl="sdpa", config={}, cases=(Case(1024, 2),), gpus=2, device="cpu", dtype="fp32"),
        Case(1024, 2),
        strategies.get("single"),
    )
    wl = Workload(impl="ring", config={}, batch=1, seq_len=1024, heads=2, head_dim=8, dtype="fp32", device="cpu")
    parts = [
        RankResult(status="ok", times_ms=t, gpu_times_ms=g, gpu_timer="cuda-graph", timer="cpu")
        for t, g in zip(per_rank, gpu)
    ]
    ring = combine([RankEnded.finished(r, p) for r, p in enumerate(parts)], wl, 2)
    both = [0.7, 0.6] if None not in gpu else None
    assert speedup.gpu_times_ms == ring.gpu_times_ms == both
    assert speedup.gpu_timer == ring.gpu_timer == ("cuda-graph" if both else None)
    assert speedup.times_ms == ring.times_ms == [3.0, 4.0]


@pytest.mark.slow
@pytest.mark.distributed
def test_dataparallel_on_the_cpu_is_skipped_with_its_reason(cpu_run):
    out, proc = cpu_run
    for case in CASES.split(","):
        dp = speedup_rows(out)[(case, "dp")]
        assert dp["status"] == "skipped" and "DataParallel" in dp["message"] and "CPU" in dp["message"]
        assert dp["times_ms"] == []
    assert "skipped" in proc.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_tables_have_report_001s_layout_with_speedups_from_the_rows(cpu_run):
    from attnbench.report.intervals import ratio_text

    out, _ = cpu_run
    rows = speedup_rows(out)
    md = (out / "sweep.md").read_text()
    header = "| Sequence Length | Batch Size | Single GPU Time | Multi-GPU Time | Speedup | Notes | Efficiency |"
    mp_section = md.split("#### Multi-process data parallel (DDP): dilated")[1].split("####")[0]
    assert mp_section.splitlines()[1].startswith(header) and ", 2 CPU processes" in mp_section.splitlines()[0]
    dp_section = md.split("#### DataParallel: dilated")[1].split("####")[0]
    for case in CASES.split(","):
        n, b = case.split("x")
        ratio = rows[(case, "single")]["time_ms"] / rows[(case, "mp")]["time_ms"]
        line = next(line for line in mp_section.splitlines() if line.startswith(f"| {int(n):,} | {b} |"))
        # the ratio of the medians with its interval (± half of it, or [low, high] where it is
        # lopsided), and efficiency the same / GPUs
        cells = [c.strip() for c in line.split("|")]
        for cell, value in ((cells[5], ratio), (cells[7], ratio / 2)):
            assert cell.startswith((f"{ratio_text(value)} ±", f"{ratio_text(value)} [")), cell
        assert f"| {int(n):,} | {b} |" in dp_section and "| skipped |" in dp_section
    csv = pd.read_csv(out / "speedup.csv")
    mp = csv[csv.strategy == "mp"].set_index("seq_len")
    for case in CASES.split(","):
        n = int(case.split("x")[0])
        ratio = rows[(case, "single")]["time_ms"] / rows[(case, "mp")]["time_ms"]
        assert mp.loc[n, "speedup"] == pytest.approx(ratio) and mp.loc[n, "efficiency"] == pytest.approx(ratio / 2)
    assert (out / "speedup_memory.csv").exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_resume_finds_every_trial_done_and_a_new_run_must_choose_another_out(cpu_run, in_process):
    out, _ = cpu_run
    before = (out / "trials.jsonl").read_bytes()
    # `--resume --out DIR` alone replays the command the rows recorded
    proc = in_process("speedup", "--resume", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "resuming: attnbench speedup --impl dilated" in proc.stderr
    assert "from earlier run" in proc.stdout
    assert (out / "trials.jsonl").read_bytes() == before
    proc = in_process("speedup", *DILATED, *CPU, "--gpus", 2, "--cases", CASES, "--out", out)
    assert proc.returncode == 2 and "--resume" in proc.stderr
    assert (out / "trials.jsonl").read_bytes() == before


@pytest.mark.slow
@pytest.mark.distributed
def test_a_resumed_run_recomputes_the_single_output_it_compares_with(tmp_path, in_process):
    """The single output lives in a scratch directory of the run that measured it; a strategy
    added with --resume still gets its output checked."""
    common = [
        "speedup",
        "--impl",
        "sdpa",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--heads",
        2,
        "--head-dim",
        16,
        "--gpus",
        2,
        "--cases",
        "256x2",
        "--out",
        tmp_path / "run",
    ]
    assert in_process(*common, "--strategy", "single").returncode == 0
    proc = in_process(*common, "--strategy", "mp", "--resume")
    assert proc.returncode == 0, proc.stderr
    rows = speedup_rows(tmp_path / "run")
    assert set(rows) == {("256x2", "single"), ("256x2", "mp")}
    assert (
        rows[("256x2", "mp")]["output_match"] is True and rows[("256x2", "mp")]["output_rel_err"] <= TOLERANCE["fp32"]
    )


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_gradients_of_the_multihead_module_equal_single_and_compression_is_applied(tmp_path):
    """Each rank's loss is the mean over its half of the batch and DDP averages the two: that
    is the single run's mean over the whole batch, so the gradients agree up to the fp16
    rounding of the compressed all-reduce (a sum instead of a mean would be off by 100%),
    and that rounding is really there (float32 alone agrees to ~1e-7)."""
    out = tmp_path / "run"
    proc = run_cli(
        "speedup",
        *DILATED,
        *CPU,
        "--gpus",
        2,
        "--cases",
        "256x2",
        "--strategy",
        "mp",
        "--module",
        "multihead",
        "--mode",
        "fwd_bwd",
        "--grad-compression",
        "fp16",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = speedup_rows(out)
    mp = rows[("256x2", "mp")]
    assert mp["status"] == "ok" and mp["output_match"] is True and mp["output_rel_err"] <= TOLERANCE["fp32"]
    assert mp["grad_compression"] == "fp16" and "all-reduce fp16" in mp["note"]
    assert 1e-6 < mp["grad_rel_err"] <= TOLERANCE["fp16"] == mp["grad_tolerance"]
    assert rows[("256x2", "single")].get("grad_compression") is None and mp["module"] == "multihead"


@pytest.fixture
def fault_strategies(monkeypatch):
    """Put tests/ on the rank processes' path so they can import the fault strategies."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])))
    import speedup_faults  # noqa: F401  (registers them here)

    yield
    for name in ("fail-rank-1", "swapped-shards"):
        strategies.STRATEGIES.entries().pop(name, None)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failing_rank_ends_its_trial_quickly_and_a_wrong_output_fails_its_row(tmp_path, fault_strategies):
    from attnbench.results.environment import capture_env

    settings = check_settings(
        speedup_series(
            impl="dilated",
            config={"segment_lengths": [64, 128], "dilation_rates": [1, 2]},
            cases=(Case(256, 2),),
            gpus=2,
            strategies=("fail-rank-1", "swapped-shards"),
            dtype="fp32",
            device="cpu",
            heads=4,
            head_dim=16,
            max_trial_seconds=3600,  # no deadline before the ranks' collective timeout (300 s)
        ),
        cuda_devices=0,
    )
    outcomes = SweepRunner(Plan("t", (settings,)), tmp_path / "run", capture_env()).run()
    assert all(o.verified for o in outcomes)
    rows = speedup_rows(tmp_path / "run")
    failed = rows[("256x2", "fail-rank-1")]
    assert (
        failed["status"] == "error" and failed["message"].startswith("rank 1:") and "asked to fail" in failed["message"]
    )
    # rank 0 did not wait out its collective timeout (the deadline is later still): torchrun
    # stopped it, or it failed at once on the connection rank 1 left
    assert not_timed_out(failed["ranks"][0]), failed["ranks"][0]
    swapped = rows[("256x2", "swapped-shards")]
    assert swapped["status"] == "error" and swapped["output_match"] is False
    assert swapped["output_rel_err"] > 0.1 and "differs from the single-GPU run" in swapped["message"]
    # the command exits 1 on it, naming the trial (and shows no speedup beside it)
    from attnbench.cli.speedup import wrong_outputs

    (wrong,) = wrong_outputs(tmp_path / "run")
    assert wrong.startswith("256x2 swapped-shards: differs from the single-GPU run")


class ScriptedNvml:
    """Two GPUs whose used memory follows a script, one reading per call (then the last)."""

    def __init__(self, scripts):
        self.scripts, self.calls, self.lock = scripts, [0] * len(scripts), threading.Lock()

    def device_count(self):
        return len(self.scripts)

    def used_bytes(self, index):
        with self.lock:
            i = self.calls[index] = self.calls[index] + 1
        script = self.scripts[index]
        return script[min(i - 1, len(script) - 1)]


def _measure(tmp_path, nvml):
    spec = single_rank_spec(tmp_path / "ref", seed=1, samples=(3, 5), target_ms=50)
    return measure(strategies.get("single"), context(spec), spec, nvml=nvml)


def test_nvml_sampler_in_the_speedup_path_gives_per_gpu_rows_and_peaks(tmp_path):
    # readings: the baseline when sampling starts, then the peak, then lower again; the
    # sampler reads at least twice (start and stop), however fast the trial
    nvml = ScriptedNvml([[1000, 9000, 2000], [500, 700, 600]])
    result = _measure(tmp_path, nvml)
    assert result.status == "ok" and result.times_ms
    assert result.nvml == [
        GpuMemory(index=0, nvml_index=0, nvml_used_before=1000, nvml_used_peak=9000),
        GpuMemory(index=1, nvml_index=1, nvml_used_before=500, nvml_used_peak=700),
    ]
    allocator = {"0": {"max_memory_allocated": 123, "max_memory_reserved": 456}}
    rows = gpu_rows(2, result.nvml, allocator)
    assert rows[0] == GpuMemory(
        index=0,
        nvml_index=0,
        nvml_used_before=1000,
        nvml_used_peak=9000,
        max_memory_allocated=123,
        max_memory_reserved=456,
    )
    assert rows[1].nvml_used_peak == 700 and rows[1].max_memory_allocated is None
    # CUDA may number the GPUs differently from NVML: the sampler numbers them as CUDA does, rows follow
    swapped = gpu_rows(2, [replace(g, nvml_index=1 - g.index) for g in result.nvml], allocator)
    assert [g.nvml_index for g in swapped] == [1, 0] and swapped[0].max_memory_allocated == 123
    # the reference output was written per batch element
    assert sorted(p.name for p in (tmp_path / "ref").iterdir()) == ["out0.pt", "out1.pt"]


def test_without_nvml_the_run_continues_with_torch_memory_and_a_note(tmp_path):
    result = _measure(tmp_path, None)
    assert result.status == "ok" and result.nvml is None
    rows = gpu_rows(2, None, {"0": {"max_memory_allocated": 123, "max_memory_reserved": 456}})
    assert rows[0].max_memory_allocated == 123 and rows[0].nvml_used_peak is None and rows[1].nvml_used_peak is None
    row = typed_row(
        "speedup",
        processes=1,
        world_size=1,
        batch=2,
        mode="fwd",
        nvml_note="NVML unavailable (NVMLError_LibraryNotFound: NVML Shared Library Not Found)",
    )
    assert "NVML unavailable" in notes_for(row, strategies.get("single")) and "memory from torch only" in notes_for(
        row, strategies.get("single")
    )


def test_dataparallel_notes_say_what_really_ran():
    dp = strategies.get("dp")
    gib = 2**30
    one = typed_row(
        "speedup",
        processes=1,
        world_size=2,
        batch=1,
        mode="fwd",
        replica_batches=[[0, 1]],
        gpus=[
            {"index": 0, "max_memory_allocated": 3 * gib, "nvml_used_before": gib, "nvml_used_peak": 4 * gib},
            {"index": 1, "max_memory_allocated": 0, "nvml_used_before": gib // 2, "nvml_used_peak": gib},
        ],
    )
    note = notes_for(one, dp)
    assert "batch 1 < 2 GPUs: DataParallel ran 1 replica" in note and "GPU 1 idle" in note
    assert (
        "allocator peak 0 B" in note
        and "NVML 1.00 GiB used at peak" in note
        and "+0.50 GiB" in note
        and "CUDA context" in note
    )
    uneven = replace(one, batch=3, replica_batches=[[0, 2], [1, 1]])
    assert "uneven split: GPU 0 got 2, GPU 1 got 1" in notes_for(uneven, dp) and "idle" not in notes_for(uneven, dp)


def test_cases_parse_and_gpu_count_is_checked():
    assert parse_cases("2048x8, 64Kx2") == (Case(2048, 8), Case(65536, 2))
    base = speedup_series("sdpa", {}, cases=(Case(1024, 1),), gpus=2, strategies=("dp",), device="cuda")
    with pytest.raises(AttnbenchError, match="at most 1"):
        check_settings(base, cuda_devices=1)
    assert check_settings(base, cuda_devices=2).config == {"backend": "auto"}  # dp runs batch 1 on 2 GPUs, with a note
    with pytest.raises(AttnbenchError, match="not a multiple of 2"):
        check_settings(replace(base, settings=base.settings.with_values(strategies=("mp",))), cuda_devices=2)


def test_a_speedup_series_call_is_checked_as_a_sweeps_is():
    """What a sweep refuses of a series' call a speedup refuses too, before anything runs: sample
    counts the wrong way round, key heads that do not divide the heads."""
    from attnbench.sweeps.kinds.base import check_trial_series

    base = speedup_series("sdpa", {}, cases=(Case(256, 2),), gpus=2, strategies=("mp",), device="cpu", dtype="fp32")
    assert check_settings(base, cuda_devices=0).impl == "sdpa"
    for bad, why in (({"min_samples": 9, "max_samples": 3}, "below min_samples"), ({"kv_heads": 3}, "kv")):
        series = replace(base, settings=base.settings.with_values(**bad))
        with pytest.raises(AttnbenchError, match=why):
            check_settings(series, cuda_devices=0)
        with pytest.raises(AttnbenchError, match=why):
            check_trial_series(replace(series, settings=replace(series.settings, kind="points")))


def _ranks_that_agree(job, spec, nprocs, device, phase_limit_s, **limits):
    """What a speedup trial's ranks send when they ran and their output equals the single
    run's, without starting them (real ranks: the tests above)."""
    wl = spec.workload
    share = wl.batch * wl.seq_len * wl.heads * wl.head_dim // nprocs
    compare = {"compare": {"sq_err": 0.0, "sq_ref": 1.0, "elements": share}} if spec.output.role == "measure" else {}
    return read_ranks([{"status": "ok", "rank": r, "times_ms": [1.0, 1.0, 1.0], **compare} for r in range(nprocs)])


@pytest.mark.slow
def test_the_seeds_default_cases_run_and_mp_skips_the_batch_it_cannot_split(tmp_path, monkeypatch, in_process):
    """Without --cases the seeds' four cases run; 16384x1 cannot split over 2 ranks, so mp
    records it skipped with the reason (named explicitly, the same case is bad input, below).
    Which trial runs and which is skipped is decided before any rank starts: the ranks are
    stood in for (two launches of torchrun per case cost minutes on a busy 2-core machine)."""
    import attnbench.runtime.distributed as distributed

    monkeypatch.setattr(distributed, "launch", _ranks_that_agree)
    out = tmp_path / "run"
    proc = in_process("speedup", *DILATED, *CPU, "--gpus", 2, "--strategy", "mp", "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = speedup_rows(out)
    assert {case for case, _ in rows} == {"2048x8", "4096x4", "8192x2", "16384x1"}
    skipped = rows[("16384x1", "mp")]
    assert skipped["status"] == "skipped" and "batch 1, not a multiple of 2" in skipped["message"]
    assert skipped["times_ms"] == [] and rows[("16384x1", "single")]["status"] == "ok"
    assert all(rows[(case, "mp")]["status"] == "ok" for case in ("2048x8", "4096x4", "8192x2"))


BAD = {
    "batch mp cannot split": (["--cases", "256x3", "--strategy", "mp"], "not a multiple of 2"),
    "named case mp cannot split": (["--cases", "16384x1"], "not a multiple of 2"),
    "malformed case": (["--cases", "256by2"], "SEQLENxBATCH"),
    "length the configuration cannot split": (["--cases", "200x2"], "must be a multiple of"),
    "unknown strategy": (["--strategy", "warp"], "unknown strategy 'warp': choose from dp, mp, thread"),
    "the sequence-parallel trials' strategy": (["--strategy", "ring"], "runs as bench or max-seq --gpus N"),
    "compression without DDP": (["--grad-compression", "fp16"], "--module multihead"),
    "bf16 compression on gloo": (
        ["--grad-compression", "bf16", "--module", "multihead", "--mode", "fwd_bwd", "--strategy", "mp"],
        "fp16",
    ),
}


@pytest.fixture
def cli_in_process(monkeypatch, capsys):
    """`attnbench ARGS` through the real entry point, in this process (no torch start-up)."""

    def call(*args):
        code = main_in_process(*args)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(name, tmp_path, cli_in_process):
    extra, hint = BAD[name]
    out = tmp_path / "out"
    code, stdout, stderr = cli_in_process("speedup", *DILATED, *CPU, "--gpus", 2, *extra, "--out", out)
    assert code == 2, (stdout, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and hint in lines[0], stderr
    assert "Traceback" not in stdout + stderr and not out.exists()


def test_more_gpus_than_exist_is_one_line_exit_2(tmp_path, in_process):
    proc = in_process("speedup", "--impl", "sdpa", "--device", "cuda", "--gpus", 2, "--out", tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def _cuda_settings(**kw):
    return speedup_series(
        **{
            "impl": "sdpa",
            "config": {"backend": "auto"},
            "cases": (Case(1024, 2),),
            "gpus": 2,
            "device": "cuda",
            "dtype": "bf16",
            **kw,
        }
    )


def test_rank_results_from_two_gpus_merge_into_one_row():
    """What the ranks of an mp trial on two GPUs return (the job's result files), merged:
    time per iteration is the slowest rank's, each GPU gets its own allocator peak and its
    NVML reading (CUDA 0 is NVML 1 here), the output error is pooled over the ranks."""
    from attnbench.sweeps.kinds.speedup.rows import merge_ranks

    # CUDA device 0 is NVML's GPU 1: the sampler reads by CUDA index and names the NVML one
    nvml = [
        {"index": 0, "nvml_index": 1, "nvml_used_before": 30, "nvml_used_peak": 90},
        {"index": 1, "nvml_index": 0, "nvml_used_before": 10, "nvml_used_peak": 20},
    ]
    width = 8 * 64
    rank0 = {
        "status": "ok",
        "rank": 0,
        "devices": [0],
        "times_ms": [2.0, 4.0, 3.0],
        "first_call_ms": 9.0,
        "nvml": nvml,
        "allocator": {"0": {"max_memory_allocated": 100, "max_memory_reserved": 200}},
        "backend": "flash",
        "compare": {"sq_err": 1.0, "sq_ref": 100.0, "elements": 1024 * width, "nonfinite": False},
    }
    rank1 = {
        "status": "ok",
        "rank": 1,
        "devices": [1],
        "times_ms": [3.0, 1.0, 3.5],
        "first_call_ms": 7.0,
        "nvml": None,
        "allocator": {"1": {"max_memory_allocated": 101, "max_memory_reserved": 201}},
        "compare": {"sq_err": 3.0, "sq_ref": 300.0, "elements": 1024 * width, "nonfinite": False},
    }
    mp_settings, mp = _cuda_settings(strategies=("mp",)), strategies.get("mp")
    row = merge_ranks(read_ranks([rank0, rank1]), mp_settings, Case(1024, 2), mp)
    assert row.times_ms == [3.0, 4.0, 3.5] and row.time_ms == 3.5
    assert [(g.index, g.nvml_index, g.nvml_used_peak, g.max_memory_allocated) for g in row.gpus] == [
        (0, 1, 90, 100),
        (1, 0, 20, 101),
    ]
    assert row.output_rel_err == pytest.approx(0.1) and row.output_match is False and row.status == "error"
    assert "1.00e-01 > tolerance 1e-02" in row.message
    assert [r.first_call_ms for r in row.ranks] == [9.0, 7.0]
    # a share missing from the pooled check is a failure, not a pass
    rank1["compare"] = {**rank1["compare"], "sq_err": 0.0, "elements": 10}
    rank0["compare"] = {**rank0["compare"], "sq_err": 0.0}
    row = merge_ranks(read_ranks([rank0, rank1]), mp_settings, Case(1024, 2), mp)
    assert row.output_match is False and "output values" in row.message


def test_a_rank_result_missing_or_mistyping_a_field_is_refused_naming_it():
    """The parent reads each rank's result file checked: a field the job and the parent
    disagree on is named, never read as missing."""
    sent = {"status": "ok", "rank": 0, "times_ms": [1.0], "compare": {"sq_err": 0.0, "sq_ref": 1.0, "elements": 4}}
    assert read_ranks([sent])[0].result.compare.elements == 4
    with pytest.raises(SchemaError, match="rank 1's rankresult: missing field 'times_ms'"):
        read_ranks([sent, {"status": "ok", "rank": 1}])
    mistyped = {**sent, "compare": {**sent["compare"], "elements": "4"}}
    with pytest.raises(
        SchemaError, match=r"field 'compare': field 'elements' is a string \('4'\), expected an integer"
    ):
        read_ranks([mistyped])
    with pytest.raises(SchemaError, match="unknown field 'time'"):
        read_ranks([{**sent, "time": 1.0}])


def test_a_dataparallel_row_with_one_replica_says_which_gpu_idled():
    from attnbench.sweeps.kinds.speedup.rows import merge_ranks

    nvml = [
        {"index": 0, "nvml_used_before": 2**30, "nvml_used_peak": 3 * 2**30},
        {"index": 1, "nvml_used_before": 2**29, "nvml_used_peak": 2**29},
    ]
    sent = {
        "status": "ok",
        "rank": 0,
        "devices": [0, 1],
        "times_ms": [5.0],
        "nvml": nvml,
        "allocator": {
            "0": {"max_memory_allocated": 2**31, "max_memory_reserved": 2**31},
            "1": {"max_memory_allocated": 0, "max_memory_reserved": 0},
        },
        "replica_batches": [[0, 1]],
        "compare": {"sq_err": 0.0, "sq_ref": 1.0, "elements": 1024 * 512},
    }
    s = _cuda_settings(cases=(Case(1024, 1),))
    dp = strategies.get("dp")
    measured = merge_ranks(read_ranks([sent]), s, Case(1024, 1), dp)
    row = typed_row("speedup", batch=1, mode="fwd", world_size=2, seq_len=1024, strategy="dp", **to_json(measured))
    assert row.status == "ok" and row.output_match is True and row.replica_batches == [[0, 1]]
    note = notes_for(row, dp)
    assert note.startswith(
        "batch 1 < 2 GPUs: DataParallel ran 1 replica; GPU 1 idle (allocator peak 0 B, NVML 0.50 GiB"
    )
    assert "+0.00 GiB during the run" in note and "CUDA context" not in note
    # report 000's memory distribution: one column per GPU, allocator and NVML
    from attnbench.report.document import Doc
    from attnbench.report.sections.data_parallel import memory_distribution
    from attnbench.report.tables.multigpu import speedup_cases

    doc = Doc()
    cases = speedup_cases([row])
    memory_distribution(doc, cases, "memory")
    lines = [line for line in doc.text().splitlines() if line.startswith("|")]
    assert lines[0] == (
        "| Strategy | Sequence Length | Batch Size | GPU 0 Memory | GPU 1 Memory | NVML GPU 0 | NVML GPU 1 |"
    )
    assert lines[2] == "| dp | 1,024 (1K) | 1 | 2.00 GiB | 0 B | 3.00 GiB | 512 MiB |"


def test_environment_names_how_each_gpu_pair_is_connected():
    """env.gpu_links from NVML's topology and peer-to-peer queries (a fake NVML of three GPUs:
    0-1 on NVLink, 2 across the NUMA nodes without P2P)."""
    from types import SimpleNamespace

    from attnbench.results.environment import gpu_links

    nvlinked = {(0, 1)}
    fake = SimpleNamespace(
        NVML_TOPOLOGY_INTERNAL=0,
        NVML_TOPOLOGY_SINGLE=10,
        NVML_TOPOLOGY_MULTIPLE=20,
        NVML_TOPOLOGY_HOSTBRIDGE=30,
        NVML_TOPOLOGY_NODE=40,
        NVML_TOPOLOGY_SYSTEM=50,
        NVML_P2P_CAPS_INDEX_NVLINK=3,
        NVML_P2P_STATUS_OK=0,
        nvmlDeviceGetCount=lambda: 3,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 40 if (a, b) in nvlinked else 50,
        nvmlDeviceGetP2PStatus=lambda a, b, cap: 0 if (a, b) in nvlinked and cap == 3 else 5,
    )
    assert gpu_links(fake, [0, 1, 2]) == [
        {"gpus": [0, 1], "topology": "host bridges of one NUMA node", "p2p_nvlink": "ok"},
        {"gpus": [0, 2], "topology": "across NUMA nodes", "p2p_nvlink": "not supported"},
        {"gpus": [1, 2], "topology": "across NUMA nodes", "p2p_nvlink": "not supported"},
    ]


class TwoGpuNvml:
    """A fake pynvml module of one host with two GPUs (NVML indices 0 and 1) of different names,
    so which one a reading came from shows."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1
    NVML_FEATURE_ENABLED, NVML_P2P_CAPS_INDEX_NVLINK, NVML_P2P_STATUS_OK = 1, 3, 0
    names = ("NVIDIA H200 (first)", "NVIDIA H200 (second)")
    uuids = ("GPU-aaaa-0000", "GPU-bbbb-1111")
    used = (1 << 30, 7 << 30)

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, j):
        return j

    def nvmlDeviceGetName(self, h):
        return self.names[h]

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h]

    def nvmlDeviceGetMemoryInfo(self, h):
        from types import SimpleNamespace

        return SimpleNamespace(total=141 << 30, used=self.used[h])

    def nvmlDeviceGetNvLinkState(self, h, link):
        raise RuntimeError("no NVLink in this fake")

    def nvmlSystemGetDriverVersion(self):
        return "580.0"

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        raise RuntimeError("unknown")

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        raise RuntimeError("unknown")


@pytest.mark.parametrize(
    ("visible", "names"),
    [
        (None, ["NVIDIA H200 (first)", "NVIDIA H200 (second)"]),
        ("0", ["NVIDIA H200 (first)"]),
        ("1", ["NVIDIA H200 (second)"]),
        ("GPU-bbbb", ["NVIDIA H200 (second)"]),
        ("1,0", ["NVIDIA H200 (second)", "NVIDIA H200 (first)"]),
        ("0,7,1", ["NVIDIA H200 (first)"]),  # CUDA stops at the first entry that names no GPU
        ("", []),
    ],
)
def test_a_run_is_filed_under_the_gpus_it_could_see(monkeypatch, visible, names):
    """CUDA_VISIBLE_DEVICES restricts a run to some of a host's GPUs; NVML ignores it. The
    run's machine, its GPU inventory and every NVML reading come from the visible GPUs only,
    numbered as CUDA numbers them: one GPU of two is a one-GPU machine."""
    import sys

    from attnbench.measure.memory import NvmlSampler, PynvmlBackend
    from attnbench.results.environment import gpu_inventory, machine_key

    fake = TwoGpuNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpus, _ = gpu_inventory()
    assert [g["name"] for g in gpus] == names
    assert [g["index"] for g in gpus] == list(range(len(names)))
    nvml_of = [fake.names.index(n) for n in names]
    assert [g["nvml_index"] for g in gpus] == nvml_of
    if names:
        assert machine_key(gpus, None).endswith(f"x{len(names)}")
    with NvmlSampler(PynvmlBackend()) as sampler:
        pass
    assert [(g["index"], g["nvml_index"], g["nvml_used_peak"]) for g in sampler.per_gpu()] == [
        (i, j, fake.used[j]) for i, j in enumerate(nvml_of)
    ]


def test_a_multi_gpu_row_is_compared_with_the_single_row_of_its_own_head_grouping():
    """Grouped key/value heads are another call: a 2-GPU row with 8 query heads over 2 K/V heads
    is divided into the single-GPU row of that shape, not the ungrouped one beside it."""
    from attnbench.report.tables.multigpu import speedup_cases
    from attnbench.sweeps.kinds.speedup.runner import trial_key

    def row(strategy, world, kv_heads, ms):
        fields = dict(strategy=strategy, world_size=world, kv_heads=kv_heads, time_ms=ms, times_ms=[ms] * 3)
        return typed_row("speedup", key=trial_key({**fields, "heads": 8}), **fields)

    rows = [row("single", 1, None, 10.0), row("single", 1, 2, 6.0), row("dp", 2, 2, 4.0)]
    assert len({r.key for r in rows}) == 3  # resume tells the two single rows apart
    (multi,) = speedup_cases(rows)
    assert multi.single.kv_heads == 2 and multi.speedup == pytest.approx(1.5)


# --- where a data-parallel call's time goes -------------------------------------------------------


def test_a_straight_line_through_exact_points_gives_its_fixed_cost_and_slope():
    """time = 2 ms + 0.5 x one-GPU time: fixed 2, per unit of work 0.5, no spread, and the
    strategy breaks even at a one-GPU call of 2 / (1 - 0.5) = 4 ms."""
    from attnbench.report.tables.call_cost import fit_line

    line = fit_line([(x, 2 + 0.5 * x) for x in (0.5, 1.0, 8.0, 100.0)])
    assert line.fixed.value == pytest.approx(2) and line.per_work.value == pytest.approx(0.5)
    assert line.fixed.high - line.fixed.low == pytest.approx(0, abs=1e-9) and line.n == 4
    assert line.break_even_ms == pytest.approx(4)
    assert fit_line([(1.0, 3.0), (2.0, 4.0)]) is None  # two points leave nothing to judge the line by
    # no cheaper per unit of work than one GPU: it never breaks even
    assert fit_line([(x, 1 + 1.2 * x) for x in (1.0, 2.0, 4.0)]).break_even_ms is None


def test_the_fit_weights_cases_by_relative_error():
    """A 1% error on a 1,000 ms case moves the fixed cost of a 0.5 ms line far less than an
    unweighted fit would let it (which would put the fixed cost near -9 ms)."""
    from attnbench.report.tables.call_cost import fit_line

    points = [(0.1, 0.55), (1.0, 1.0), (10.0, 5.5), (1000.0, 0.99 * 500.5)]
    line = fit_line(points)
    assert 0.4 < line.fixed.value < 0.6 and line.fixed.low < 0.5 < line.fixed.high


def test_a_data_parallel_speedup_is_read_in_eager_time():
    """A DataParallel or new-thread call's time is on the host and on other threads' streams,
    which GPU time on the caller's stream does not see: the speedup divides eager times even
    where both rows carry GPU time."""
    from attnbench.report.tables.multigpu import speedup_cases
    from attnbench.sweeps.kinds.speedup.runner import trial_key

    def row(strategy, world, eager, gpu):
        fields = dict(strategy=strategy, world_size=world, time_ms=eager, times_ms=[eager] * 5)
        return typed_row("speedup", key=trial_key(fields), gpu_times_ms=[gpu] * 5, gpu_time_ms=gpu, **fields)

    rows = [row("single", 1, 10.0, 9.0), row("thread", 1, 60.0, 0.5)]
    (case,) = speedup_cases(rows)
    assert case.timer == "eager" and case.speedup == pytest.approx(10 / 60)


def test_strategies_that_launch_on_other_threads_take_no_gpu_time():
    assert not strategies.get("dp").gpu_timed and not strategies.get("thread").gpu_timed
    assert strategies.get("single").gpu_timed


def test_a_results_directorys_table_and_the_report_pick_one_baseline():
    """A run whose single-GPU row is missing is compared with the latest run's, in the per-run
    CSV as in the report: one rule, never two answers to one question."""
    import io

    from attnbench.report.tables.multigpu import speedup_cases
    from attnbench.report.tables.speedup import speedup_csv
    from attnbench.sweeps.kinds.speedup.runner import trial_key

    def row(run, strategy, ms):
        fields = dict(strategy=strategy, world_size=1 if strategy == "single" else 2, seq_len=2048, batch=2)
        fields.update(impl="sdpa", config={})
        return typed_row("speedup", key=trial_key(fields), run=run, time_ms=ms, times_ms=[ms] * 5, **fields)

    def csv_speedups(rows):
        table = pd.read_csv(io.StringIO(speedup_csv(rows)))
        return list(table[table.strategy == "dp"].speedup)

    rows = [row("a", "single", 10.0), row("b", "dp", 5.0)]
    (case,) = speedup_cases(rows)
    assert case.single.run == "a" and case.speedup == pytest.approx(2.0)
    assert csv_speedups(rows) == [pytest.approx(2.0)]
    # a run with its own single-GPU row is compared with it, not with a later run's
    own = [row("a", "single", 10.0), row("b", "single", 4.0), row("b", "dp", 5.0)]
    assert [c.speedup for c in speedup_cases(own)] == csv_speedups(own) == [pytest.approx(0.8)]


def test_every_strategy_of_the_package_is_declared_without_torch_and_the_report_names_it_so():
    """Each strategy module of the package has its declaration (label, summary, order) and
    each declaration its module (the sequence-parallel trials' ``ring`` included); labels and
    order as the report reads them (an undeclared strategy by its name, last)."""
    from attnbench.plan import strategies as declared
    from attnbench.trials import strategies

    own = {n for n, s in strategies.STRATEGIES.entries().items() if s.module_name.startswith("attnbench.")}
    assert own == {d.name for d in declared.DECLARED}
    assert declared.speedup_names() == ("dp", "mp", "thread")
    assert [declared.label(n) for n in ("single", "thread", "warp")] == ["Single GPU", "New thread alone", "warp"]
    assert sorted(["thread", "warp", "mp", "single", "dp"], key=declared.order) == [
        "single",
        "dp",
        "mp",
        "thread",
        "warp",
    ]


def test_the_default_device_on_a_gpu_machine_is_cuda_with_its_gpus_counted(monkeypatch, in_process):
    """`speedup` without --device on a machine with GPUs: auto resolves to cuda before the GPUs
    are counted (they were counted only for an explicit --device cuda: "0 CUDA GPUs")."""
    from attnbench.cli import speedup as cli_speedup
    from attnbench.sweeps import runner
    from attnbench.sweeps.kinds.speedup import runner as speedup_runner

    ran = []
    monkeypatch.setattr(runner, "cuda_available", lambda: True)
    monkeypatch.setattr(cli_speedup, "_cuda_device_count", lambda: 2)
    monkeypatch.setattr(speedup_runner, "check_fits_device", lambda *a: None)  # no device to ask here
    monkeypatch.setattr(cli_speedup, "_run_speedup", lambda series, *rest: ran.append(series))
    proc = in_process("speedup", "--impl", "sdpa", "--gpus", "2", "--cases", "1024x2", "--strategy", "mp")
    assert proc.returncode == 0, proc.stderr
    (series,) = ran
    assert series.settings.device == "cuda" and series.settings.gpus == (2,)
