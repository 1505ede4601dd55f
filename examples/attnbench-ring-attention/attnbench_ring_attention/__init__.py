"""``ring-attention-pytorch``'s ``ring_flash_attn`` as a sequence-parallel attnbench implementation.

The package's ring runs in plain PyTorch (blockwise attention with a running log-sum-exp; keys
and values passed round the ring with ``torch.distributed`` point-to-point sends), so it runs on
CPU processes over gloo as on GPUs over NCCL. Each rank holds its shard of ``(B, N, H, D)``
tensors, the layout attnbench uses; ``ring_reduce_col=True`` is what makes it pass keys and
values round the ring (without it each rank attends only its own shard). With ``striped`` its
causal masking expects striped shards (rank r holds tokens r, r+P, r+2P, ...), which the adapter
declares; otherwise shards are contiguous. Its key sets are dense attention's, so its
counterpart is ``sdpa``. Nothing here imports attnbench: the contract is plain PyTorch.
"""

from __future__ import annotations

from torch import nn


class RingFlash(nn.Module):
    def __init__(self, bucket_size: int, striped: bool) -> None:
        super().__init__()
        self.bucket_size, self.striped = bucket_size, striped
        self.granularity = bucket_size  # per rank: its blocks split the shard evenly
        self.shard_layout = "striped" if striped else "contiguous"

    def forward(self, q, k, v, is_causal: bool = False):
        from ring_attention_pytorch import ring_flash_attn

        return ring_flash_attn(
            q,
            k,
            v,
            causal=is_causal,
            bucket_size=self.bucket_size,
            ring_reduce_col=True,
            striped_ring_attn=self.striped,
        )


def ring_flash(bucket_size: int = 256, striped: bool = False) -> nn.Module:
    """ring-attention-pytorch 0.5.20's ring_flash_attn: keys and values passed round the ranks."""
    return RingFlash(bucket_size, striped)


ring_flash.summary = "ring-attention-pytorch's ring_flash_attn (pip ring-attention-pytorch): a ring in plain PyTorch"
ring_flash.sequence_parallel = {"counterpart": "sdpa"}
