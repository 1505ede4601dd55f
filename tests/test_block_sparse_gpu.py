"""The FlexAttention path on a CUDA GPU against the float64 reference: every pattern, causal
or not, both index-row layouts, chunked (the last chunk overlapping), a block size below the
default Triton tile. Skipped without a GPU; on one: `python -m pytest -q tests/test_block_sparse_gpu.py`."""

import pytest
import torch

from attnbench import impls
from attnbench.impls import flex_kernel as fk
from attnbench.masks import PATTERN_TYPES
from attnbench.trials.reference import VerifyCase, run_case

from conftest import flex_per_head_row, flex_pieces_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("index_width", ["full", "compact"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern_type", PATTERN_TYPES)
def test_flex_on_gpu_matches_reference(pattern_type, causal, index_width):
    if index_width == "compact" and not fk.compact_indices_ok("cuda"):
        pytest.skip("this torch's FlexAttention lowering asks for full index rows")
    cfg = flex_pieces_config(pattern_type, index_width=index_width)
    row = run_case(VerifyCase("block-sparse", cfg, 1, 4096, 2, 64, causal, "bf16", "cuda"))
    assert row.status == "pass", row
    assert row.backend.startswith("flex")


def test_flex_per_head_calls_match_reference(monkeypatch):
    """Where offsets would pass 2^31, flex runs once per (batch, head): forced here at a small N."""
    row = flex_per_head_row(monkeypatch)
    assert row.status == "pass", row


@pytest.mark.parametrize("causal", [False, True])
def test_flex_past_two_to_the_31_matches_exact_rows(causal):
    """N x H x D > 2^31 (4.5M tokens, 8 heads of 64): sampled query blocks against float64."""
    impl = impls.build("block-sparse", pattern_type="local_window", block_size=128, sparsity_ratio=0.002)
    n, heads, dim, b = 4608 * 1024, 8, 64, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, n, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    with torch.no_grad():
        out = impl(q, k, v, is_causal=causal)
    p = impl.pattern(n, causal)
    for i in (0, p.num_blocks // 2, p.num_blocks - 1):
        idx, count = p.expand(i, i + 1)
        keys = (idx[0, : int(count[0])][:, None] * b + torch.arange(b)).flatten().cuda()
        qi = q[0, i * b : (i + 1) * b].double().transpose(0, 1)  # (H, b, D)
        ki, vi = (x[0, keys].double().transpose(0, 1) for x in (k, v))  # (H, keys, D)
        scores = qi @ ki.transpose(1, 2) / dim**0.5
        if causal:
            scores.masked_fill_(
                keys[None, None, :] > (i * b + torch.arange(b, device="cuda"))[None, :, None], float("-inf")
            )
        ref = (torch.softmax(scores, -1) @ vi).transpose(0, 1)
        got = out[0, i * b : (i + 1) * b].double()
        assert ((got - ref).norm() / ref.norm()).item() < 2e-2, i
