"""block-sparse-ring's pieces against the dense block pattern (an independent truth): what a
rank receives from another is exactly the blocks its rows keep there, the FlexAttention masks
of every ring step hold the pattern remapped onto the received blocks, and only those bytes
travel. Its outputs across 2, 4 and 8 gloo ranks are checked in test_ring.py."""

import pytest
import torch

from attnbench import impls
from attnbench.impls.block_sparse_ring import BlockSparseSchedule
from attnbench.masks import PATTERN_TYPES
from attnbench.results import read_rows

from conftest import run_cli


def ring(world, **config):
    impl = impls.build("block-sparse-ring", **{"block_size": 16, "sparsity_ratio": 0.15, **config})
    impl.world_size = world
    return impl


def needed_by_dense_pattern(dense, m, receiver, sender):
    """Blocks of ``sender`` (its numbering) kept by any row of ``receiver``."""
    return (
        dense[receiver * m : (receiver + 1) * m, sender * m : (sender + 1) * m].any(dim=0).nonzero().flatten().tolist()
    )


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern_type", PATTERN_TYPES)
def test_a_rank_receives_exactly_the_blocks_its_rows_keep(pattern_type, causal, world):
    impl = ring(world, pattern_type=pattern_type)
    p = impl.single.pattern(4096, causal)
    dense, m = p.dense(), p.num_blocks // world
    for receiver in range(world):
        for sender in range(world):
            got = impl.needed_blocks(p, world, receiver, sender, "cpu").tolist()
            assert got == needed_by_dense_pattern(dense, m, receiver, sender)
            if causal and sender > receiver:
                assert got == []  # nothing from the future travels


def test_local_window_exchanges_only_the_window_edge():
    impl = ring(2, pattern_type="local_window", sparsity_ratio=0.05)
    p = impl.single.pattern(1 << 16, causal=False)  # 4096 blocks, a window of ~205
    window = p.shape["window"] if "window" in p.shape else int(p.row_counts.max())
    got = impl.needed_blocks(p, 2, 1, 0, "cpu")
    assert 0 < len(got) <= window // 2 + 1 and got.tolist() == list(range(2048 - len(got), 2048))


def step_masks(world, rank, causal, pattern_type, max_chunk_tokens=1 << 20):
    """Every ring step's chunk masks of ``rank``, built as the GPU path builds them."""
    impl = ring(world, pattern_type=pattern_type, max_chunk_tokens=max_chunk_tokens)
    n = 2048
    p = impl.single.pattern(n, causal)
    q = torch.zeros(1, n // world, 1, 16)
    schedule = BlockSparseSchedule(impl, p, q, rank, world, use_flex=True)
    for sender in range(world):
        blocks = schedule.blocks(rank, sender)
        local = sender == rank or len(blocks) == schedule.m
        if not local and not len(blocks):
            continue
        position = (
            torch.arange(schedule.m)
            if local
            else torch.full((schedule.m,), -1).index_put_((blocks,), torch.arange(len(blocks)))
        )
        received = torch.arange(schedule.m) if local else blocks
        yield (
            p,
            schedule,
            sender,
            received,
            schedule._chunk_masks(sender, position, len(received), causal and sender == rank),
        )


@pytest.mark.parametrize("chunk_tokens", [1 << 20, 16 * 5])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern_type", PATTERN_TYPES)
def test_flex_masks_of_every_step_hold_the_pattern(pattern_type, causal, chunk_tokens):
    world = 2
    for rank in range(world):
        seen = torch.zeros(2048 // 16 // world, 2048 // 16, dtype=torch.bool)  # local rows x global key blocks
        merged = torch.zeros(world, 2048 // world, dtype=torch.int64)  # each row merged once per step
        for p, schedule, sender, received, chunks in step_masks(world, rank, causal, pattern_type, chunk_tokens):  # noqa: B007 (p is read after the loop)
            m = schedule.m
            windows = {k1 - k0 for *_, k0, k1, _ in chunks}
            assert len(windows) <= 1  # one key length per step: one compiled shape
            for t0, t1, skip, k0, k1, mask in chunks:
                merged[sender, t0 + skip : t1] += 1
                r0 = t0 // 16
                full_n, full_i = mask.full_kv_num_blocks[0, 0], mask.full_kv_indices[0, 0]
                part_n, part_i = mask.kv_num_blocks[0, 0], mask.kv_indices[0, 0]
                assert 0 <= k0 < k1 <= len(received)
                assert mask.seq_lengths == (t1 - t0, (k1 - k0) * 16)
                assert full_i.shape[-1] == k1 - k0  # full-width index rows over the key window
                for r in range(t1 // 16 - r0):
                    full = received[full_i[r, : full_n[r]] + k0] + sender * m
                    partial = received[part_i[r, : part_n[r]] + k0] + sender * m
                    i = rank * m + r0 + r
                    assert partial.tolist() == ([i] if causal and sender == rank else [])
                    seen[r0 + r, full] = True
                    seen[r0 + r, partial] = True
        assert torch.equal(seen, p.dense()[rank * m : (rank + 1) * m])  # every kept block, once per row
        assert set(merged[merged > 0].tolist()) <= {1}


@pytest.mark.slow
def test_flex_on_the_cpu_is_refused_with_the_fix(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "bench",
        "--impl",
        "block-sparse-ring",
        "--param",
        "kernel=flex",
        "--param",
        "block_size=16",
        "--seq-lens",
        "1024",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--heads",
        2,
        "--head-dim",
        16,
        "--gpus",
        2,
        "--max-trial-seconds",
        30,
        "--out",
        out,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "use kernel=gather" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_only_the_kept_blocks_travel(tmp_path):
    """A 2-rank bench: each rank sends the other exactly the blocks the other's rows keep."""
    out = tmp_path / "run"
    args = ["--param", "pattern_type=hierarchical", "--param", "block_size=16", "--param", "sparsity_ratio=0.1"]
    proc = run_cli(
        "bench",
        "--impl",
        "block-sparse-ring",
        *args,
        "--seq-lens",
        "2048",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--heads",
        2,
        "--head-dim",
        16,
        "--gpus",
        2,
        "--max-trial-seconds",
        30,
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    rows, problems = read_rows(out)
    assert problems == []
    assert all(r["status"] == "pass" for r in rows if r["kind"] == "verify")
    two = next(r for r in rows if r["kind"] == "points" and r["world_size"] == 2)
    impl = ring(2, pattern_type="hierarchical", sparsity_ratio=0.1)
    dense = impl.single.pattern(2048, False).dense()
    m = dense.shape[0] // 2
    per_block = 2 * 16 * 2 * 16 * 4  # K and V of one block: 16 tokens x 2 heads x 16 x fp32
    expected = [len(needed_by_dense_pattern(dense, m, 1 - r, r)) * per_block for r in range(2)]
    assert 0 < min(expected) and max(expected) < m * per_block  # a true subset of the shard
    assert [x["sent_bytes"] for x in sorted(two["ranks"], key=lambda x: x["rank"])] == expected


@pytest.mark.slow
def test_local_window_chunks_read_a_narrow_key_window():
    """At 8M tokens on one rank a chunk's keys are its neighbourhood, not the whole shard."""
    impl = impls.build("block-sparse-ring", pattern_type="local_window", block_size=128, sparsity_ratio=0.0005)
    impl.world_size = 1
    n = 8 << 20
    p = impl.single.pattern(n, False)
    q = torch.zeros(1, n, 1, 1)
    schedule = BlockSparseSchedule(impl, p, q, 0, 1, use_flex=True)
    chunks = schedule._chunk_masks(0, torch.arange(schedule.m), schedule.m, False)
    window = int(p.row_counts.max())
    for t0, t1, _, k0, k1, _ in chunks:
        assert k1 - k0 <= (t1 - t0) // 128 + window
    assert chunks[-1][1] == n


def test_a_chunk_plan_is_read_from_the_pattern_once(monkeypatch):
    """Masks too large to keep are built again each call, but from the plan made at the first
    (reading the pattern's lists is host work that at 4M on one rank cost most of a call)."""
    from attnbench.impls import block_sparse_ring

    monkeypatch.setattr(block_sparse_ring, "MASK_CACHE_BYTES", 0)
    impl = ring(1, pattern_type="local_window", max_chunk_tokens=16 * 8)
    p = impl.single.pattern(2048, False)
    plans = []
    real = BlockSparseSchedule._chunk_plan
    monkeypatch.setattr(BlockSparseSchedule, "_chunk_plan", lambda self, *a: plans.append(a) or real(self, *a))
    masks = []
    for _ in range(2):  # two calls: a schedule each, as the ring makes
        schedule = BlockSparseSchedule(impl, p, torch.zeros(1, 2048, 1, 16), 0, 1, use_flex=True)
        masks.append(schedule._chunk_masks(0, torch.arange(schedule.m), schedule.m, False))
    assert len(plans) == 1 and len(masks[0]) > 1
    first, second = ([m[-1].to_dense() for m in call] for call in masks)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
