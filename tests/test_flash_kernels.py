"""The Triton forward kernels (attnbench.impls.flash) against the float64 masked reference:
on the CPU under Triton's interpreter, in a fresh process (tests/flash_checks.py says why),
and compiled on a GPU (tests marked gpu), bfloat16 and float16, head dims 64 and 128."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnbench import impls
from attnbench.impls import flash
from attnbench.trials.reference import relative_error

from flash_checks import PATTERNS, block_sparse_error, cases, dilated_error, inputs, reference

FP16_TOLERANCE = 2e-3


@pytest.fixture(scope="module")
def interpreted() -> dict:
    """Every CPU case's relative error, from one interpreted process."""
    pytest.importorskip("triton")
    script = Path(__file__).with_name("flash_checks.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(cases()))
def test_kernel_matches_the_reference_under_the_interpreter(interpreted, case):
    assert interpreted[case] <= FP16_TOLERANCE  # NaN (an unwritten row) fails


@pytest.mark.slow
def test_block_sparse_kernel_in_chunks_of_rows(interpreted):
    """Block lists cut into chunks of a few rows give the same attention."""
    assert interpreted["chunks"] > 1
    assert interpreted["block-sparse global_local in chunks causal=True"] <= FP16_TOLERANCE


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("causal", [False, True])
def test_block_lists_hold_the_pattern(pattern, causal, monkeypatch):
    """Listed blocks, plus each causal row's diagonal and each dense row's allowed blocks, are
    the pattern's block mask; each chunk's order is its rows, longest first."""
    monkeypatch.setattr(flash, "CHUNK_ENTRIES", 40)
    p = impls.build("block-sparse", pattern_type=pattern, block_size=16, sparsity_ratio=0.1).pattern(1024, causal)
    nb = p.num_blocks
    mask = torch.zeros(nb, nb, dtype=torch.bool)
    chunks = flash.block_lists(p, "cpu")
    assert len(chunks) > 1
    for chunk in chunks:
        rows = list(range(chunk.first_row, chunk.stop_row))
        assert sorted(chunk.order.tolist()) == rows
        for row in rows:
            local = row - chunk.first_row
            listed = chunk.blocks[chunk.row_start[local] : chunk.row_start[local + 1]].long()
            if row < p.dense_rows:
                assert listed.numel() == 0  # a dense row's blocks are not listed
            mask[row, listed] = True
            if row < p.dense_rows:
                mask[row, : row + 1 if causal else nb] = True
            elif causal:
                mask[row, row] = True
        work = [p.row_counts[r].item() for r in chunk.order.tolist()]
        assert work == sorted(work, reverse=True)
    assert torch.equal(mask, p.dense())


def test_applies_to_what_the_kernels_take(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = inputs(1, 32, 4, 2, 16)
    assert flash.applies(q, k, v)
    assert not flash.applies(*(x.float() for x in (q, k, v)))  # a float32 dot rounds through tf32
    assert not flash.applies(*inputs(1, 32, 4, 4, 48))  # head dim
    assert not flash.applies(*inputs(1, 32, 6, 4, 16))  # query heads not a multiple of key heads
    assert not flash.applies(q.transpose(1, 3).contiguous().transpose(1, 3), k, v)  # strided last axis
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not flash.applies(q, k, v)  # CPU tensors without the interpreter


# --- on the GPU: the compiled kernels, bf16 and fp16, head dims 64 and 128 -------------------

GPU_TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_kernels_on_the_gpu(dtype, head_dim, causal):
    shape = (2, 1536, 6, 3, head_dim)
    for segments, rates in (([512, 1536], [1, 2]), ([96, 192, 384], [1, 2, 4])):
        assert dilated_error(segments, rates, shape, causal, dtype=dtype, device="cuda") <= GPU_TOLERANCE[dtype]
    for pattern in PATTERNS:
        err = block_sparse_error(pattern, 128, (1, 4096, 2, 1, head_dim), causal, dtype=dtype, device="cuda", ratio=0.1)
        assert err <= GPU_TOLERANCE[dtype], pattern


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_forward_dispatch_on_the_gpu():
    """Without autograd the Triton kernels run; under autograd the SDPA and FlexAttention paths."""
    q, k, v = inputs(1, 8192, 4, 4, 64, torch.bfloat16, "cuda")
    for impl in (
        impls.build("dilated", segment_lengths=[2048, 4096], dilation_rates=[1, 2]),
        impls.build("block-sparse", pattern_type="global_local", sparsity_ratio=0.1, kernel="triton"),
    ):
        with torch.no_grad():
            out = impl(q, k, v)
        assert impl.last_backend == "triton"
        assert relative_error(out, reference(impl, q, k, v, False)) <= 1e-2
        impl(*(x.clone().requires_grad_(True) for x in (q, k, v)))
        assert impl.last_backend != "triton"
