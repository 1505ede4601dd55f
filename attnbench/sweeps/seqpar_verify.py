"""The rank side of a sequence-parallel reference check: the rank job ``verify_job`` that
``attnbench.runtime.distributed.launch`` runs on every rank, named by ``attnbench.sweeps.seqpar``
as ``"module:function"``. (A sequence-parallel trial's ranks run the one rank job of every
placed trial, ``attnbench.trials.placed_job``, with the ``ring`` strategy.)

Every rank draws the same global inputs, calls the implementation on its shard, and rank 0
gathers the shards and compares the whole with the float64 reference and with the
single-device counterpart.
"""

from __future__ import annotations

import time
from dataclasses import replace

from attnbench.errors import ConfigError
from attnbench.impls import build_for_ranks as build
from attnbench.runtime.jobs import Place, job
from attnbench.sweeps.seqpar import Checked, RankChecks
from attnbench.trials.ranks import rank_device
from attnbench.trials.reference import TOLERANCE, Check, VerifyCase


def _maybe_fail(fail_rank: int | None, rank: int) -> None:
    """Fault injection for the tests: this rank raises while the others are already inside
    the ring waiting for it."""
    if fail_rank == rank:
        time.sleep(0.5)
        raise RuntimeError(f"rank {rank} was asked to fail")


@job
def verify_job(spec: RankChecks, place: Place) -> Checked:
    """Rank side of ``seqpar.verify``: rank 0 sends each case's check, the others nothing."""
    checks = []
    for item in spec.cases:
        started = time.monotonic()
        check = _verify_case(item.case, item.seed, place, spec.fail_rank)
        if place.rank == 0:
            checks.append(replace(check, elapsed_s=round(time.monotonic() - started, 3)))
    return Checked(checks)


def _verify_case(case: VerifyCase, seed: int, place: Place, fail_rank: int | None) -> Check | None:
    """The case's check on rank 0; None on the others, whose part ends with the gather."""
    import torch
    import torch.distributed as dist

    from attnbench.trials.reference import masked_reference, relative_error
    from attnbench.trials.workload import torch_dtype

    rank, world, dev = place.rank, place.world, rank_device(place)
    impl = build(case.impl, case.config, world)
    try:  # deterministic: every rank takes the same branch
        impl.check_shape(case.seq_len, case.heads)
        impl.check_causal(case.causal)
    except ConfigError as exc:
        return case.check(seed, "error", str(exc))
    gen = torch.Generator().manual_seed(seed)
    shape, kv_shape = case.shapes()
    # the same global inputs on every rank, rounded to the dtype so the reference sees what the ranks see
    q, k, v = (
        torch.randn(s, generator=gen, dtype=torch.float64).to(torch_dtype(case.dtype))
        for s in (shape, kv_shape, kv_shape)
    )
    positions = [impl.shard_positions(case.seq_len, r, case.causal) for r in range(world)]
    _maybe_fail(fail_rank, rank)
    with torch.no_grad():
        out = impl(*(x[:, positions[rank]].to(dev) for x in (q, k, v)), is_causal=case.causal)
    shards = [torch.empty(out.shape, dtype=torch.float32, device=dev) for _ in range(world)]
    dist.all_gather(shards, out.float().contiguous())
    if rank != 0:
        return None
    full = torch.empty(shape, dtype=torch.float32)
    for r in range(world):
        full[:, positions[r]] = shards[r].cpu()
    ref = masked_reference(q, k, v, impl.key_mask(case.seq_len, case.heads, causal=case.causal), device=dev)
    counterpart = impl.counterpart()
    with torch.no_grad():
        single = counterpart(q.to(dev), k.to(dev), v.to(dev), is_causal=case.causal).to("cpu", torch.float64)
    err, err_single = relative_error(full, ref), relative_error(full, single)
    tol = TOLERANCE[case.dtype]
    ok = err == err and err <= tol and err_single == err_single and err_single <= tol
    why = (
        ""
        if ok
        else (
            "relative error above tolerance"
            if err == err and err > tol
            else "differs from the single-device counterpart"
            if err == err
            else "non-finite output"
        )
    )
    return case.check(
        seed,
        "pass" if ok else "fail",
        why,
        rel_err=err,
        rel_err_single=err_single,
        counterpart=counterpart.name,
        backend=impl.last_backend,
        kv_layout=impl.last_kv_layout or None,
    )
