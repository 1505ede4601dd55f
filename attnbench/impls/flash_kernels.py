"""Triton flash-attention forward kernels that read their keys where they lie and write the
output in place. Host side (applicability, tile choice, launch): ``attnbench.impls.flash``.

- ``dilated_kernel``: one head group of dilated attention. A program is one tile of one
  segment's kept queries (every ``rate``-th token from ``offset``) of one head; it reads the
  segment's kept keys with the same token stride and writes its rows of the output, and the
  zero rows of the tokens outside the dilation. No copy of q, k, v or the output is made.
- ``block_sparse_kernel``: a program is one tile of one query block of one head; it runs
  over the key blocks its row keeps (a CSR list; rows before ``dense_rows`` keep every
  allowed block and need no list), then, when causal, its own diagonal block under the mask.
  Programs are launched in the order the host gives (longest rows first), so a few long rows
  do not run as a tail.

Both take key and value heads fewer than the query heads: query head ``h`` reads key head
``h // kv_group``. Scores are scaled into base 2 once (``qk_scale = log2(e) / sqrt(D)``).
"""

from __future__ import annotations

import triton
import triton.language as tl

# A masked score: finite, so a row whose first tile is all masked gets weights that the
# next tile's rescale (exp2 of minus this) clears, never NaN
MASKED = tl.constexpr(-1.0e30)


@triton.jit
def _softmax_step(acc, l_i, m_i, q, k, v, qk_scale, mask, HAS_MASK: tl.constexpr):
    """One key tile of the online softmax: scores, running max and sum, rescaled output."""
    qk = tl.dot(q, tl.trans(k))
    if HAS_MASK:
        qk = tl.where(mask, qk * qk_scale, MASKED)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def dilated_kernel(
    Q,
    K,
    V,
    Out,
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    stride_qb,
    stride_qn,
    stride_qh,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_vb,
    stride_vn,
    stride_vh,
    stride_ob,
    stride_on,
    stride_oh,
    first_head,
    group_heads,
    kv_group,
    segments,
    segment_length,
    seq_len,
    kept,
    rate,
    offset,
    m_tiles,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    # tiles of one (segment, head) are neighbours in launch order: they share its keys in L2
    pid = tl.program_id(0)
    tile = pid % m_tiles
    rest = pid // m_tiles
    head = first_head + rest % group_heads
    rest = rest // group_heads
    segment = rest % segments
    batch = rest // segments
    kv_head = head // kv_group
    token = segment.to(tl.int64) * segment_length + offset  # the segment's first kept token
    batch64 = batch.to(tl.int64)
    q_base = Q + batch64 * stride_qb + token * stride_qn + head * stride_qh
    k_base = K + batch64 * stride_kb + token * stride_kn + kv_head * stride_kh
    v_base = V + batch64 * stride_vb + token * stride_vn + kv_head * stride_vh
    o_base = Out + batch64 * stride_ob + token * stride_on + head * stride_oh
    q_step, k_step, v_step, o_step = stride_qn * rate, stride_kn * rate, stride_vn * rate, stride_on * rate
    # with TMA: row of a 2-D view whose rows are `rate` tokens wide (see flash.dilated_descriptors)
    q_row0 = (batch64 * seq_len + segment.to(tl.int64) * segment_length) // rate

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    if USE_TMA:
        q = desc_q.load([(q_row0 + tile * BLOCK_M).to(tl.int32), head * HEAD_DIM])
    elif EVEN:
        q = tl.load(q_base + rows[:, None] * q_step + dims[None, :])
    else:
        q = tl.load(q_base + rows[:, None] * q_step + dims[None, :], mask=rows[:, None] < kept, other=0.0)

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    whole = (kept // BLOCK_N) * BLOCK_N  # key tiles with no key past the segment
    if CAUSAL:
        clean = tl.minimum(tile * BLOCK_M, whole)  # tiles wholly below this tile's diagonal
        stop = tl.minimum((tile + 1) * BLOCK_M, kept)
    else:
        clean = whole
        stop = kept
    for start in range(0, clean, BLOCK_N):
        if USE_TMA:
            k = desc_k.load([(q_row0 + start).to(tl.int32), kv_head * HEAD_DIM])
            v = desc_v.load([(q_row0 + start).to(tl.int32), kv_head * HEAD_DIM])
        else:
            k = tl.load(k_base + (start + cols)[:, None] * k_step + dims[None, :])
            v = tl.load(v_base + (start + cols)[:, None] * v_step + dims[None, :])
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, q, k, v, qk_scale, None, False)
    for start in range(clean, stop, BLOCK_N):  # the diagonal and the segment's partial tile
        keys = start + cols
        inside = keys < kept
        k = tl.load(k_base + keys[:, None] * k_step + dims[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(v_base + keys[:, None] * v_step + dims[None, :], mask=inside[:, None], other=0.0)
        mask = inside[None, :]
        if CAUSAL:
            mask = mask & (rows[:, None] >= keys[None, :])
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, q, k, v, qk_scale, mask, True)

    out = (acc / l_i[:, None]).to(Out.dtype.element_ty)
    if USE_TMA:
        desc_o.store([(q_row0 + tile * BLOCK_M).to(tl.int32), head * HEAD_DIM], out)
    elif EVEN:
        tl.store(o_base + rows[:, None] * o_step + dims[None, :], out)
    else:
        tl.store(o_base + rows[:, None] * o_step + dims[None, :], out, mask=rows[:, None] < kept)
    # the tokens of this tile's span outside the dilation: their key sets are empty, rows zero
    zero = tl.zeros([BLOCK_M, HEAD_DIM], dtype=Out.dtype.element_ty)
    for residue in range(0, rate):
        if residue != offset:
            ptrs = o_base + (residue - offset) * stride_on + rows[:, None] * o_step + dims[None, :]
            tl.store(ptrs, zero, mask=rows[:, None] < kept)


@triton.jit
def block_sparse_kernel(
    Q,
    K,
    V,
    Out,
    ORDER,
    ROW_START,
    BLOCKS,
    stride_qb,
    stride_qn,
    stride_qh,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_vb,
    stride_vn,
    stride_vh,
    stride_ob,
    stride_on,
    stride_oh,
    heads,
    kv_group,
    batch_heads,
    first_row,
    dense_rows,
    num_blocks,
    qk_scale,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    SUB_M: tl.constexpr = BLOCK_SIZE // BLOCK_M
    SUB_N: tl.constexpr = BLOCK_SIZE // BLOCK_N
    pid = tl.program_id(0)
    bh = pid % batch_heads
    rest = pid // batch_heads
    sub = rest % SUB_M
    row = tl.load(ORDER + rest // SUB_M)  # query block, in the host's order
    head = bh % heads
    batch = (bh // heads).to(tl.int64)
    kv_head = head // kv_group
    q_tokens = row.to(tl.int64) * BLOCK_SIZE + sub * BLOCK_M
    q_base = Q + batch * stride_qb + q_tokens * stride_qn + head * stride_qh
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    o_base = Out + batch * stride_ob + q_tokens * stride_on + head * stride_oh

    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_base + rows[:, None] * stride_qn + dims[None, :])
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    # kept blocks off the diagonal: a dense row's are 0, 1, ... (no list), others' are listed
    dense = row < dense_rows
    first = tl.load(ROW_START + row - first_row)
    count = tl.load(ROW_START + row - first_row + 1) - first
    if CAUSAL:
        count = tl.where(dense, row, count)
    else:
        count = tl.where(dense, num_blocks, count)
    for t in range(0, count * SUB_N):
        j = t // SUB_N
        listed = tl.load(BLOCKS + first + j, mask=row >= dense_rows, other=0)
        block = tl.where(dense, j, listed).to(tl.int64)
        keys = block * BLOCK_SIZE + (t % SUB_N) * BLOCK_N + cols
        k = tl.load(k_base + keys[:, None] * stride_kn + dims[None, :])
        v = tl.load(v_base + keys[:, None] * stride_vn + dims[None, :])
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, q, k, v, qk_scale, None, False)
    if CAUSAL:  # the diagonal block, up to the last key tile this query tile reaches
        for s in range(0, tl.cdiv((sub + 1) * BLOCK_M, BLOCK_N)):
            within = s * BLOCK_N + cols  # key positions within the block
            keys = row.to(tl.int64) * BLOCK_SIZE + within
            k = tl.load(k_base + keys[:, None] * stride_kn + dims[None, :])
            v = tl.load(v_base + keys[:, None] * stride_vn + dims[None, :])
            mask = (sub * BLOCK_M + rows)[:, None] >= within[None, :]
            acc, l_i, m_i = _softmax_step(acc, l_i, m_i, q, k, v, qk_scale, mask, True)

    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # a row that keeps no block: an empty key set, a zero row
    tl.store(o_base + rows[:, None] * stride_on + dims[None, :], (acc / l_i[:, None]).to(Out.dtype.element_ty))


__all__ = ["MASKED", "block_sparse_kernel", "dilated_kernel", "triton"]
