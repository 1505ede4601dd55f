"""The torchrun launcher with gloo on CPU: every rank runs, a failing rank ends the run
quickly with its own error named."""

import json
import os
from pathlib import Path

import pytest

from attnbench.runtime.distributed import agreed_status, launch
from attnbench.runtime.jobs import RankEnded, find_job, function_ref, job

from conftest import not_timed_out
from distributed_selftest import Faults, selftest


@pytest.fixture(autouse=True)
def tests_on_rank_path(monkeypatch):
    """The rank processes import the self-test job from tests/."""
    tests = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))


def test_a_rank_job_is_named_by_module_and_function_and_told_its_place():
    assert selftest.name == "distributed_selftest:selftest" and selftest.ranked
    assert find_job("distributed_selftest:selftest", ranked=True) is selftest
    with pytest.raises(TypeError, match="is a rank job"):
        find_job("distributed_selftest:selftest")  # a worker would call it without its place
    with pytest.raises(TypeError, match="not a rank job"):
        find_job("worker_jobs:whoami", ranked=True)
    with pytest.raises(ValueError, match="not importable"):
        function_ref(lambda payload: payload)


def test_a_rank_job_takes_its_place_after_its_spec_and_nothing_else():
    from dataclasses import dataclass

    @dataclass
    class Spec:
        n: int

    def two(spec: Spec, rank: int) -> Spec:
        return spec

    two.__module__, two.__qualname__ = "somewhere", "two"
    with pytest.raises(TypeError, match="its Place after it"):
        job(two)


def test_a_jobs_fields_named_as_a_rows_bookkeeping_cross_whole():
    """A row's ``source``, ``extra`` and ``layout`` are its own bookkeeping, never written; a job's
    fields of those names are data and arrive as sent (a pair count's ``source`` among them)."""
    from dataclasses import dataclass, field

    from attnbench.measure.accounting import Pairs

    @dataclass
    class Inner:
        source: str | None = None
        extra: dict = field(default_factory=dict)
        layout: str = "contiguous"

    @dataclass
    class Spec:
        parts: list[Inner]
        pairs: Pairs | None = None

    def one(spec: Spec) -> Spec:
        return spec

    one.__module__, one.__qualname__ = "somewhere", "one"
    sent = Spec([Inner("pkg.mod:fn", {"a": 1}, "zigzag")], Pairs(10, 12, "closed-form", source="pkg.mod:pairs"))
    one_job = job(one)
    assert one_job.read_spec(json.loads(json.dumps(one_job.spec_json(sent)))) == sent


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("ranks", [1, 2])
def test_all_ranks_run_a_collective(ranks):
    """One rank and two; this self-test's collective on four ranks (over two nodes) is in
    tests/test_nodes.py, and the launcher's 4- and 8-rank launches in tests/test_ring.py."""
    results = launch(selftest, Faults(), ranks, "cpu", phase_limit_s=60)
    assert [r.rank for r in results] == list(range(ranks))
    assert all(r.status == "ok" and r.result.sum == r.result.expected == ranks * (ranks + 1) / 2 for r in results)
    assert agreed_status(results) == ("ok", "")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failing_rank_ends_the_run_with_its_error():
    results = launch(selftest, Faults(fail_rank=1), 2, "cpu", phase_limit_s=600, collective_timeout_s=60)
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
    results = launch(selftest, Faults(kill_rank=1), 2, "cpu", phase_limit_s=60, collective_timeout_s=60)
    status, message = agreed_status(results)
    assert status == "killed" and message.startswith("rank 1:") and "SIGKILL" in message, message


def test_an_oom_on_any_rank_is_the_trial_status():
    results = [
        RankEnded(0, "error", "connection reset", failed_at=1.0),
        RankEnded(1, "oom", "CUDA out of memory", failed_at=2.0),
    ]
    assert agreed_status(results) == ("oom", "rank 1: CUDA out of memory")


def test_a_rank_torchrun_stopped_is_no_cause_beside_one_that_said_why():
    """torchrun stops a failed rank's peers with SIGTERM: the rank that wrote its error is the
    cause, whichever torchrun saw first; a rank killed by another signal stays the cause."""
    stopped = RankEnded(0, "killed", "SIGTERM", signal=15)
    failed = RankEnded(1, "error", "asked to fail", failed_at=5.0)
    assert agreed_status([stopped, failed]) == ("error", "rank 1: asked to fail")
    killed = RankEnded(1, "killed", "SIGKILL", signal=9)
    broken = RankEnded(0, "error", "connection closed by peer", failed_at=6.0)
    assert agreed_status([broken, killed]) == ("killed", "rank 1: SIGKILL")
    # nobody wrote why: a signal other than torchrun's SIGTERM is the cause
    assert agreed_status([stopped, killed])[1] == "rank 1: SIGKILL"
