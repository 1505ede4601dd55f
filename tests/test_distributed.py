"""The torchrun launcher with gloo on CPU: every rank runs, a failing rank ends the run
quickly with its own error named."""

import os
from pathlib import Path

import pytest

from attnbench.runtime.distributed import agreed_status, launch
from attnbench.runtime.jobs import function_ref

from conftest import not_timed_out
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
@pytest.mark.parametrize("ranks", [1, 2])
def test_all_ranks_run_a_collective(ranks):
    """One rank and two; this self-test's collective on four ranks (over two nodes) is in
    tests/test_nodes.py, and the launcher's 4- and 8-rank launches in tests/test_ring.py."""
    results = launch(selftest, {}, ranks, "cpu", phase_limit_s=60)
    assert [r["rank"] for r in results] == list(range(ranks))
    assert all(r["status"] == "ok" and r["sum"] == r["expected"] == ranks * (ranks + 1) / 2 for r in results)
    assert agreed_status(results) == ("ok", "")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failing_rank_ends_the_run_with_its_error():
    results = launch(selftest, {"fail_rank": 1}, 2, "cpu", phase_limit_s=600, collective_timeout_s=60)
    # rank 0 did not wait out its collective timeout (the deadline is later still): torchrun
    # stopped it, or it failed at once on the connection rank 1 left
    assert not_timed_out(results[0]), results[0]
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


def test_a_rank_torchrun_stopped_is_no_cause_beside_one_that_said_why():
    """torchrun stops a failed rank's peers with SIGTERM: the rank that wrote its error is the
    cause, whichever torchrun saw first; a rank killed by another signal stays the cause."""
    stopped = {"status": "killed", "rank": 0, "signal": 15, "message": "SIGTERM"}
    failed = {"status": "error", "rank": 1, "message": "asked to fail", "failed_at": 5.0}
    assert agreed_status([stopped, failed]) == ("error", "rank 1: asked to fail")
    killed = {"status": "killed", "rank": 1, "signal": 9, "message": "SIGKILL"}
    broken = {"status": "error", "rank": 0, "message": "connection closed by peer", "failed_at": 6.0}
    assert agreed_status([broken, killed]) == ("killed", "rank 1: SIGKILL")
    # nobody wrote why: a signal other than torchrun's SIGTERM is the cause
    assert agreed_status([stopped, {**killed, "rank": 1}])[1] == "rank 1: SIGKILL"
