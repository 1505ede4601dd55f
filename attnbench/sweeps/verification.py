"""The reference check, as every command runs it (`verify`, `run`/`max-seq`/`bench`, `speedup`).

Cases of one-device implementations run in a child process when any is on the GPU (so the
parent never holds a CUDA context while it later supervises trials), else in this process;
sequence-parallel cases run across ranks under torchrun, against the float64 reference and
their single-device counterpart. Each check comes back typed (``schema.Check``) and its row is
the case's workload beside it (``VerifyCase.row``); one-device cases first, in case order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.impls.config import Config
from attnbench.results.schema import Environment, Verify
from attnbench.trials.reference import Shapes, VerifyCase, run_case
from attnbench.trials.trial import run_verify_isolated


def run_reference_checks(
    cases: list[VerifyCase],
    run: str,
    env: Environment | None,
    isolate: bool = False,
    memory_limit: int | None = None,
    warm: bool = False,
    call_limit_s: float | None = None,
) -> list[Verify]:
    """One verify row of ``run`` (measured in ``env``) per case; ``isolate`` runs the one-device
    cases in a child under ``memory_limit`` like a trial (always on the GPU, and for outside
    code, which never runs here), each call under a cold call's share of ``call_limit_s``;
    ``warm``: trials in worker processes follow (the first one's process starts meanwhile)."""
    ranked = [c for c in cases if impls.spec(c.impl).distributed]
    single = [c for c in cases if not impls.spec(c.impl).distributed]
    elsewhere = any(impls.outside_code_elsewhere(c.impl, c.config) for c in single)
    if isolate or elsewhere or any(c.device == "cuda" for c in single):
        checks = run_verify_isolated(single, memory_limit, call_limit_s, warm=warm)
    else:
        checks = [run_case(c) for c in single]
    rows = [case.row(check, run, env) for case, check in zip(single, checks)]
    if ranked:
        from attnbench.sweeps import seqpar  # torchrun machinery, only where a case needs ranks

        rows += [case.row(check, run, env, seqpar.STRATEGY) for case, check in seqpar.verify(ranked)]
    return rows


def config_text(config: dict[str, Any]) -> str:
    """A configuration as one key: sorted, so a check row and a series compare equal."""
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items()))


def refuse_unrunnable(rows: list[Verify]) -> None:
    """A case that cannot run at all (a dtype a backend lacks, say) is bad input, not a failed check."""
    for row in rows:
        if row.status == "error":
            raise AttnbenchError(
                f"{row.impl} {config_text(row.config)} cannot run {row.dtype} on {row.device}: "
                f"{row.message}; choose another --dtype, backend or configuration"
            )


@dataclass
class VerifyPlan:
    """What `attnbench verify` checks: one-device cases, sequence-parallel cases (on ranks),
    and the contract violations of outside implementations (found while planning)."""

    cases: list[VerifyCase]
    broken: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # configurations dense at every length checked

    def groups(self, ranks_together: bool = False) -> list[tuple[list[str], list[VerifyCase]]]:
        """The cases per implementation, in plan order: each group runs in a process of its
        own, so progress shows and rows are kept group by group; ``ranks_together``: the
        sequence-parallel implementations' cases in one group (one launch of their ranks)."""
        by_impl: dict[str, list[VerifyCase]] = {}
        for c in self.cases:
            by_impl.setdefault(c.impl, []).append(c)
        groups = [([name], cases) for name, cases in by_impl.items()]
        if not ranks_together:
            return groups
        ranked = [g for g in groups if impls.spec(g[0][0]).distributed]
        merged = ([n for names, _ in ranked for n in names], [c for _, cases in ranked for c in cases])
        return [g for g in groups if g not in ranked] + ([merged] if ranked else [])


def plan_verify(
    names: list[str] | None,
    device: str,
    dtypes: list[str],
    mode: str,
    gpus: str | None = None,
    params: dict[str, Any] | None = None,
    shapes: Shapes | None = None,
) -> VerifyPlan:
    """The reference checks for ``names`` (all registered when None): each implementation's
    verify shapes (``shapes``: the full matrix by default), causal and not, in every dtype it
    supports on ``device``, and a long check where a sparse pattern is sparse
    (``reference.with_long_checks``); ``params`` replaces the verify configurations of the
    implementations that have those parameters."""
    from attnbench.trials.reference import Shapes, default_cases, with_long_checks
    from attnbench.trials.workload import check_heads, check_workload_fields

    shapes = shapes or Shapes()
    if shapes.heads or shapes.kv_heads:
        check_heads(shapes.heads or 8, shapes.kv_heads)

    asked = names
    names = names or impls.names()
    for n in names:
        impls.spec(n)
    for d in dtypes:
        check_workload_fields(d, mode, device)
    if mode == "fwd_bwd":
        names = _single_device_only(names, asked)
    runnable = [n for n in names if device in impls.spec(n).devices]
    single = [n for n in runnable if not impls.spec(n).distributed]
    distributed = [n for n in runnable if impls.spec(n).distributed]
    configs = {n: [impls.normalize_config(n, _own_params(n, params))] for n in names} if params else {}
    cases = [
        c for n in single for c in default_cases(n, device, _dtypes_of(n, dtypes), mode, configs.get(n), shapes=shapes)
    ]
    warnings: list[str] = []
    if not shapes.seq_lens:  # lengths the command names are checked as named
        cases, warnings = with_long_checks(cases)
    cases += [
        c
        for n in distributed
        for w in _verify_worlds(gpus, device)
        for c in default_cases(n, device, _dtypes_of(n, dtypes), world=w, shapes=shapes)
    ]
    if not cases:
        raise AttnbenchError(
            f"no reference check to run: {', '.join(names)} cannot run {'/'.join(dtypes)} on {device}; "
            "see `attnbench list` for each implementation's devices and dtypes"
        )
    broken = _contract_violations([n for n in single if impls.spec(n).source], device, dtypes, configs)
    return VerifyPlan(cases, broken, warnings)


def _dtypes_of(name: str, dtypes: list[str]) -> list[str]:
    return [d for d in dtypes if d in impls.spec(name).dtypes]


def _own_params(name: str, params: Config) -> Config:
    own = {p.name for p in impls.spec(name).params}
    return {k: v for k, v in params.items() if k in own}


def _single_device_only(names: list[str], asked: list[str] | None) -> list[str]:
    """fwd_bwd checks single-device implementations; naming a sequence-parallel one is an error."""
    ranked = [n for n in names if impls.spec(n).distributed]
    if asked and ranked:
        raise AttnbenchError(
            f"verify --mode fwd_bwd checks single-device implementations; {', '.join(ranked)} "
            "runs forward only: drop --mode fwd_bwd or that --impl"
        )
    return [n for n in names if n not in ranked]


def _contract_violations(names: list[str], device: str, dtypes: list[str], configs: dict[str, list]) -> list[str]:
    """The contract checks of outside implementations (attnbench/trials/contract.py), one line each,
    run in a worker process: the code is the user's."""
    from attnbench.trials.trial import run_contract_isolated

    checks = [(n, config, dtype) for n in names for config in configs.get(n, [{}]) for dtype in _dtypes_of(n, dtypes)]
    return run_contract_isolated(checks, device)


def _verify_worlds(gpus: str | None, device: str) -> list[int]:
    """Ranks to verify sequence-parallel implementations on: as given, else 2 (1 on a
    one-GPU machine)."""
    from attnbench.sweeps import seqpar
    from attnbench.units import parse_int_list

    if gpus is None:
        worlds = [min(2, max(1, seqpar.max_ranks(device)))]
    else:
        worlds = sorted(set(parse_int_list(gpus, "gpus")))
    for w in worlds:
        seqpar.check_world(device, w)
    return worlds
