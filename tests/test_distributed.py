"""The torchrun launcher with gloo on CPU: every rank runs, a failing rank ends the run
quickly with its own error named."""

import os
import time
from pathlib import Path

import pytest

from attnbench.runtime.distributed import agreed_status, launch
from attnbench.runtime.worker import function_ref

from distributed_selftest import selftest


@pytest.fixture(autouse=True)
def tests_on_rank_path(monkeypatch):
    """The rank processes import the self-test job from tests/."""
    tests = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))


def test_a_job_is_named_by_module_and_function():
    assert function_ref(selftest) == "distributed_selftest:selftest"
    with pytest.raises(ValueError, match="not importable"):
        function_ref(lambda payload: payload)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_all_ranks_run_a_collective(ranks):
    results = launch(selftest, {}, ranks, "cpu", phase_limit_s=60)
    assert [r["rank"] for r in results] == list(range(ranks))
    assert all(r["status"] == "ok" and r["sum"] == r["expected"] == ranks * (ranks + 1) / 2 for r in results)
    assert agreed_status(results) == ("ok", "")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failing_rank_ends_the_run_with_its_error():
    t0 = time.monotonic()
    results = launch(selftest, {"fail_rank": 1}, 2, "cpu", phase_limit_s=60, collective_timeout_s=60)
    assert time.monotonic() - t0 < 45, "the other rank must not wait for its collective timeout"
    status, message = agreed_status(results)
    assert status == "error"
    assert message.startswith("rank 1:") and "asked to fail" in message


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_killed_from_outside_is_killed_and_named():
    """Its peer then fails on a broken connection: the signal is the cause, not the peer's error."""
    results = launch(selftest, {"kill_rank": 1}, 2, "cpu", phase_limit_s=60, collective_timeout_s=60)
    status, message = agreed_status(results)
    assert status == "killed" and message.startswith("rank 1:") and "SIGKILL" in message, message


def test_an_oom_on_any_rank_is_the_trial_status():
    results = [
        {"status": "error", "rank": 0, "message": "connection reset", "failed_at": 1.0},
        {"status": "oom", "rank": 1, "message": "CUDA out of memory", "failed_at": 2.0},
    ]
    assert agreed_status(results) == ("oom", "rank 1: CUDA out of memory")
