"""Training checks against the float64 reference: dq, dk, dv of every single-device
implementation at small N (`attnbench verify --mode fwd_bwd`), causal and not, on the CPU."""

import pytest
from conftest import run_cli

from attnbench import impls
from attnbench.reference import GRAD_TOLERANCE, default_cases, run_case


def _cases(name, mode="fwd_bwd"):
    cases = default_cases(name, "cpu", ["fp32"], mode)
    if name == "block-sparse":  # every pattern and ratio, causal and not, at the smaller block and shape
        cases = [c for c in cases if c.config["block_size"] == 16 and c.batch == 2]
    return cases


@pytest.mark.parametrize("name", ["naive", "sdpa", "dilated", "block-sparse"])
def test_gradients_of_every_verify_configuration_match_the_reference(name):
    cases = _cases(name)
    assert {c.causal for c in cases} == {False, True}
    rows = [run_case(c, seed=i) for i, c in enumerate(cases)]
    failed = [(r["config"], r["causal"], r["message"]) for r in rows if r["status"] != "pass"]
    assert not failed
    for r in rows:
        assert r["mode"] == "fwd_bwd" and all(0 <= r[f"rel_err_{g}"] <= GRAD_TOLERANCE["fp32"] for g in ("dq", "dk", "dv"))


def test_a_wrong_gradient_fails(monkeypatch):
    """The check can fail: an implementation whose output is right but whose keys receive no
    gradient through one path is reported with dk (and dv) above tolerance, not dq."""
    case = _cases("sdpa")[0]
    sdpa = impls.build("sdpa")
    real_forward = type(sdpa).forward

    def forward(self, q, k, v, is_causal=False):
        return real_forward(self, q, k.detach(), v, is_causal)  # no gradient reaches k

    monkeypatch.setattr(type(sdpa), "forward", forward)
    row = run_case(case, seed=0)
    assert row["status"] == "fail" and "dk" in row["message"] and "dq" not in row["message"]
    assert row["rel_err"] < 1e-4 and row["rel_err_dk"] == pytest.approx(1.0)


def test_verify_cli_checks_gradients_and_refuses_sequence_parallel():
    ok = run_cli("verify", "--impl", "naive", "--device", "cpu", "--dtype", "fp32", "--mode", "fwd_bwd")
    assert ok.returncode == 0 and "dq err" in ok.stdout and "4 of 4 cases pass" in ok.stdout
    bad = run_cli("verify", "--impl", "ring", "--device", "cpu", "--mode", "fwd_bwd")
    assert bad.returncode == 2 and "drop --mode fwd_bwd" in bad.stderr and "Traceback" not in bad.stderr
