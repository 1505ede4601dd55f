"""`attnbench speedup`: one implementation on one GPU against the multi-GPU strategies."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from attnbench.cli.base import app, console, err_console
from attnbench.cli.options import (
    BackendOpt,
    DilOpt,
    EndpointOpt,
    NnodesOpt,
    NodeRankOpt,
    OutOpt,
    ParamOpt,
    ResumeOpt,
    SegOpt,
    across_nodes,
    dated_results_dir,
    impl_params,
    nodes_of,
    resolve_device,
)
from attnbench.cli.progress import SpeedupReporter
from attnbench.errors import interrupt_exit_code
from attnbench.plan.strategies import speedup_names


@app.command(order=100)
def speedup(
    impl: Annotated[str, typer.Option("--impl", metavar="NAME", help="implementation; see `attnbench list`")],
    gpus: Annotated[
        int, typer.Option("--gpus", metavar="P", help="GPUs to spread over (on --device cpu: processes)")
    ] = 2,
    cases: Annotated[
        Optional[str],
        typer.Option(
            "--cases",
            metavar="LIST",
            help="SEQLENxBATCH cases, e.g. 2048x8,4096x4 or 64Kx2 \\[default: the seed reports' 2048x8, 4096x4, 8192x2 and 16384x1; mp skips 16384x1, which one batch cannot split]",
        ),
    ] = None,
    strategy: Annotated[
        str,
        typer.Option(
            "--strategy",
            metavar="LIST",
            help=f"{', '.join(speedup_names())} (comma-separated; single always runs as the baseline)",
        ),
    ] = "dp,mp",
    module: Annotated[
        str, typer.Option("--module", metavar="NAME", help="attention | multihead (q/k/v/out projections around it)")
    ] = "attention",
    grad_compression: Annotated[
        Optional[str],
        typer.Option(
            "--grad-compression", metavar="DTYPE", help="bf16 | fp16: DDP gradient compression (multihead fwd_bwd mp)"
        ),
    ] = None,
    heads: Annotated[int, typer.Option("--heads", metavar="H", help="attention heads H")] = 8,
    head_dim: Annotated[int, typer.Option("--head-dim", metavar="D", help="head dimension D")] = 64,
    dtype: Annotated[str, typer.Option("--dtype", metavar="DTYPE", help="fp32 | fp16 | bf16")] = "bf16",
    device: Annotated[str, typer.Option("--device", metavar="DEVICE", help="cpu | cuda | auto")] = "auto",
    mode: Annotated[str, typer.Option("--mode", metavar="MODE", help="fwd | fwd_bwd")] = "fwd",
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="causal masking")] = False,
    segment_lengths: SegOpt = None,
    dilation_rates: DilOpt = None,
    backend: BackendOpt = None,
    param: ParamOpt = None,
    max_trial_seconds: Annotated[
        float, typer.Option("--max-trial-seconds", metavar="S", help="one call longer than this is a time-limit")
    ] = 60.0,
    out: OutOpt = None,
    resume: ResumeOpt = False,
    nnodes: NnodesOpt = None,
    node_rank: NodeRankOpt = None,
    rdzv_endpoint: EndpointOpt = None,
) -> None:
    """Single GPU vs DataParallel vs multi-process data parallel at (sequence length x batch) cases."""
    from attnbench.plan import COMMAND_LINE, SEED_CASES, parse_settings, speedup_series
    from attnbench.results import check_output_dir

    # every value by type and range before torch is imported
    given = parse_settings(
        {
            "cases": SEED_CASES if cases is None else cases,
            "strategies": strategy,
            "module": module,
            "grad_compression": grad_compression,
            "dtype": dtype,
            "device": device,
            "heads": heads,
            "head_dim": head_dim,
            "mode": mode,
            "causal": causal,
            "max_trial_seconds": max_trial_seconds,
        },
        COMMAND_LINE,
    )
    params = impl_params(segment_lengths, dilation_rates, backend, param)
    nodes = nodes_of(nnodes, node_rank, rdzv_endpoint, worlds=[gpus])
    if out:
        check_output_dir(out)
    from attnbench.trials.supervised import run_outside_in_workers

    run_outside_in_workers(max_trial_seconds)  # an outside implementation is never imported here

    from attnbench.sweeps.kinds.speedup.runner import check_settings

    device = resolve_device(device)  # auto: cuda where a GPU is visible
    series = check_settings(
        speedup_series(impl, params, gpus=gpus, **{**given, "device": device}),
        _cuda_device_count() * nodes.count if device == "cuda" else 0,  # each node has this one's GPUs
        cases_given=cases is not None,
    )
    with across_nodes(nodes, f"speedup-{impl}") as hosts:  # any node but node 0 runs node 0's trials instead
        _run_speedup(series, hosts, impl, gpus, out, resume)


def _run_speedup(series, hosts, impl: str, gpus: int, out, resume: bool) -> None:
    from attnbench.plan import Plan
    from attnbench.report.run_files import write_run_files
    from attnbench.results.environment import capture_env
    from attnbench.sweeps.kinds.speedup.runner import order
    from attnbench.sweeps.runner import SweepRunner

    env = capture_env()
    if hosts:  # its multi-process trials spanned these nodes
        env.nodes = hosts
    out_dir = Path(out) if out else _speedup_out(series, env)
    plan = Plan(f"speedup-{impl}", (series,))
    runner = SweepRunner(plan, out_dir, env, resume=resume, speedup_reporter=SpeedupReporter())
    n = len(series.settings.speedup.cases)
    what = f"GPU{'s' * (gpus != 1)}" if series.settings.device == "cuda" else f"CPU process{'es' * (gpus != 1)}"
    console.print(
        f"attnbench speedup: {impl} on {gpus} {what} "
        f"({', '.join(order(series))}), {n} case{'s' if n != 1 else ''} on {env.machine} -> {out_dir}"
    )
    interrupted, verified = 0, True  # interrupted: the exit code of an interrupt
    try:
        verified = all(o.verified for o in runner.run())
    except KeyboardInterrupt as exc:
        interrupted = interrupt_exit_code(exc)
    if (out_dir / "trials.jsonl").exists():
        for path in write_run_files(out_dir):
            console.print(f"wrote {path}")
    if interrupted:
        err_console.print(
            f"interrupted: every finished trial is kept in {out_dir}; continue with --resume --out {out_dir}"
        )
        raise typer.Exit(interrupted)
    if not verified:
        err_console.print("the configuration failed the reference check; no speedup trial ran")
        raise typer.Exit(1)
    wrong = wrong_outputs(out_dir)
    if wrong:
        err_console.print(
            f"{len(wrong)} trial(s) returned an output that differs from the single-GPU run "
            f"({wrong[0]}): no speedup is shown for them"
        )
        raise typer.Exit(1)


def wrong_outputs(out_dir: Path) -> list[str]:
    """The speedup rows of this directory whose output did not match the single-GPU run's."""
    from attnbench.results import load_rows
    from attnbench.results.schema import Speedup

    if not (out_dir / "trials.jsonl").exists():
        return []
    rows, _ = load_rows(out_dir)
    return [
        f"{r.case} {r.strategy}: {r.output_message}" for r in rows if isinstance(r, Speedup) and r.output_match is False
    ]


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def _speedup_out(series, env) -> Path:
    st = series.settings
    machine = f"{env.gpus[0]['name']} x{st.gpus[0]}" if st.device == "cuda" and env.gpus else "cpu"
    return dated_results_dir(machine, f"speedup-{series.impl}")
