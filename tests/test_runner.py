"""The sweep runner in-process: series identity, verification before trials."""

import pytest

from attnbench.plan import Plan, Series, Settings
from attnbench.results import read_rows
from attnbench.results.schema import Environment
from attnbench.sweeps.runner import SweepRunner, resolve
from attnbench.trials.workload import Workload

SMALL = Settings(
    device="cpu", dtype="fp32", heads=2, head_dim=8, isolate=False, min_samples=1, target_ms=1, max_trial_seconds=30
)
DILATED = {"segment_lengths": [64], "dilation_rates": [1], "max_chunk_tokens": 1 << 19}


def run_plan(tmp_path, *series):
    plan = resolve(Plan("t", tuple(series)))
    env = Environment(machine="cpu: test")
    SweepRunner(plan, tmp_path, env).run()
    return read_rows(tmp_path)[0]


def test_points_and_max_seq_of_the_same_workload_are_separate_series(tmp_path):
    search = Series("dilated", DILATED, SMALL.with_values(kind="max-seq", start=512, max_seq_len=1024))
    points = Series("dilated", DILATED, SMALL.with_values(kind="points", seq_lens=(512, 1024)))
    rows = run_plan(tmp_path, search, points)
    trials = [r for r in rows if r["kind"] in ("max-seq", "points")]
    assert sorted((r["kind"], r["seq_len"]) for r in trials) == [
        ("max-seq", 512),
        ("max-seq", 1024),
        ("max-seq", 1024),  # the search's answer, confirmed in a second run
        ("points", 512),
        ("points", 1024),
    ]
    assert len({r["series"] for r in trials}) == 2
    # what else the host ran: its load average before and after each trial, as os reads it
    assert all(len(r["host_load"]) == 2 and min(r["host_load"]) >= 0 for r in trials)


def test_each_configuration_is_verified_before_its_trials(tmp_path):
    rows = run_plan(tmp_path, Series("dilated", DILATED, SMALL.with_values(kind="points", seq_lens=(128,))))
    kinds = [r["kind"] for r in rows]
    assert kinds.index("verify") < kinds.index("points")
    check = rows[kinds.index("verify")]
    assert check["status"] == "pass" and check["config"] == DILATED and check["dtype"] == "fp32"


@pytest.mark.slow
def test_a_configuration_that_fails_the_reference_is_not_swept(tmp_path, monkeypatch):
    from attnbench.impls.dilated import DilatedAttention

    real = DilatedAttention.forward
    monkeypatch.setattr(
        DilatedAttention, "forward", lambda self, q, k, v, is_causal=False: real(self, q, k, v, is_causal) * 1.1
    )
    plan = resolve(Plan("t", (Series("dilated", DILATED, SMALL.with_values(kind="points", seq_lens=(128,))),)))
    outcomes = SweepRunner(plan, tmp_path, Environment(machine="cpu: test")).run()
    assert [o.verified for o in outcomes] == [False]
    rows = read_rows(tmp_path)[0]
    # its checks (at the sweep's shape and a longer one) and no trial; the scaled output fails them
    assert {r["kind"] for r in rows} == {"verify"} and all(r["status"] == "fail" for r in rows)


@pytest.fixture
def scan_kind():
    """A new sweep kind, defined here in one place: time every power-of-two length from
    ``start`` to ``max_seq_len`` (its trials are points rows, so every reader knows them)."""
    from attnbench.sweeps import kinds
    from attnbench.sweeps.kinds.base import TrialKind

    class Scan(TrialKind):
        name, row_kind = "scan", "points"

        def lengths(self, s):
            n, out = s.start(), []
            while n <= s.settings.search.max_seq_len:
                out.append(n)
                n *= 2
            return out

        def trials(self, s, runner):
            return [runner.trial(s, n, "scan").status for n in self.lengths(s)]

    kinds.register(Scan())
    yield
    kinds.KINDS.entries().pop("scan")


def test_a_new_sweep_kind_is_one_registered_module(tmp_path, scan_kind):
    from attnbench.plan import build_plan

    flags = {**vars_of(SMALL), "kind": "scan", "start": 128, "max_seq_len": 512}
    plan = resolve(build_plan("t", ["dilated"], flags, DILATED))
    env = Environment(machine="cpu: test")
    outcomes = SweepRunner(plan, tmp_path, env).run()
    assert [o.result for o in outcomes] == [["ok", "ok", "ok"]]
    rows = read_rows(tmp_path)[0]
    assert [r["kind"] for r in rows][0] == "verify"
    scanned = [(r["kind"], r.get("sweep"), r["seq_len"]) for r in rows if r["kind"] != "verify"]
    assert scanned == [("points", "scan", 128), ("points", "scan", 256), ("points", "scan", 512)]
    # a resumed run replays the new kind's rows like any other's
    SweepRunner(plan, tmp_path, env, resume=True).run()
    assert len(read_rows(tmp_path)[0]) == len(rows)


def test_an_unknown_kind_is_one_line_naming_the_kinds():
    from attnbench.errors import AttnbenchError
    from attnbench.plan import build_plan

    with pytest.raises(AttnbenchError, match="unknown kind 'scan': choose from max-seq, points, speedup"):
        resolve(build_plan("t", ["naive"], {**vars_of(SMALL), "kind": "scan"}, {}))


@pytest.mark.parametrize(
    "impl,params",
    [("sdpa", {"backend": "cudnn"}), ("sdpa", {"backend": "efficient"}), ("dilated", {**DILATED, "backend": "cudnn"})],
)
def test_a_backend_with_no_cpu_kernel_is_refused_on_the_cpu_before_any_work(impl, params):
    """torch's CPU SDPA has flash and math kernels only: the rest would fail every trial."""
    from attnbench.errors import AttnbenchError
    from attnbench.plan import build_plan

    with pytest.raises(AttnbenchError, match=f"SDPA backend {params['backend']} runs on CUDA only"):
        resolve(build_plan("t", [impl], vars_of(SMALL), params))
    resolve(build_plan("t", [impl], vars_of(SMALL), {**params, "backend": "flash"}))  # the CPU has this one


def vars_of(settings):
    """Settings as the flags build_plan takes (defaults left out)."""
    from dataclasses import fields

    default = type(settings)()
    return {
        f.name: getattr(settings, f.name)
        for f in fields(settings)
        if getattr(settings, f.name) != getattr(default, f.name)
    }


def test_a_resumed_run_does_not_check_again_what_its_rows_hold(tmp_path, monkeypatch):
    series = Series("dilated", DILATED, SMALL.with_values(kind="points", seq_lens=(128,)))
    run_plan(tmp_path, series)
    before = [r["kind"] for r in read_rows(tmp_path)[0]].count("verify")
    checked = []
    real = SweepRunner.run_checks
    monkeypatch.setattr(
        SweepRunner, "run_checks", lambda self, cases, **kw: checked.append(cases) or real(self, cases, **kw)
    )
    plan = resolve(Plan("t", (series,)))
    outcomes = SweepRunner(plan, tmp_path, Environment(machine="cpu: test"), resume=True).run()
    assert checked == [] and [o.verified for o in outcomes] == [True]
    assert [r["kind"] for r in read_rows(tmp_path)[0]].count("verify") == before >= 1


def test_a_sequence_parallel_trial_passes_its_memory_limit_to_the_launch(monkeypatch):
    """As a one-process trial does: the supervisor tells the kernel's OOM killer from another
    kill by the limit."""
    from attnbench.runtime.jobs import RankEnded
    from attnbench.sweeps import seqpar
    from attnbench.trials.trial import TrialSpec

    seen = {}

    def launch(job, spec, world, device, **kw):
        seen.update(kw)
        return [RankEnded(r, "oom", "out of memory") for r in range(world)]

    monkeypatch.setattr(seqpar, "launch", launch)
    workload = dict(
        impl="ring",
        config={},
        batch=1,
        seq_len=256,
        heads=2,
        head_dim=8,
        dtype="fp32",
        device="cpu",
        mode="fwd",
        causal=False,
    )
    row = seqpar.run_trial(TrialSpec(workload=Workload(**workload), memory_limit=64 << 20, max_trial_seconds=30), 2)
    assert seen["memory_limit"] == 64 << 20 and row.status == "oom"


def test_more_gloo_ranks_than_cores_are_warned_of_once_per_rank_count(monkeypatch):
    """On the CPU a sequence-parallel sweep may run more ranks than cores (the paths of a larger
    node, checked here); its times then include the ranks' wait for a core, and the run says so."""
    from attnbench.plan import build_plan
    from attnbench.sweeps import seqpar
    from attnbench.sweeps.runner import contention_notes

    monkeypatch.setattr(seqpar.os, "cpu_count", lambda: 2)
    flags = {"kind": "points", "seq_lens": "512", "device": "cpu", "dtype": "fp32", "gpus": "1,2,4"}
    plan = build_plan("t", ["ring", "ring-dilated"], flags, {"segment_lengths": [128], "dilation_rates": [1]})
    assert sorted(s.world_size for s in plan.series) == [1, 1, 2, 2, 4, 4]
    (note,) = contention_notes(plan)
    assert note.startswith("4 ranks on the CPU: 4 gloo ranks share 2 cores")
    assert seqpar.contention("cuda", 8) is None and seqpar.contention("cpu", 2) is None


def test_a_resumed_run_writes_a_check_of_another_call_beside_the_one_it_kept():
    """A reference check is kept once per call checked (its workload's identity) and outcome:
    the training-step check of a shape is written beside the forward check a resumed run
    kept, a ring's beside the single device's; the same check is not written twice."""
    from types import SimpleNamespace

    from attnbench.sweeps.runner import verify_identity

    from conftest import typed_row

    fwd = typed_row("verify", impl="ring", device="cpu")
    runner = SimpleNamespace(kept=[fwd], append=lambda row: written.append(row))
    written = []
    again = typed_row("verify", impl="ring", device="cpu", kv_heads=8)  # equal to the heads: no grouping
    training = typed_row("verify", impl="ring", device="cpu", mode="fwd_bwd")
    on_ranks = typed_row("verify", impl="ring", device="cpu", world_size=2, strategy="ring")
    for row in (again, training, on_ranks, training):
        SweepRunner.append_once(runner, row, verify_identity)
    assert written == [training, on_ranks]
