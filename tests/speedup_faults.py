"""Strategies that go wrong on purpose, for tests/test_speedup.py. The rank processes import
this module by name (the tests put tests/ on their PYTHONPATH)."""

from dataclasses import replace

from attnbench.trials import strategies
from attnbench.trials.strategies import Strategy
from attnbench.trials.strategies.mp import _prepare_mp

MP = strategies.get("mp")


def _fail_on_rank_1(ctx):
    if ctx.rank == 1:
        raise RuntimeError("rank 1 was asked to fail")
    return _prepare_mp(ctx)


def _swap_shards(ctx):
    """Computes the other rank's share of the batch but claims its own: the output check
    must catch it."""
    swapped = _prepare_mp(replace(ctx, rank=ctx.world - 1 - ctx.rank))
    share = ctx.workload.batch // ctx.world
    swapped.batch = range(ctx.rank * share, (ctx.rank + 1) * share)
    return swapped


for name, prepare in (("fail-rank-1", _fail_on_rank_1), ("swapped-shards", _swap_shards)):
    if name not in strategies.STRATEGIES.entries():
        strategies.register(
            Strategy(
                name=name,
                processes=MP.processes,
                devices=MP.devices,
                prepare=prepare,
                check=MP.check,
            )
        )
