"""The sweep runner in-process: series identity, verification before trials."""

from dataclasses import replace

import pytest

from attnbench.plan import Plan, Series, Settings
from attnbench.results import read_rows
from attnbench.sweeps.runner import SweepRunner, resolve

SMALL = Settings(
    device="cpu", dtype="fp32", heads=2, head_dim=8, isolate=False, min_samples=1, target_ms=1, max_trial_seconds=30
)
DILATED = {"segment_lengths": [64], "dilation_rates": [1], "max_chunk_tokens": 1 << 19}


def run_plan(tmp_path, *series):
    plan = resolve(Plan("t", tuple(series)))
    env = {"machine": "cpu: test"}
    SweepRunner(plan, tmp_path, env).run()
    return read_rows(tmp_path)[0]


def test_points_and_max_seq_of_the_same_workload_are_separate_series(tmp_path):
    search = Series("dilated", DILATED, replace(SMALL, kind="max-seq", start=512, max_seq_len=1024))
    points = Series("dilated", DILATED, replace(SMALL, kind="points", seq_lens=(512, 1024)))
    rows = run_plan(tmp_path, search, points)
    trials = [r for r in rows if r["kind"] in ("max-seq", "points")]
    assert sorted((r["kind"], r["seq_len"]) for r in trials) == [
        ("max-seq", 512),
        ("max-seq", 1024),
        ("points", 512),
        ("points", 1024),
    ]
    assert len({r["series"] for r in trials}) == 2


def test_each_configuration_is_verified_before_its_trials(tmp_path):
    rows = run_plan(tmp_path, Series("dilated", DILATED, replace(SMALL, kind="points", seq_lens=(128,))))
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
    plan = resolve(Plan("t", (Series("dilated", DILATED, replace(SMALL, kind="points", seq_lens=(128,))),)))
    outcomes = SweepRunner(plan, tmp_path, {"machine": "cpu: test"}).run()
    assert [o.verified for o in outcomes] == [False]
    rows = read_rows(tmp_path)[0]
    assert [r["kind"] for r in rows] == ["verify"] and rows[0]["status"] == "fail"
