"""The ring's log-sum-exp merge kernel past 2^31 elements on a CUDA GPU (a long shard's output
in the kernels' (B, N, H, D) layout): its offsets must be 64-bit. Skipped without a GPU; on one:
`python -m pytest -q tests/test_merge_gpu.py` (seconds; about 9 GiB of GPU memory)."""

import pytest
import torch

from attnbench.impls.sequence_parallel.merge import _merge_eager, merge_into

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_merge_past_two_to_the_31_elements_reaches_the_last_rows():
    pytest.importorskip("triton")
    batch, n, heads, dim = 1, (1 << 31) // (8 * 64) + 256, 8, 64  # the last head's rows lie past 2^31
    acc = torch.zeros(batch, n, heads, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    out = torch.randn(batch, n, heads, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    lse = torch.full((batch, heads, n), float("-inf"), device="cuda")
    lse_b = torch.randn(batch, heads, n, device="cuda")
    tail = slice(n - 512, n)
    want_acc, want_lse = acc[:, :, tail].clone(), lse[:, :, tail].clone()
    _merge_eager(want_acc, want_lse, out[:, :, tail], lse_b[:, :, tail])
    merge_into(acc, lse, out, lse_b)
    torch.cuda.synchronize()
    assert torch.equal(acc[:, :, tail], want_acc)  # an empty accumulator takes the new rows as they are
    assert torch.allclose(lse[:, :, tail], want_lse)
