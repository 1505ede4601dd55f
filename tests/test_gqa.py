"""Grouped-query attention on the CPU: every registered implementation, given fewer key/value
heads than query heads, matches the float64 reference in which query head h reads key/value
head h // (H / H_kv) (forward and, where it trains, dq, dk, dv), causal and not; says whether
it shared or copied K and V; refuses shapes it would misread. The workload's floor, FLOPs and
identity follow the key/value heads as docs/design/semantics.md counts them."""

import pytest
import torch
from test_impl_conformance import built, causal_modes

from attnbench import impls
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.impls import dense, gqa
from attnbench.results import series_key
from attnbench.results.schema import Trial
from attnbench.trials.reference import TOLERANCE, VerifyCase, masked_attention, relative_error, run_case
from attnbench.trials.workload import Workload

HEADS, HEAD_DIM = 8, 16
# key/value heads: groups of 2 and of 4 query heads (one head for all: the dilated test below)
KV_HEADS = [4, 2]
# a few seconds a case on a busy 2-core machine (FlexAttention's first call imports its compiler)
HEAVY = ("flex", "block-sparse", "block-sparse-ring")


def names(select=lambda name: True):
    return [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in impls.names() if select(n)]


def independent_reference(q, k, v, mask):
    """float64 attention with each key/value head written out for its query heads by hand."""
    group = q.shape[2] // k.shape[2]
    heads = [h // group for h in range(q.shape[2])]
    k_full, v_full = (torch.stack([x[:, :, i] for i in heads], dim=2) for x in (k, v))
    return masked_attention(q, k_full, v_full, mask)


def inputs(n, kv_heads, seed=0, batch=2):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(batch, n, HEADS, HEAD_DIM), *[(batch, n, kv_heads, HEAD_DIM)] * 2]
    return [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]


@pytest.mark.parametrize("kv_heads", KV_HEADS)
@pytest.mark.parametrize("name", names())
def test_forward_matches_the_float64_reference_with_grouped_heads(name, kv_heads):
    if "cpu" not in impls.spec(name).devices:
        pytest.skip(f"{name} runs on {', '.join(impls.spec(name).devices)} only")
    impl = built(name)
    n = impl.verify_seq_len()
    q, k, v = inputs(n, kv_heads)
    for causal in causal_modes(impl):
        ref = independent_reference(q, k, v, impl.key_mask(n, HEADS, causal))
        order = impl.shard_positions(n, 0, causal) if impls.spec(name).distributed else torch.arange(n)
        with torch.no_grad():
            out = impl(*(x[:, order].float() for x in (q, k, v)), is_causal=causal)
        assert out.shape == q.shape
        assert relative_error(out, ref[:, order]) <= TOLERANCE["fp32"], f"causal={causal}"
        assert impl.last_kv_layout in (gqa.SHARED, gqa.EXPANDED)


def trains_on_cpu(name) -> bool:
    # sequence-parallel ones run forward only; FlexAttention has no CPU backward
    return not impls.spec(name).distributed and name != "flex" and "cpu" in impls.spec(name).devices


@pytest.mark.parametrize("kv_heads", KV_HEADS)
@pytest.mark.parametrize("name", names(trains_on_cpu))
def test_gradients_match_the_float64_reference_with_grouped_heads(name, kv_heads):
    impl = built(name)
    n = impl.verify_seq_len()
    q, k, v = inputs(n, kv_heads, seed=1)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for causal in causal_modes(impl):
        got_in = [x.float().requires_grad_(True) for x in (q, k, v)]
        got = torch.autograd.grad(impl(*got_in, is_causal=causal), got_in, grad_out.float(), allow_unused=True)
        ref_in = [x.clone().requires_grad_(True) for x in (q, k, v)]
        ref = independent_reference(*ref_in, impl.key_mask(n, HEADS, causal))
        want = torch.autograd.grad(ref, ref_in, grad_out)
        for what, g, w in zip(("dq", "dk", "dv"), got, want):
            g = torch.zeros_like(w) if g is None else g
            assert g.shape == w.shape, what
            assert relative_error(g, w) <= 1e-3, f"{what} causal={causal}"


@pytest.mark.parametrize("name", ["dilated", "block-sparse", "naive", "sdpa"])
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_verify_rows_record_grouped_heads_and_pass(name, mode):
    cfg = built(name).config()
    n = built(name).verify_seq_len()
    case = VerifyCase(name, cfg, 2, n, 6, HEAD_DIM, True, "bf16", "cpu", mode=mode, kv_heads=2)
    row = case.row(run_case(case), "out", None)
    assert row.status == "pass", row
    assert row.kv_heads == 2 and row.kv_layout == gqa.SHARED
    assert row.mode == ("fwd_bwd" if mode == "fwd_bwd" else None)  # a forward check's row keeps its old keys


def test_dilated_with_one_key_value_head_is_right():
    """Each head group reads the one key/value head (it once read a slice past it: wrong output)."""
    impl = impls.build("dilated", segment_lengths=[16, 32], dilation_rates=[1, 2])
    q, k, v = inputs(64, 1, seed=3)
    out = impl(*(x.float() for x in (q, k, v)))
    ref = independent_reference(q, k, v, impl.key_mask(64, HEADS))
    assert relative_error(out, ref) <= TOLERANCE["fp32"]


def test_dilated_head_groups_split_where_key_value_heads_change():
    from attnbench.impls.dilated import head_groups

    # 8 query heads in 3 head groups (3, 3, 2) over 2 key/value heads (4 query heads each)
    runs = [
        (g.heads.start, g.heads.stop, g.kv_heads.start, g.kv_heads.stop)
        for g in head_groups(8, [8, 16, 32], [1, 2, 4], 2)
    ]
    assert runs == [(0, 3, 0, 1), (3, 4, 0, 1), (4, 6, 1, 2), (6, 8, 1, 2)]
    # aligned groups stay whole, reading two key/value heads each
    assert [(g.heads, g.kv_heads) for g in head_groups(8, [8, 16], [1, 2], 4)] == [
        (slice(0, 4), slice(0, 2)),
        (slice(4, 8), slice(2, 4)),
    ]


def test_sdpa_expand_kv_copies_and_says_so():
    impl = impls.build("sdpa", expand_kv=True)
    q, k, v = (x.float() for x in inputs(128, 2))
    out = impl(q, k, v, is_causal=True)
    assert impl.last_kv_layout == gqa.EXPANDED
    assert relative_error(out, independent_reference(*inputs(128, 2), impl.key_mask(128, HEADS, True))) <= 1e-4
    assert impl.config() == {"backend": "auto", "expand_kv": True}
    assert impls.build("sdpa").config() == {"backend": "auto"}  # rows without it keep their configuration


@pytest.mark.parametrize("name", impls.names())
def test_shapes_an_implementation_would_misread_are_refused(name):
    if "cpu" not in impls.spec(name).devices:
        pytest.skip("CUDA only")
    impl = built(name)
    n = impl.verify_seq_len()
    q = torch.randn(1, n, HEADS, HEAD_DIM)
    kv3 = torch.randn(1, n, 3, HEAD_DIM)
    with pytest.raises(ConfigError, match="equal groups"):
        impl(q, kv3, kv3)
    with pytest.raises(ConfigError, match="one shape"):
        impl(q, torch.randn(1, n, 2, HEAD_DIM), torch.randn(1, n, 4, HEAD_DIM))
    with pytest.raises(ConfigError, match="head dim"):
        impl(q, *[torch.randn(1, n, 2, HEAD_DIM * 2)] * 2)


def test_a_backend_without_a_grouped_kernel_is_unsupported_not_an_error(monkeypatch):
    """Where PyTorch's admission checks say the named backend takes the call with as many K/V
    heads as queries but not grouped, the check and the trial say unsupported."""
    monkeypatch.setattr(dense, "lacks_grouped_kernel", lambda *a: True)
    case = VerifyCase("sdpa", {"backend": "efficient"}, 1, 128, 8, HEAD_DIM, False, "fp32", "cpu", kv_heads=2)
    row = run_case(case)
    assert row.status == "unsupported"
    assert "efficient has no grouped-query kernel" in row.message and "expand_kv" in row.message
    plain = run_case(VerifyCase("sdpa", {"backend": "efficient"}, 1, 128, 8, HEAD_DIM, False, "fp32", "cpu"))
    assert plain.status == "error"  # no CPU kernel at all: not a grouped-query matter


def test_workload_floor_and_flops_follow_the_heads():
    llama = Workload("sdpa", batch=1, seq_len=1024, heads=32, kv_heads=8, head_dim=128, dtype="bf16", causal=True)
    # per token: q and out at 32 heads, k and v at 8, 128 dims, 2 bytes each
    assert llama.floor_bytes == 1024 * (2 * 32 + 2 * 8) * 128 * 2
    training = Workload(**{**llama.to_dict(), "mode": "fwd_bwd"})
    assert training.floor_bytes == 2 * llama.floor_bytes  # + dout, dq (32 heads) and dk, dv (8)
    # FLOPs count the query heads' pairs: as many as with 32 key/value heads
    full = Workload("sdpa", seq_len=1024, heads=32, head_dim=128, causal=True)
    pairs = impls.build("sdpa").useful_pairs(1024, 32, True)
    assert llama.flops(pairs) == full.flops(pairs) == 4.0 * 128 * pairs
    small = Workload("sdpa", seq_len=256, heads=32, kv_heads=8, head_dim=128, device="cpu", dtype="fp32")
    q, k, v = small.make_inputs()
    assert q.shape == (1, 256, 32, 128) and k.shape == v.shape == (1, 256, 8, 128)


def test_a_workload_without_grouping_keeps_its_keys_and_series():
    old = {"impl": "sdpa", "config": {}, "batch": 1, "seq_len": 4096, "heads": 8, "head_dim": 64}
    old.update(dtype="bf16", device="cuda", mode="fwd", causal=False)
    same = Workload(**old, kv_heads=8)
    assert same.kv_heads is None and same.to_dict() == old
    assert series_key(same.to_dict()) == series_key(old)
    assert series_key(Workload(**old, kv_heads=2).to_dict()) != series_key(old)


def test_row_identity_treats_equal_key_value_heads_as_no_grouping():
    base = {"kind": "points", "run": "r", "series": "s", "label": "l", "status": "ok", "message": "", "times_ms": []}
    base.update(impl="sdpa", config={}, batch=1, seq_len=4096, heads=8, head_dim=64, dtype="bf16")
    base.update(device="cuda", causal=False, mode="fwd")
    old = Trial.from_json({**base, "schema": 1})
    assert Trial.from_json({**base, "schema": 1, "kv_heads": 8}).identity() == old.identity()
    assert Trial.from_json({**base, "schema": 1, "kv_heads": 2}).identity() != old.identity()
    # the model preset names a shape: not part of what was measured
    assert Trial.from_json({**base, "schema": 1, "model": "seed"}).identity() == old.identity()


def test_the_heads_rule_is_refused_with_its_name():
    from attnbench.plan import build_plan

    with pytest.raises(AttnbenchError, match="--heads 8 is not a multiple of --kv-heads 3.*one of 1, 2, 4, 8"):
        build_plan("t", ["sdpa"], {"heads": 8, "kv_heads": 3, "device": "cpu"}, {})


@pytest.mark.slow
@pytest.mark.distributed
def test_the_ring_sends_key_value_blocks_at_their_own_head_count():
    """Two gloo ranks, 1024 tokens, 8 query heads over 2 key/value heads: each rank sends its
    K and V shard once, at 2 heads (a quarter of what 8 would send)."""
    from attnbench.measure.timing import TimingPolicy
    from attnbench.sweeps import seqpar
    from attnbench.trials.trial import TrialSpec
    from attnbench.trials.workload import Workload

    workload = dict(impl="ring", config={"backend": "auto"}, seq_len=1024, heads=HEADS, kv_heads=2, head_dim=HEAD_DIM)
    workload.update(dtype="fp32", device="cpu")
    spec = TrialSpec(
        workload=Workload(**workload),
        max_trial_seconds=30,
        timing=TimingPolicy(min_samples=1, max_samples=2, budget_s=30),
    )
    row = seqpar.run_trial(spec, 2)
    assert row.status == "ok", row.message
    assert [x.sent_bytes for x in row.ranks] == [2 * 512 * 2 * HEAD_DIM * 4] * 2
    assert row.floor_bytes == 512 * (2 * HEADS + 2 * 2) * HEAD_DIM * 4  # one rank's shard
    assert row.kv_layout == gqa.SHARED
