"""The FlexAttention path on a CUDA GPU against the float64 reference: every pattern, causal
or not, both index-row layouts, chunked (the last chunk overlapping), a block size below the
default Triton tile. Skipped without a GPU; on one: `python -m pytest -q tests/test_block_sparse_gpu.py`."""

import pytest
import torch

from attnbench import impls
from attnbench.impls import block_sparse as bs
from attnbench.patterns import PATTERN_TYPES
from attnbench.reference import VerifyCase, run_case

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("index_width", ["full", "compact"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern_type", PATTERN_TYPES)
def test_flex_on_gpu_matches_reference(pattern_type, causal, index_width):
    if index_width == "compact" and not bs._compact_indices_ok("cuda"):
        pytest.skip("this torch's FlexAttention lowering asks for full index rows")
    cfg = impls.build("block-sparse", pattern_type=pattern_type, block_size=64, sparsity_ratio=0.1, kernel="flex",
                      index_width=index_width, max_chunk_tokens=64 * 12).config()
    row = run_case(VerifyCase("block-sparse", cfg, 1, 4096, 2, 64, causal, "bf16", "cuda"))
    assert row["status"] == "pass", row
    assert row["backend"].startswith("flex")
