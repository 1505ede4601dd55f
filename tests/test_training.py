"""Training checks against the float64 reference: dq, dk, dv of every single-device
implementation at small N (`attnbench verify --mode fwd_bwd`), causal and not, on the CPU."""

import functools

import pytest
import torch

from attnbench import impls
from attnbench.impls.pieces import KeyPart, Piece, PiecewiseAttention, grads_by_recompute
from attnbench.trials.reference import (
    GRAD_TOLERANCE,
    default_cases,
    masked_attention,
    run_case,
)

from conftest import run_cli


def _cases(name, mode="fwd_bwd", grouped=False):
    cases = default_cases(name, "cpu", ["fp32"], mode)
    if name == "block-sparse":  # every pattern and ratio, causal and not, at the smaller block and shape
        cases = [
            c for c in cases if c.config["block_size"] == 16 and c.batch == 2 and (c.kv_heads is not None) == grouped
        ]
    return cases


@pytest.mark.parametrize("name", ["naive", "sdpa", "dilated", "block-sparse"])
def test_gradients_of_every_verify_configuration_match_the_reference(name):
    cases = _cases(name)
    assert {c.causal for c in cases} == {False, True}
    checks = [run_case(c, seed=i) for i, c in enumerate(cases)]
    failed = [(c.config, c.causal, r.message) for c, r in zip(cases, checks) if r.status != "pass"]
    assert not failed
    for r in checks:
        assert r.grad_tolerance == GRAD_TOLERANCE["fp32"] and all(
            0 <= getattr(r, f"rel_err_{g}") <= GRAD_TOLERANCE["fp32"] for g in ("dq", "dk", "dv")
        )


@pytest.mark.slow
def test_block_sparse_gradients_with_grouped_heads_match_for_every_pattern():
    """The grouped shape (8 query heads over 2 key/value heads) for every pattern and ratio;
    the fast suite checks it for the default pattern (tests/test_gqa.py)."""
    cases = _cases("block-sparse", grouped=True)
    assert {c.config["pattern_type"] for c in cases} == {
        "local_window",
        "dilated_sparse",
        "global_local",
        "hierarchical",
    }
    checks = [run_case(c, seed=i) for i, c in enumerate(cases)]
    assert not [(c.config, c.causal, r.message) for c, r in zip(cases, checks) if r.status != "pass"]


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
    assert row.status == "fail" and "dk" in row.message and "dq" not in row.message
    assert row.rel_err < 1e-4 and row.rel_err_dk == pytest.approx(1.0)


@pytest.mark.slow
def test_verify_cli_checks_gradients_and_refuses_sequence_parallel():
    ok = run_cli("verify", "--impl", "naive", "--device", "cpu", "--dtype", "fp32", "--mode", "fwd_bwd", "--full")
    # the matrix's 6 cases and, per head layout, a forward check at the longest length the reference affords
    assert ok.returncode == 0 and "dq err" in ok.stdout and "9 of 9 cases pass" in ok.stdout
    bad = run_cli("verify", "--impl", "ring", "--device", "cpu", "--mode", "fwd_bwd")
    assert bad.returncode == 2 and "drop --mode fwd_bwd" in bad.stderr and "Traceback" not in bad.stderr


def _float64_inputs(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3)]


def _reference_grads(impl, q, k, v, grad_out, causal):
    inputs = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    ref = masked_attention(*inputs, impl.key_mask(q.shape[1], q.shape[2], causal))
    return ref, torch.autograd.grad(ref, inputs, grad_out)


@pytest.mark.parametrize("pattern", ["local_window", "global_local"])
@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_in_several_pieces_keeps_only_the_inputs(pattern, causal):
    """Query chunks of two blocks (several pieces, and SDPA's dense rows for global_local): the
    training step runs through one node that keeps q, k, v and its own output alone,
    recomputes each piece in the backward and gets the float64 reference's gradients."""
    impl = impls.build("block-sparse", pattern_type=pattern, sparsity_ratio=0.25, block_size=16, max_chunk_tokens=32)
    q, k, v = _float64_inputs((2, 256, 3, 8), 0)
    grad_out = torch.randn(2, 256, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = impl(q, k, v, is_causal=causal)
    assert type(out.grad_fn).__name__ == "PiecewiseAttentionBackward"
    assert [s.data_ptr() for s in out.grad_fn.saved_tensors] == [x.data_ptr() for x in (q, k, v, out)]
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    ref, want = _reference_grads(impl, q, k, v, grad_out, causal)
    torch.testing.assert_close(out, ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_overlapping_pieces_count_each_row_once():
    """Equal pieces whose last overlaps its neighbour (rows 32..47 computed twice, as the flex
    layout cuts them) and key windows: the gradients are dense attention's, not doubled."""

    def dense(q, k, v):
        return masked_attention(q, k, v, torch.ones(q.shape[2], q.shape[1], k.shape[1], dtype=torch.bool))

    q, k, v = _float64_inputs((1, 64, 2, 4), 3)
    pieces = [Piece(slice(0, 48), slice(0, 64), dense), Piece(slice(32, 64), slice(0, 64), dense, fresh=48)]
    grad_out = torch.randn(1, 64, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    got = torch.autograd.grad(PiecewiseAttention.apply(q, k, v, pieces), (q, k, v), grad_out)
    inputs = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    want = torch.autograd.grad(dense(*inputs), inputs, grad_out)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def _band(q0: int, k0: int, rows: int, keys: int) -> torch.Tensor:
    """(H=1, rows, keys) mask of |i - j| <= 5 at absolute positions (some rows keep no key of a
    narrow key range)."""
    i = torch.arange(q0, q0 + rows)[:, None]
    j = torch.arange(k0, k0 + keys)[None, :]
    return ((i - j).abs() <= 5)[None]


def _band_attention_lse(q0, k0, q, k, v):
    """Band attention over a range of keys with its log-sum-exp, as a kernel returns them: a
    row that keeps no key gets output 0 and log-sum-exp -inf."""
    mask = _band(q0, k0, q.shape[1], k.shape[1])
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / q.shape[-1] ** 0.5
    kept = mask.any(-1)  # (1, rows)
    lse = torch.logsumexp(scores.masked_fill(~mask, -1e30), dim=-1)
    weights = torch.exp(scores - lse.masked_fill(~kept, 0)[..., None]).masked_fill(~mask, 0)
    out = torch.einsum("bhij,bjhd->bihd", weights, v)
    return out, torch.where(kept, lse, float("-inf")).transpose(1, 2)


def test_key_parts_carry_back_the_gradients_of_the_whole_piece():
    """Pieces whose backward takes their keys in parts (given the piece's log-sum-exp and
    delta), the last piece overlapping its neighbour, some rows keeping no key of a part:
    the gradients are band attention's, computed whole by autograd in float64."""
    q, k, v = _float64_inputs((2, 64, 3, 8), 5)
    n = 64

    def piece(r0, r1, fresh=0):
        attend_lse = functools.partial(_band_attention_lse, r0, 0)
        parts = tuple(
            KeyPart(
                slice(k0, k0 + 16),
                functools.partial(grads_by_recompute, functools.partial(_band_attention_lse, r0, k0)),
            )
            for k0 in range(0, n, 16)
        )
        return Piece(
            slice(r0, r1),
            slice(0, n),
            lambda q, k, v: attend_lse(q, k, v)[0],
            fresh=fresh,
            key_parts=parts,
            attend_lse=attend_lse,
        )

    pieces = [piece(0, 24), piece(24, 48), piece(40, 64, fresh=48)]
    grad_out = torch.randn(2, 64, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    out = PiecewiseAttention.apply(q, k, v, pieces)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    inputs = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    ref = masked_attention(*inputs, _band(0, 0, n, n).expand(3, n, n))
    want = torch.autograd.grad(ref, inputs, grad_out)
    torch.testing.assert_close(out, ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
