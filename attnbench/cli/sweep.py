"""`attnbench max-seq`, `attnbench bench` and `attnbench run`: build a plan from flags or a
profile, run it, then write its tables and print the largest sequence per implementation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.cli.base import app, console, err_console
from attnbench.cli.options import (
    BackendOpt,
    BatchOpt,
    BudgetOpt,
    CausalOpt,
    DeviceOpt,
    DilOpt,
    DtypeOpt,
    EndpointOpt,
    GpusOpt,
    HeadDimOpt,
    HeadsOpt,
    ImplOpt,
    InProcOpt,
    KvHeadsOpt,
    MemLimitOpt,
    ModelOpt,
    ModeOpt,
    NnodesOpt,
    NodeRankOpt,
    NoVerifyOpt,
    OutOpt,
    ParamOpt,
    ProfileOpt,
    RepeatOpt,
    ResumeOpt,
    SearchBudgetOpt,
    SegOpt,
    ThreadsOpt,
    TrialSecOpt,
    across_nodes,
    dated_results_dir,
    impl_params,
    nodes_of,
    settings_given,
)
from attnbench.cli.progress import RichReporter, SpeedupReporter
from attnbench.errors import AttnbenchError, interrupt_exit_code

if TYPE_CHECKING:
    from attnbench.results.schema import Row


@app.command("max-seq", order=40)
def max_seq(
    impl: ImplOpt = None,
    model: ModelOpt = None,
    heads: HeadsOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    batch: BatchOpt = None,
    dtype: DtypeOpt = None,
    device: DeviceOpt = None,
    mode: ModeOpt = None,
    causal: CausalOpt = None,
    segment_lengths: SegOpt = None,
    dilation_rates: DilOpt = None,
    backend: BackendOpt = None,
    param: ParamOpt = None,
    start: Annotated[Optional[str], typer.Option("--start", metavar="N", help="first length, e.g. 4096 or 64K")] = None,
    max_seq_len: Annotated[
        Optional[str], typer.Option("--max-seq-len", metavar="N", help="never try longer than this")
    ] = None,
    resolution: Annotated[
        Optional[str],
        typer.Option(
            "--resolution",
            metavar="N",
            help="stop once a length that runs and one that fails are this close \\[default: 1% of the answer, at least the step every length of the implementation is a multiple of]",
        ),
    ] = None,
    max_trial_seconds: TrialSecOpt = None,
    search_budget: SearchBudgetOpt = None,
    memory_limit: MemLimitOpt = None,
    gpus: GpusOpt = None,
    profile: ProfileOpt = None,
    out: OutOpt = None,
    resume: ResumeOpt = False,
    in_process: InProcOpt = None,
    timing_budget: BudgetOpt = None,
    nnodes: NnodesOpt = None,
    node_rank: NodeRankOpt = None,
    rdzv_endpoint: EndpointOpt = None,
    threads: ThreadsOpt = None,
    no_verify: NoVerifyOpt = False,
) -> None:
    """Longest sequence each implementation runs: predicted from short trials, narrowed between a length that runs and one that fails, confirmed."""
    flags = settings_given(
        {
            "kind": "max-seq",
            "model": model,
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "batch": batch,
            "dtype": dtype,
            "device": device,
            "mode": mode,
            "causal": causal,
            "start": start,
            "max_seq_len": max_seq_len,
            "resolution": resolution,
            "max_trial_seconds": max_trial_seconds,
            "search_budget_s": search_budget,
            "memory_limit": memory_limit,
            "isolate": in_process,
            "gpus": gpus,
            "timing_budget_s": timing_budget,
            "threads": threads,
        }
    )
    if profile:
        flags.pop("kind")
    elif not impl:
        raise AttnbenchError("name an implementation with --impl NAME (see `attnbench list`) or give --profile FILE")
    params = impl_params(segment_lengths, dilation_rates, backend, param)
    nodes = (nnodes, node_rank, rdzv_endpoint)
    _run_plan("max-seq", impl or [], flags, params, profile, out, resume, nodes=nodes, no_verify=no_verify)


@app.command(order=50)
def bench(
    seq_lens: Annotated[
        str, typer.Option("--seq-lens", metavar="LIST", help="lengths to time, e.g. 65536,131072 or 64K,1M")
    ],
    impl: ImplOpt = None,
    model: ModelOpt = None,
    heads: HeadsOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    batch: BatchOpt = None,
    dtype: DtypeOpt = None,
    device: DeviceOpt = None,
    mode: ModeOpt = None,
    causal: CausalOpt = None,
    segment_lengths: SegOpt = None,
    dilation_rates: DilOpt = None,
    backend: BackendOpt = None,
    param: ParamOpt = None,
    max_trial_seconds: TrialSecOpt = None,
    memory_limit: MemLimitOpt = None,
    gpus: GpusOpt = None,
    out: OutOpt = None,
    resume: ResumeOpt = False,
    in_process: InProcOpt = None,
    timing_budget: BudgetOpt = None,
    repeat: RepeatOpt = None,
    nnodes: NnodesOpt = None,
    node_rank: NodeRankOpt = None,
    rdzv_endpoint: EndpointOpt = None,
    threads: ThreadsOpt = None,
    no_verify: NoVerifyOpt = False,
) -> None:
    """Time and measure each implementation at the given sequence lengths."""
    if not impl:  # bench takes no profile: `run --profile` does
        raise AttnbenchError("name an implementation with --impl NAME (see `attnbench list`)")
    flags = settings_given(
        {
            "kind": "points",
            "seq_lens": seq_lens,
            "model": model,
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "batch": batch,
            "dtype": dtype,
            "device": device,
            "mode": mode,
            "causal": causal,
            "max_trial_seconds": max_trial_seconds,
            "memory_limit": memory_limit,
            "isolate": in_process,
            "gpus": gpus,
            "timing_budget_s": timing_budget,
            "repeat": repeat,
            "threads": threads,
        }
    )
    params = impl_params(segment_lengths, dilation_rates, backend, param)
    nodes = (nnodes, node_rank, rdzv_endpoint)
    _run_plan("bench", impl or [], flags, params, None, out, resume, nodes=nodes, no_verify=no_verify)


@app.command(order=60)
def run(
    profile: Annotated[
        str,
        typer.Option(
            "--profile", metavar="NAME", help="profile name or file; 'auto': default with a GPU, else default-cpu"
        ),
    ] = "auto",
    out: OutOpt = None,
    resume: ResumeOpt = False,
    repeat: RepeatOpt = None,
    threads: ThreadsOpt = None,
    part: Annotated[
        Optional[list[str]],
        typer.Option(
            "--part",
            metavar="PART",
            help="run only this part of the profile (repeatable); the next part continues the same --out with --resume",
        ),
    ] = None,
    nnodes: NnodesOpt = None,
    node_rank: NodeRankOpt = None,
    rdzv_endpoint: EndpointOpt = None,
    no_verify: NoVerifyOpt = False,
) -> None:
    """Run a profile's sweeps (the reference check first), then write its tables."""
    if profile == "auto":
        from attnbench.sweeps.runner import cuda_available

        profile = "default" if cuda_available() else "default-cpu"
    nodes = (nnodes, node_rank, rdzv_endpoint)
    flags = settings_given({"repeat": repeat, "threads": threads})
    _run_plan(profile, [], flags, {}, profile, out, resume, part or (), nodes=nodes, no_verify=no_verify)


def _run_plan(
    name, impl_names, flags, params, profile, out, resume, parts=(), nodes=(None, None, None), no_verify=False
) -> None:
    from attnbench.plan.series import build_plan
    from attnbench.results import check_output_dir
    from attnbench.trials.supervised import run_outside_in_workers

    if out:
        check_output_dir(out)
    run_outside_in_workers(flags.get("max_trial_seconds"))  # an outside implementation is never imported here
    planned = build_plan(name, impl_names, flags, params, profile, parts)  # bad options stop here, before torch
    if no_verify:  # as a profile's verify = false: the rows say so, the report marks them
        planned = replace(planned, verify=False)
    spread = nodes_of(*nodes, worlds=_world_sizes(planned))

    from attnbench.sweeps.runner import resolve

    plan = resolve(planned)
    with across_nodes(spread, plan.name) as hosts:  # any node but node 0 runs node 0's trials instead
        _run_resolved(plan, hosts, out, resume)


def _world_sizes(plan) -> list[int]:
    """The ranks of every multi-process trial the plan may start (a speedup series: its GPUs)."""
    return [
        (s.settings.gpus[0] if s.settings.gpus else 2) if s.settings.kind == "speedup" else s.world_size
        for s in plan.series
    ]


def _run_resolved(plan, hosts, out, resume) -> None:
    from attnbench.report.run_files import write_run_files
    from attnbench.results import check_output_dir
    from attnbench.results.environment import capture_env
    from attnbench.sweeps.runner import SweepRunner

    env = capture_env()
    if plan.clipped:  # every row says what this machine's GPUs could not hold
        env.clipped = list(plan.clipped)
    if hosts:  # its multi-process trials spanned these nodes
        env.nodes = hosts
    out_dir = Path(out) if out else _default_out(plan, env)
    check_output_dir(out_dir)
    runner = SweepRunner(plan, out_dir, env, resume=resume, reporter=RichReporter(), speedup_reporter=SpeedupReporter())
    n = len(plan.speedups)
    speedups = f", {n} speedup run{'s' if n != 1 else ''}" if n else ""
    console.print(f"attnbench {plan.name}: {len(plan.series) - n} series{speedups} on {env.machine} -> {out_dir}")
    if plan.description:  # what the profile measures, in its own words
        console.print(f"[dim]{escape(plan.description)}[/]")
    if not plan.verify:
        err_console.print(
            "not verified: no reference check runs first (--no-verify or verify = false); every row says "
            "verified: false and the report marks it"
        )
    if plan.parts:
        running = ", ".join(plan.selected or plan.parts)
        console.print(f"parts: {', '.join(plan.parts)}; running {running}")
    for note in plan.clipped:
        err_console.print(f"clipped to the visible GPUs: {escape(note)}")
    interrupted = 0  # the exit code of an interrupt
    try:
        outcomes = runner.run()
    except KeyboardInterrupt as exc:
        interrupted, outcomes = interrupt_exit_code(exc), []
    history = runner.history  # the rows it resumed from, read on below rather than read again
    del runner
    if (out_dir / "trials.jsonl").exists():
        from attnbench.results import load_rows

        loaded = history.read_on() if history else load_rows(out_dir)  # once, for every file and readout below
        for path in write_run_files(out_dir, loaded):
            console.print(f"wrote {path}")
        _print_summary(out_dir, loaded[0])
        _scaling_readout(out_dir, loaded[0])
    if interrupted:
        err_console.print(
            f"interrupted: every finished trial is kept in {out_dir}; continue with --resume --out {out_dir}"
        )
        raise typer.Exit(interrupted)
    console.print(f"results in {out_dir}")
    if any(not o.verified for o in outcomes):
        err_console.print("some configurations failed the reference check; their sweeps did not run")
        raise typer.Exit(1)


def _print_summary(out_dir: Path, rows: list[Row] | None = None) -> None:
    """Each implementation's largest successful length and what stopped it (``rows``: out_dir's, read already)."""
    from attnbench.report.tables.sweep import max_seq_summary, max_seq_text
    from attnbench.results import load_rows
    from attnbench.units import format_bytes, token_pair

    summary = max_seq_summary(load_rows(out_dir)[0] if rows is None else rows)
    if not summary:
        return
    t = Table(title="largest sequence per implementation")
    for col in ("implementation", "dtype", "mode", "max sequence", "stopped by", "peak at max", "peak / floor"):
        t.add_column(col)
    for s in summary:
        ran, failed = token_pair(s.max_seq_len or 0, s.first_failure or 0)  # written so that they read apart
        t.add_row(
            s.label,
            s.dtype,
            s.mode,
            max_seq_text(s, {s.max_seq_len: ran}.get),
            s.stopped_by + (f" at {failed}" if s.first_failure else ""),
            format_bytes(s.peak_bytes),
            f"{s.peak_over_floor:.2f}x" if s.peak_over_floor else "-",
        )
    console.print(t)


def _scaling_readout(out_dir: Path, rows: list[Row] | None = None) -> None:
    """Sequence-parallel runs against one device in the few columns a terminal holds (ranks:
    GPUs, or processes on the CPU); sweep.md has every column. ``rows``: out_dir's, read already."""
    from attnbench.report.data import describe
    from attnbench.report.intervals import ratio_text
    from attnbench.report.tables.multigpu import ring_pairs, scaling_families
    from attnbench.results import load_rows
    from attnbench.units import format_tokens

    if rows is None:
        rows, _ = load_rows(out_dir)
    pairs, families = ring_pairs(rows), scaling_families(rows)
    if pairs:
        t = Table(title="sequence parallel against one device")
        for col in ("implementation", "sequence", "ranks", "time (ms)", "speedup", "efficiency"):
            t.add_column(col, overflow="fold")
        for p in pairs:
            speedup, efficiency = p.speedup_ci, p.efficiency_ci
            t.add_row(
                escape(describe(p.row)),
                format_tokens(p.row.seq_len),
                str(p.world_size),
                f"{p.time_ci.value:,.2f}" if p.time_ci else "-",
                f"{ratio_text(speedup.value)}x vs {p.single.impl}" if speedup else "-",
                ratio_text(efficiency.value) if efficiency else "-",
            )
        console.print(t)
    if families:
        t = Table(title="sequence parallel: largest sequence against one device")
        for col in ("implementation", "ranks", "max sequence", "stopped by", "x one device"):
            t.add_column(col, overflow="fold")
        for fam in families:
            one = fam.single.max_seq_len if fam.single else None
            for s in fam.multi:
                t.add_row(
                    escape(s.label),
                    str(s.world_size),
                    format_tokens(s.max_seq_len) if s.max_seq_len else "none",
                    s.stopped_by,
                    f"{s.max_seq_len / one:.2f}" if one and s.max_seq_len else "-",
                )
        console.print(t)
    if pairs or families:
        console.print(f"every column (bandwidth, compute and wait, memory per rank) in {out_dir / 'sweep.md'}")


def _default_out(plan, env) -> Path:
    on_gpu = (any(s.settings.device == "cuda" for s in plan.series)) and env.gpus
    machine = env.gpus[0]["name"] + f" x{len(env.gpus)}" if on_gpu else "cpu"
    return dated_results_dir(machine, plan.name)
