"""block-sparse against the float64 reference (every pattern x causal x two block sizes x two
ratios), its declared key sets against the rule, its counts against the mask, its FlexAttention
block masks against the block lists, and the compiled flex path itself on the CPU."""

import shutil

import pytest
import torch
from test_block_patterns import kept_by_rule

from attnbench import impls
from attnbench.impls import block_sparse as bs
from attnbench.impls import block_sparse_flex as bsf
from attnbench.impls import flex_kernel as fk
from attnbench.masks import PATTERN_TYPES
from attnbench.trials.reference import TOLERANCE, VerifyCase, default_cases, run_case

CASES = default_cases("block-sparse", "cpu", ["fp32"])
BF16_CASES = [
    c
    for c in default_cases("block-sparse", "cpu", ["bf16"])
    if c.batch == 2 and c.config["block_size"] == 16 and c.config["sparsity_ratio"] == 0.1
]


def case_id(c):
    cfg = c.config
    return (
        f"{cfg['pattern_type']}-b{cfg['block_size']}-r{cfg['sparsity_ratio']}-B{c.batch}-N{c.seq_len}-"
        f"{'causal' if c.causal else 'full'}-{c.dtype}" + (f"-kv{c.kv_heads}" if c.kv_heads else "")
    )


def test_cases_cover_every_pattern_causal_block_size_and_ratio():
    seen = {(c.config["pattern_type"], c.causal, c.config["block_size"], c.config["sparsity_ratio"]) for c in CASES}
    assert seen == {
        (t, causal, b, r) for t in PATTERN_TYPES for causal in (False, True) for b in (16, 32) for r in (0.1, 0.25)
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES + BF16_CASES, ids=case_id)
def test_gather_kernel_matches_reference(case):
    row = run_case(case)
    assert row.status == "pass", row
    assert row.rel_err <= TOLERANCE[case.dtype]
    assert row.backend.startswith("gather")


def test_a_wrong_implementation_fails_verification(monkeypatch):
    """The check can fail: separately normalised per-block softmaxes (the seeds' bug) must."""
    real = torch.nn.functional.scaled_dot_product_attention

    def per_block_softmax(q, k, v, attn_mask=None, **kw):
        if attn_mask is None:
            return real(q, k, v, **kw)
        b = q.shape[-2]
        parts = [
            real(q, k[..., s : s + b, :], v[..., s : s + b, :], attn_mask=attn_mask[..., s : s + b])
            for s in range(0, k.shape[-2], b)
        ]
        return torch.nan_to_num(torch.stack(parts)).sum(0)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", per_block_softmax)
    cfg = impls.build("block-sparse", pattern_type="local_window", block_size=16, sparsity_ratio=0.25).config()
    assert run_case(VerifyCase("block-sparse", cfg, 1, 512, 2, 16, False, "fp32", "cpu")).status == "fail"


def token_mask_by_rule(impl, n, causal):
    """docs/design/semantics.md: M(t) = union of key blocks j in P(t div b), with u <= t when causal."""
    p = impl.pattern(n, causal)
    b = impl.block_size
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(p.num_blocks):
        for j in range(p.num_blocks):
            if kept_by_rule(p.pattern_type, p.shape, p.num_blocks, causal, i, j):
                mask[i * b : (i + 1) * b, j * b : (j + 1) * b] = True
    return mask & torch.ones(n, n, dtype=torch.bool).tril() if causal else mask


@pytest.mark.parametrize("pattern_type", PATTERN_TYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_key_sets_and_counts(pattern_type, causal):
    impl = impls.build("block-sparse", pattern_type=pattern_type, block_size=16, sparsity_ratio=0.1)
    n, heads = 768, 3
    mask = impl.key_mask(n, heads, causal=causal)
    assert mask.shape == (heads, n, n)
    assert torch.equal(mask[1], token_mask_by_rule(impl, n, causal))
    assert impl.useful_pairs(n, heads, causal) == int(mask.sum())
    blocks = impl.pattern(n, causal).dense()
    assert impl.executed_pairs(n, heads, causal) == heads * int(blocks.sum()) * 16 * 16


# --- the flex path: block masks from the lists, and the compiled kernel on the CPU ---------


def block_mask_rows(mask):
    """Kept key blocks per query block of a BlockMask, read from its index tensors as the
    kernel reads them: the first kv_num_blocks entries of each row, partial and full."""
    rows = []
    for r in range(mask.kv_num_blocks.shape[-1]):
        partial = mask.kv_indices[0, 0, r, : mask.kv_num_blocks[0, 0, r]].tolist()
        full = mask.full_kv_indices[0, 0, r, : mask.full_kv_num_blocks[0, 0, r]].tolist()
        rows.append((partial, full))
    return rows


@pytest.mark.parametrize("width", ["full", "compact"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern_type", PATTERN_TYPES)
def test_block_masks_hold_the_block_lists(pattern_type, causal, width, monkeypatch):
    monkeypatch.setattr(bsf, "compact_indices_ok", lambda device_type: True)
    impl = impls.build(
        "block-sparse",
        pattern_type=pattern_type,
        block_size=16,
        sparsity_ratio=0.1,
        max_chunk_tokens=16 * 7,
        index_width=width,
    )
    n = 1024
    p = impl.pattern(n, causal)
    layout = bsf.flex_layout(impl, p, "cpu", grad=False)
    assert layout.first_row == p.dense_rows  # global rows run as dense SDPA
    covered = set()
    assert len(layout.key_starts) == len(layout.starts)
    for r0, k0 in zip(layout.starts, layout.key_starts):
        mask = bsf.block_mask(impl, p, r0, layout.rows, layout.width, "cpu", grad=False, k0=k0, window=layout.window)
        assert mask.seq_lengths == (layout.rows * 16, layout.window * 16) and k0 + layout.window <= p.num_blocks
        assert mask.kv_indices.shape[-1] == (layout.window if width == "full" else 1)
        for r, (partial, full) in enumerate(block_mask_rows(mask)):
            i = r0 + r
            partial, full = [k0 + j for j in partial], [k0 + j for j in full]
            expected = [
                j for j in range(p.num_blocks) if kept_by_rule(pattern_type, p.shape, p.num_blocks, causal, i, j)
            ]
            assert sorted(partial + full) == expected
            assert partial == ([i] if causal else [])  # only a causal diagonal block is masked
            covered.add(i)
        if width == "full":  # torch's own reading of the mask agrees
            dense = mask.to_dense()[0, 0].bool()
            kept = p.dense()[r0 : r0 + layout.rows]
            assert torch.equal(dense, kept[:, k0 : k0 + layout.window]) and kept.sum() == dense.sum()
    assert covered == set(range(layout.first_row, p.num_blocks))
    assert len({len(range(r0, r0 + layout.rows)) for r0 in layout.starts}) == 1  # one compiled shape


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern_type", PATTERN_TYPES)
def test_training_key_parts_split_each_chunk_exactly(pattern_type, causal):
    """Under autograd the wide patterns' chunks read every key; the backward takes a chunk's
    window in parts. Between them the parts' block masks hold each kept
    block of the chunk's rows exactly once (global rows included: no dense SDPA rows under
    autograd in several chunks), the diagonal as the only partial block; a part that is left out keeps none."""
    impl = impls.build(
        "block-sparse", pattern_type=pattern_type, block_size=16, sparsity_ratio=0.1, max_chunk_tokens=16 * 7
    )
    p = impl.pattern(1024, causal)
    layout = bsf.flex_layout(impl, p, "cpu", grad=True)
    assert layout.first_row == 0
    one_chunk = impls.build("block-sparse", pattern_type=pattern_type, block_size=16, sparsity_ratio=0.1)
    assert bsf.flex_layout(one_chunk, p, "cpu", grad=True).first_row == p.dense_rows  # SDPA's, joined
    if layout.window <= 2 * layout.rows:  # local_window: a chunk's neighbourhood, taken whole
        assert pattern_type == "local_window" and layout.part_starts == ()
        return
    assert layout.part_blocks >= layout.rows
    assert len(layout.part_starts) == -(-layout.window // layout.part_blocks) > 2
    for r0, k0 in zip(layout.starts, layout.key_starts):
        found = {r0 + r: [] for r in range(layout.rows)}
        for part in bsf._flex_key_parts(impl, None, None, p, layout, r0, k0, "cpu"):
            mask = part.grads.args[0].args[1]()  # grads_by_recompute(_flex_piece_lse(flex, mask, ...))
            first = part.keys.start // 16
            assert (
                mask.seq_lengths
                == (layout.rows * 16, layout.part_blocks * 16)
                == (layout.rows * 16, part.keys.stop - part.keys.start)
            )
            for r, (partial, full) in enumerate(block_mask_rows(mask)):
                found[r0 + r] += [(first + j, "partial") for j in partial] + [(first + j, "full") for j in full]
        for i, blocks in found.items():  # so no part that keeps a block was left out
            expected = [
                j for j in range(p.num_blocks) if kept_by_rule(pattern_type, p.shape, p.num_blocks, causal, i, j)
            ]
            assert sorted(j for j, _ in blocks) == expected  # each kept block once
            assert [j for j, kind in blocks if kind == "partial"] == ([i] if causal else [])


def test_long_sequences_use_narrow_index_rows_and_bounded_chunks(monkeypatch):
    monkeypatch.setattr(bsf, "compact_indices_ok", lambda device_type: True)
    impl = impls.build("block-sparse", pattern_type="global_local", block_size=128, sparsity_ratio=0.05)
    p = impl.pattern(4 << 20, causal=False)  # 4M tokens, 32,768 blocks
    layout = bsf.flex_layout(impl, p, "cuda", grad=False)
    most = int(p.row_counts[p.dense_rows :].max())
    assert layout.first_row == p.dense_rows > 0  # global rows go to dense SDPA
    assert most <= layout.width < 2 * most  # a power of two at least the fullest row
    assert layout.rows * layout.width * 4 * 2 <= bsf.INDEX_BUDGET_BYTES
    assert layout.starts[-1] + layout.rows == p.num_blocks and layout.starts[0] == p.dense_rows
    assert bsf.flex_layout(impl, p, "cuda", grad=True).width == p.num_blocks  # the backward gets full rows


@pytest.mark.slow
def test_local_window_chunks_read_their_neighbourhood_only():
    impl = impls.build("block-sparse", pattern_type="local_window", block_size=128, sparsity_ratio=0.0005)
    p = impl.pattern(32 << 20, causal=False)  # 32M tokens, 262,144 blocks
    layout = bsf.flex_layout(impl, p, "cuda", grad=False)
    w = int(p.row_counts.max())
    assert layout.window <= layout.rows + w and layout.width == layout.window
    assert layout.window * 128 * 8 * 64 < fk.FLEX_MAX_OFFSET  # 8 heads of 64: no per-head fallback
    for r0, k0 in zip(layout.starts, layout.key_starts):  # every kept block inside its window
        idx, counts = p.expand(r0, r0 + layout.rows)
        kept = idx[torch.arange(idx.shape[1])[None, :] < counts[:, None]]
        assert k0 <= int(kept.min()) and int(kept.max()) < k0 + layout.window


def test_kernel_options():
    assert fk.parse_kernel_options("BLOCK_M=128, num_warps=8,PRESCALE_QK=true") == {
        "BLOCK_M": 128,
        "num_warps": 8,
        "PRESCALE_QK": True,
    }
    with pytest.raises(bs.ConfigError, match="KEY=VALUE"):
        fk.parse_kernel_options("BLOCK_M")


needs_compiler = pytest.mark.skipif(
    not (shutil.which("g++") or shutil.which("c++")), reason="torch.compile on the CPU needs a C++ compiler"
)


@pytest.mark.slow
@needs_compiler
@pytest.mark.parametrize(
    "pattern_type,causal,chunk_tokens",
    [
        ("global_local", True, 160),  # chunked, overlapping last chunk, global rows in the mask
        ("dilated_sparse", False, 160),
        ("hierarchical", True, 1 << 20),  # one chunk: its output is returned as is
    ],
)
def test_compiled_flex_matches_reference_on_cpu(pattern_type, causal, chunk_tokens):
    cfg = impls.build(
        "block-sparse",
        pattern_type=pattern_type,
        block_size=16,
        sparsity_ratio=0.1,
        kernel="flex",
        max_chunk_tokens=chunk_tokens,
    ).config()
    row = run_case(VerifyCase("block-sparse", cfg, 2, 1024, 3, 16, causal, "fp32", "cpu"))
    assert row.status == "pass", row
    assert row.backend.startswith("flex")  # "flex+sdpa" where global rows run dense


class _CudaLike:
    is_cuda = True


@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("grad", [False, True])
def test_flex_options_tiles_divide_blocks_under_128(block_size, grad):
    # FlexAttention needs every tile to divide the sparse block; the backward reads its own
    # tile names (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2) and asserts N1 % M1 == M2 % N2 == 0
    options = fk.flex_options(_CudaLike(), block_size, {}, grad=grad)
    assert options["BLOCK_M"] == options["BLOCK_N"] == block_size
    backward = {name: options.get(name) for name in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")}
    if not grad:
        assert set(backward.values()) == {None}
        return
    assert all(tile >= 16 and block_size % tile == 0 for tile in backward.values()), backward
    assert backward["BLOCK_N1"] % backward["BLOCK_M1"] == 0 and backward["BLOCK_M2"] % backward["BLOCK_N2"] == 0
    if block_size == 64:
        assert backward == {"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32}


@pytest.mark.parametrize("grad", [False, True])
def test_flex_options_leave_blocks_of_128_to_the_heuristics(grad):
    assert fk.flex_options(_CudaLike(), 128, {}, grad=grad) is None
    assert fk.flex_options(_CudaLike(), 128, {}, contiguous_blocks=True, grad=grad) == {"BLOCKS_ARE_CONTIGUOUS": True}
    # a user's own tiles win; on the CPU nothing is added
    assert fk.flex_options(_CudaLike(), 64, {"BLOCK_M1": 16}, grad=True)["BLOCK_M1"] == 16
    assert fk.flex_options(torch.zeros(1), 64, {}, grad=grad) is None


def test_training_blocks_under_128_compile_with_the_autotune_tile_list():
    impl = impls.build("block-sparse", pattern_type="local_window", block_size=64, sparsity_ratio=0.1, kernel="flex")
    assert impl._flex_compile_mode(_CudaLike(), grad=True) == "max-autotune-no-cudagraphs"
    assert impl._flex_compile_mode(_CudaLike(), grad=False) == "default"
    assert impl._flex_compile_mode(torch.zeros(1), grad=True) == "default"
    wide = impls.build("block-sparse", pattern_type="local_window", block_size=128, sparsity_ratio=0.1, kernel="flex")
    assert wide._flex_compile_mode(_CudaLike(), grad=True) == "default"
