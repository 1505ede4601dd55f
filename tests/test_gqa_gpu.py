"""Grouped-query attention on a CUDA GPU: every single-device implementation's grouped-head
reference checks (bf16 and fp16, forward and gradients), each SDPA backend sharing K and V
or saying it cannot, and Llama-3-8B's forward peak at the floor (q and the output at 32
heads, k and v at 8). Skipped without a GPU; on one:
`python -m pytest -q tests/test_gqa_gpu.py` (a few minutes, most of it compiling FlexAttention)."""

import pytest
import torch

from attnbench import impls
from attnbench.impls import gqa
from attnbench.measure.timing import TimingPolicy
from attnbench.results.schema import Measured
from attnbench.trials.reference import VerifyCase, default_cases, run_case
from attnbench.trials.trial import TrialSpec, run_isolated
from attnbench.trials.workload import Workload

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SINGLE = [n for n in impls.names() if not impls.spec(n).distributed and "cuda" in impls.spec(n).devices]


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("name", SINGLE)
def test_grouped_heads_match_the_reference_on_the_gpu(name, mode):
    cases = [c for c in default_cases(name, "cuda", ["bf16", "fp16"], mode) if c.kv_heads]
    assert cases
    failed = [(c.config, c.causal, c.dtype, row) for c in cases if (row := run_case(c)).status != "pass"]
    assert failed == []


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("backend", ["flash", "cudnn", "math", "auto"])
def test_sdpa_backends_share_grouped_heads(backend, mode):
    row = run_case(
        VerifyCase("sdpa", {"backend": backend}, 2, 1024, 32, 128, True, "bf16", "cuda", mode=mode, kv_heads=8)
    )
    assert row.status == "pass", row
    assert row.kv_layout == gqa.SHARED


def test_the_memory_efficient_backend_is_unsupported_with_grouped_heads():
    row = run_case(VerifyCase("sdpa", {"backend": "efficient"}, 1, 1024, 32, 128, True, "bf16", "cuda", kv_heads=8))
    assert row.status == "unsupported", row
    assert "no grouped-query kernel" in row.message
    plain = run_case(VerifyCase("sdpa", {"backend": "efficient"}, 1, 1024, 32, 128, True, "bf16", "cuda"))
    assert plain.status == "pass", plain  # the same backend with K and V at 32 heads


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
@pytest.mark.parametrize("backend", ["efficient", "flash", "cudnn"])
def test_dilated_shares_or_copies_per_kernel(backend, mode):
    cfg = impls.build("dilated", segment_lengths=[256, 512], dilation_rates=[1, 2], backend=backend).config()
    row = run_case(VerifyCase("dilated", cfg, 2, 2048, 12, 64, True, "bf16", "cuda", mode=mode, kv_heads=3))
    assert row.status == "pass", row
    assert row.kv_layout == (gqa.EXPANDED if backend == "efficient" else gqa.SHARED)


def _llama_forward(config: dict, seq_len: int = 32768) -> Measured:
    """In a process of its own, as a sweep's trial runs: tensors earlier tests left in this
    process would count in its allocator peak (1.10x the floor after this file's checks)."""
    workload = dict(impl="sdpa", config=config, seq_len=seq_len, heads=32, kv_heads=8, head_dim=128)
    workload.update(dtype="bf16", device="cuda", causal=True)
    return run_isolated(
        TrialSpec(
            workload=Workload(**workload),
            max_trial_seconds=30,
            timing=TimingPolicy(min_samples=1, max_samples=2, budget_s=30),
        )
    )


@pytest.mark.parametrize("backend", ["cudnn", "flash"])
def test_llama_forward_peak_is_the_floor(backend):
    row = _llama_forward({"backend": backend})
    assert row.status == "ok", row
    assert row.floor_bytes == 32768 * (2 * 32 + 2 * 8) * 128 * 2
    assert row.peak_over_floor <= 1.02, row.peak_over_floor
    assert row.kv_layout == gqa.SHARED


def test_expanded_kv_costs_their_copies():
    row = _llama_forward({"backend": "cudnn", "expand_kv": True})
    assert row.status == "ok", row
    # K and V copied to 32 heads: (2 * 32 + 2 * 32) / (2 * 32 + 2 * 8) = 1.6x the floor at least
    assert row.peak_over_floor >= 1.6 and row.kv_layout == gqa.EXPANDED
