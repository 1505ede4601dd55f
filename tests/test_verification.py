"""The one reference-check orchestration that `verify`, the sweep runner and `speedup` share."""

import pytest

from attnbench.errors import AttnbenchError
from attnbench.sweeps import verification
from attnbench.trials.reference import VerifyCase

DILATED = {"segment_lengths": [64], "dilation_rates": [1], "max_chunk_tokens": 1 << 19}


def case(device="cpu", causal=False, impl="dilated", config=DILATED):
    return VerifyCase(impl, config, 1, 128, 2, 8, causal, "fp32", device)


def test_cpu_cases_run_here_and_pass_in_case_order():
    cases = [case(causal=False), case(causal=True), case(impl="sdpa", config={})]
    rows = verification.run_reference_checks(cases)
    assert [(r["impl"], r["causal"]) for r in rows] == [("dilated", False), ("dilated", True), ("sdpa", False)]
    assert all(r["status"] == "pass" and r["rel_err"] <= r["tolerance"] for r in rows)


def test_gpu_cases_run_in_a_child_process(monkeypatch):
    sent = []
    monkeypatch.setattr(
        verification,
        "run_verify_isolated",
        lambda cases, memory_limit=None, call_limit_s=None, warm=False: sent.extend(cases) or [{"n": len(cases)}],
    )
    monkeypatch.setattr(verification, "run_case", lambda c: pytest.fail("a GPU case ran in the parent"))
    cases = [case(device="cuda"), case(device="cuda", causal=True)]
    assert verification.run_reference_checks(cases) == [{"n": 2}]
    assert sent == cases


def test_a_case_that_cannot_run_is_bad_input_naming_the_fix():
    row = {
        "impl": "sdpa",
        "config": {"backend": "cudnn"},
        "dtype": "fp32",
        "device": "cpu",
        "status": "error",
        "message": "no cuDNN on cpu",
    }
    with pytest.raises(
        AttnbenchError,
        match=r"sdpa backend=cudnn cannot run fp32 on cpu: no cuDNN on cpu; "
        r"choose another --dtype",
    ):
        verification.refuse_unrunnable([{**row, "status": "fail"}, row])
    verification.refuse_unrunnable([{**row, "status": "fail"}])  # a failed check is a result, not an error
