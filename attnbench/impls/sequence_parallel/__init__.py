"""Sequence-parallel attention: one sequence split over the ranks of a process group.

Contract (docs/design/semantics.md, "Sequence-parallel variants"): inside an initialised process group of ``p``
ranks, ``forward(q, k, v, is_causal)`` takes the rank's shard ``(B, N/p, H, D)`` of q, k
and v and returns the rank's shard of the output. Which global positions a rank holds, in
which local order, is the implementation's declaration ``shard_positions(N, rank,
causal)`` (contiguous; zigzag for causal: rank r holds chunks r and 2p-1-r of 2p, so every
rank has the same causal work; curve order for the Hilbert variant). The key sets are the
single-device counterpart's (ring == dense, ring-dilated == dilated, ...), so the float64
reference and the counterpart's output check a gathered result. Outside a process group
the same module runs as a ring of one.

The engine (``run_ring``) is shared by every variant. A variant is a ``RingSchedule``:

* ``select(receiver, sender)``: which of the sender's K/V tokens and heads the receiver
  needs (deterministic, so the sender computes what to send with the same function the
  receiver uses to size its receive buffer; only those tokens travel);
* ``attend(sender, pieces)``: attend the local queries to those pieces; partial results
  (out, log-sum-exp) are merged in float32 by ``LseAccumulator``;
* ``finish()``: the output shard.

At step s (0 < s < p) rank r receives from r-s and sends to r+s (modulo p), with
``batch_isend_irecv`` into one of two preallocated receive buffers that are never the
tensors being sent (local K/V or a gathered copy). Step s+1's exchange is posted before
step s's compute, so communication overlaps compute. A schedule may instead cut a step into
pieces (``piece_tokens``: long shards, two small pieces in flight) or take every peer's
K/V in one exchange while its own block computes (``gathers``: short shards, whose steps'
fixed cost outweighs their compute). ``last_breakdown()`` splits the last call's time into
compute and waiting on communication.

A block-sparse ring is one more schedule: ``select`` = the K/V blocks of the sender that
the receiver's block pattern touches (``Selection.tokens`` may be an index tensor),
``attend`` = the block-sparse kernel with log-sum-exp over the received blocks, then the
same merge.

The package: ``engine`` (the ring: ``run_ring``, ``RingSchedule``, ``Selection``, the
log-sum-exp merge and the step clock), ``layouts`` (which positions a rank holds), ``base``
(``SequenceParallelAttention``, the base class, and the dense layout) and one module per
implementation (``ring``, ``ring_dilated``, ``ring_dilated_hilbert``, ``context_parallel``),
each declared with its family in ``attnbench/impls/families/``. ``block-sparse-ring`` lives
beside ``block-sparse`` in ``attnbench/impls/block_sparse_ring.py`` and runs on this engine.
"""
