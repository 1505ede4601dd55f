"""dilated in training: its output and gradients against the float64 masked reference's, and
a backward at the training floor: one autograd node over the fused kernels that keeps only
the log-sum-exps, not autograd through slices and concatenations (under which every in-place
write into a view cloned the whole output gradient, and every strided slice built a
full-size gradient per input)."""

import math

import pytest
import torch

from attnbench import impls

CONFIGS = [
    ({"segment_lengths": [16, 32], "dilation_rates": [1, 2]}, 5, False),
    ({"segment_lengths": [8, 16, 32], "dilation_rates": [1, 2, 4], "max_chunk_tokens": 16}, 7, True),
    ({"segment_lengths": [32, 32], "dilation_rates": [4, 2]}, 4, False),
    ({"segment_lengths": [16, 32], "dilation_rates": [2, 4], "hilbert": True}, 3, False),
]


def differentiable_reference(q, k, v, mask):
    """docs/design/semantics.md's masked attention in float64, kept on the autograd tape: a softmax over
    each query's key set, zero rows for empty sets."""
    scores = torch.einsum("bthd,buhd->bhtu", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # an empty set's row is all -inf
    return torch.einsum("bhtu,buhd->bthd", probs, v)


def _inputs(batch, seq_len, heads, seed):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, seq_len, heads, 8, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3)
    ]


@pytest.mark.parametrize("config, heads, causal", CONFIGS, ids=lambda x: str(x))
def test_gradients_match_the_masked_reference(config, heads, causal):
    impl = impls.build("dilated", **config)
    seq_len = 64
    q, k, v = _inputs(2, seq_len, heads, 0)
    grad_out = torch.randn(2, seq_len, heads, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = impl(q, k, v, is_causal=causal)
    got = torch.autograd.grad(out, (q, k, v), grad_out)

    q2, k2, v2 = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    ref = differentiable_reference(q2, k2, v2, impl.key_mask(seq_len, heads, causal))
    want = torch.autograd.grad(ref, (q2, k2, v2), grad_out)

    torch.testing.assert_close(out, ref)
    with torch.no_grad():  # the forward-only path computes the same output
        torch.testing.assert_close(impl(q, k, v, is_causal=causal), ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def _graph_nodes(fn):
    seen, stack = set(), [fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return [type(n).__name__ for n in seen]


def test_backward_graph_is_one_node_that_keeps_only_the_log_sum_exps():
    """Between the output and the inputs there is one node (no per-chunk slices, copies or
    concatenations whose backward builds full-size gradients), and what it keeps besides q, k,
    v and the output is one log-sum-exp per kept query and head: N/r x Hg per group."""
    batch, seq_len, heads = 2, 128, 5
    impl = impls.build("dilated", segment_lengths=[16, 32], dilation_rates=[1, 2], max_chunk_tokens=32)
    q, k, v = _inputs(batch, seq_len, heads, 2)
    out = impl(q, k, v)
    assert sorted(_graph_nodes(out.grad_fn)) == ["AccumulateGrad"] * 3 + ["DilatedTrainingBackward"]
    lse_elements = sum(call.lse.numel() for call in out.grad_fn.calls)
    groups = impl.groups(heads)
    assert lse_elements == sum(batch * seq_len // g.dilation_rate * (g.heads.stop - g.heads.start) for g in groups)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 4 and all(s.data_ptr() == x.data_ptr() for s, x in zip(saved, (q, k, v, out)))


def test_training_chunks_are_a_sixteenth_of_the_sequence_at_most():
    from attnbench.impls.pieces import training_chunk_tokens

    assert training_chunk_tokens(1 << 20, 1 << 19) == 1 << 16
    assert training_chunk_tokens(1 << 24, 1 << 19) == 1 << 19
    impl = impls.build("dilated", segment_lengths=[16, 32], dilation_rates=[1, 2], max_chunk_tokens=32)
    q, k, v = _inputs(1, 512, 4, 4)
    # 32 tokens a call: 2 segments of 16, 1 of 32, so 16 calls per group
    assert len(impl(q, k, v).grad_fn.calls) == 16 + 16


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_an_expanded_output_gradient_and_each_cpu_backend(backend):
    """out.sum().backward() hands the backward an expanded (stride 0) gradient; the math backend
    recomputes each chunk under autograd instead of calling a fused backward."""
    impl = impls.build("dilated", segment_lengths=[16, 32], dilation_rates=[1, 2], backend=backend)
    q, k, v = _inputs(2, 64, 4, 5)
    got = torch.autograd.grad(impl(q, k, v, is_causal=True).sum(), (q, k, v))
    q2, k2, v2 = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    want = torch.autograd.grad(differentiable_reference(q2, k2, v2, impl.key_mask(64, 4, True)).sum(), (q2, k2, v2))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert impl.last_backend == "sdpa:" + ("math" if backend == "math" else "flash-cpu")


def test_efficient_backward_gets_the_output_in_the_kernels_own_layout(monkeypatch):
    # The memory-efficient backward takes the output's batch and head strides but assumes its
    # token stride is H * D (o_strideM() in mem_eff_attention/kernel_backward.h); in bf16 it
    # computes rowsum(dO * O) from that, so a dilated, head-sliced view of the output gave wrong
    # dq and dk on an H200. What the kernel is handed must be dense (B, N, H, D) memory.
    from attnbench.impls import dilated, fused_sdpa

    got = {}

    class FakeAten:
        @staticmethod
        def _scaled_dot_product_efficient_attention_backward(grad_out, q, k, v, bias, out, lse, *rest):
            got.update(grad_out=grad_out, out=out, lse=lse)
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None

    monkeypatch.setattr(fused_sdpa, "aten", FakeAten)
    x = torch.randn(2, 64, 5, 8)  # (B, N, H, D)
    g = dilated.head_groups(5, [32, 32], [4, 2])[1]
    qc, oc, gc = next(dilated.chunk_views((x, x.flip(1), x * 2), g, 2))
    assert not oc.transpose(1, 2).is_contiguous()  # the case at hand: a strided view
    lse = torch.randn(qc.shape[0], qc.shape[1], 32)
    fused_sdpa.backward(gc, qc, qc, qc, oc, fused_sdpa.Saved("efficient", False, lse, (None, None)))
    for name, view in (("out", oc), ("grad_out", gc)):
        handed = got[name]
        assert handed.transpose(1, 2).is_contiguous(), name
        assert torch.equal(handed, view), name
    assert got["lse"] is lse  # the log-sum-exp goes back exactly as the forward returned it
