"""The one reference-check orchestration that `verify`, the sweep runner and `speedup` share."""

from dataclasses import replace

import pytest

from attnbench.errors import AttnbenchError
from attnbench.results.schema import Check, SchemaError
from attnbench.runtime.jobs import Ran
from attnbench.sweeps import verification
from attnbench.trials import trial
from attnbench.trials.reference import VerifyCase

DILATED = {"segment_lengths": [64], "dilation_rates": [1], "max_chunk_tokens": 1 << 19}


def case(device="cpu", causal=False, impl="dilated", config=DILATED):
    return VerifyCase(impl, config, 1, 128, 2, 8, causal, "fp32", device)


def test_cpu_cases_run_here_and_pass_in_case_order():
    cases = [case(causal=False), case(causal=True), case(impl="sdpa", config={})]
    rows = verification.run_reference_checks(cases, "out", None)
    assert [(r.impl, r.causal, r.run) for r in rows] == [
        ("dilated", False, "out"),
        ("dilated", True, "out"),
        ("sdpa", False, "out"),
    ]
    assert all(r.status == "pass" and r.rel_err <= r.tolerance for r in rows)


def test_gpu_cases_run_in_a_child_process(monkeypatch):
    sent = []

    def isolated(cases, memory_limit=None, call_limit_s=None, warm=False):
        sent.extend(cases)
        return [Check(status="pass", message="", seed=i) for i in range(len(cases))]

    monkeypatch.setattr(verification, "run_verify_isolated", isolated)
    monkeypatch.setattr(verification, "run_case", lambda c: pytest.fail("a GPU case ran in the parent"))
    cases = [case(device="cuda"), case(device="cuda", causal=True)]
    rows = verification.run_reference_checks(cases, "out", None)
    assert [(r.device, r.causal, r.seed, r.status) for r in rows] == [
        ("cuda", False, 0, "pass"),
        ("cuda", True, 1, "pass"),
    ]
    assert sent == cases


@pytest.mark.parametrize(
    ("sent", "named"),
    [
        ({"status": "pass", "message": "", "rel_eror": 1e-7}, r"unknown field 'rel_eror'"),
        (
            {"status": "pass", "message": "", "rel_err": "small"},
            r"field 'rel_err' is a string \('small'\), expected a number",
        ),
        ({"message": ""}, r"missing field 'status'"),
    ],
)
def test_a_check_the_worker_sent_wrong_is_refused_naming_the_field(monkeypatch, sent, named):
    # the worker's JSON read back as run_in_child reads it
    monkeypatch.setattr(trial, "run_in_child", lambda job, *a, **k: Ran(job.read_result({"checks": [sent]}), None, {}))
    with pytest.raises(SchemaError, match=named):
        trial.run_verify_isolated([case()])


def test_a_case_that_cannot_run_is_bad_input_naming_the_fix():
    unrunnable = VerifyCase("sdpa", {"backend": "cudnn"}, 1, 128, 2, 8, False, "fp32", "cpu")
    row = unrunnable.row(Check(status="error", message="no cuDNN on cpu"), "out", None)
    with pytest.raises(
        AttnbenchError,
        match=r"sdpa backend=cudnn cannot run fp32 on cpu: no cuDNN on cpu; "
        r"choose another --dtype",
    ):
        verification.refuse_unrunnable([replace(row, status="fail"), row])
    verification.refuse_unrunnable([replace(row, status="fail")])  # a failed check is a result, not an error
