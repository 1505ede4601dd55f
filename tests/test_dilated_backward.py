"""dilated in training: its output and gradients against the float64 masked reference's, and
a backward whose work grows with the batch, not with batch x chunks x N.

Under autograd the forward must not write the groups' outputs into one shared tensor: every
in-place write into a view makes the backward clone the whole output gradient (torch's
CopySlices), once per write, so one training step of batch 8 took 2.9x one of batch 4 on an
H100. The graph check below is what makes that visible on a CPU."""

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
    """docs/semantics.md's masked attention in float64, kept on the autograd tape: a softmax over
    each query's key set, zero rows for empty sets."""
    scores = torch.einsum("bthd,buhd->bhtu", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # an empty set's row is all -inf
    return torch.einsum("bhtu,buhd->bthd", probs, v)


def _inputs(batch, seq_len, heads, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, seq_len, heads, 8, dtype=torch.float64, generator=gen, requires_grad=True)
            for _ in range(3)]


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


def test_backward_graph_has_no_in_place_writes_into_a_shared_output():
    impl = impls.build("dilated", segment_lengths=[16, 32], dilation_rates=[1, 2], max_chunk_tokens=16)
    q, k, v = _inputs(4, 64, 4, 2)
    nodes = _graph_nodes(impl(q, k, v).grad_fn)
    assert "CopySlices" not in nodes, sorted(set(nodes))
    # several chunks and batch elements all reach the inputs through attention nodes
    assert any("Attention" in n or "Softmax" in n or "Bmm" in n for n in nodes), sorted(set(nodes))


def test_backward_work_does_not_grow_with_the_number_of_chunks():
    """Each slice of an input costs its backward a gradient as large as the input: the number
    of slice nodes must not grow with the chunks (one chunk per segment here vs one in all)."""
    q, k, v = _inputs(2, 128, 4, 3)
    counts = []
    for chunk_tokens in (1 << 19, 32):
        impl = impls.build("dilated", segment_lengths=[16, 32], dilation_rates=[1, 2], max_chunk_tokens=chunk_tokens)
        nodes = _graph_nodes(impl(q, k, v).grad_fn)
        counts.append(sum(n.startswith("Slice") or n.startswith("Index") for n in nodes))
    assert counts[0] == counts[1], counts
