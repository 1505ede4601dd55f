"""The attnbench command line: each command is a thin call into the library."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnbench.errors import AttnbenchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="How long a sequence can an attention implementation handle, how fast, with how much memory per GPU.")
# Logs and CI captures are not terminals: give tables room instead of rich's 80 columns.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)  # "pkg.mod:x:" stays text


# ---------------------------------------------------------------------------------------
# list / verify
# ---------------------------------------------------------------------------------------

@app.command("list")
def list_impls() -> None:
    """Every registered implementation, its parameters with defaults, devices and dtypes."""
    from attnbench import impls  # here, not at the top: `report` and `check` must not import torch

    for name in impls.names():
        s = impls.spec(name)
        console.print(f"[bold]{name}[/]  {s.summary}")
        console.print(f"    devices: {', '.join(s.devices)}   dtypes: {', '.join(s.dtypes)}"
                      + ("   (multi-GPU, launched by torchrun)" if s.distributed else ""))
        if s.source:
            package = f" (package {s.source['package']} {s.source['version']})" if s.source.get("package") else ""
            console.print(f"    from {s.source['import_path']}{package}")
        if "availability" in s.extra:
            console.print(f"    {s.extra['availability']()}")
        if not s.params:
            console.print("    parameters: none")
        for p in s.params:
            choices = f" (one of {', '.join(p.choices)})" if p.choices else ""
            console.print(f"    --param {p.name}={_show(p.default)}  {p.help}{choices}")


def _show(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


@app.command()
def verify(
    impl: Annotated[Optional[list[str]], typer.Option("--impl", help="implementation (repeatable); default: all")] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda | auto")] = "auto",
    dtype: Annotated[Optional[list[str]], typer.Option("--dtype", help="dtype (repeatable); default fp32 and bf16")] = None,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="ranks for the sequence-parallel implementations, e.g. 2 or 2,4 [2; CUDA: 2 if there are 2 GPUs]")] = None,
    out: Annotated[Optional[Path], typer.Option(help="also append the verify rows to DIR/trials.jsonl")] = None,
    mode: Annotated[str, typer.Option(help="fwd | fwd_bwd (also dq, dk, dv; single-device implementations)")] = "fwd",
    param: Annotated[Optional[list[str]], typer.Option("--param", help="KEY=VALUE: verify the implementations that have this parameter at this value instead of their verify configurations (repeatable)")] = None,
) -> None:
    """Check implementations against the float64 dense masked reference on fresh random inputs
    (sequence-parallel ones on several ranks, also against their single-device counterpart)."""
    from attnbench import impls
    from attnbench.reference import GRAD_TOLERANCE, GRADIENTS, TOLERANCE, default_cases
    from attnbench.results import ResultsWriter, capture_env, check_output_dir, check_same_machine, clean_floats
    from attnbench.sweeps import seqpar
    from attnbench.sweeps.verification import run_reference_checks
    from attnbench.workload import check_workload_fields

    if out:
        check_output_dir(out)
    names = impl or impls.names()
    for n in names:
        impls.spec(n)
    device = _resolve_device(device)
    dtypes = dtype or ["fp32", "bf16"]
    for d in dtypes:
        check_workload_fields(d, mode, device)
    if mode == "fwd_bwd":
        names = _single_device_only(names, impl)
    runnable = [n for n in names if device in impls.spec(n).devices]
    single = [n for n in runnable if not impls.spec(n).distributed]
    distributed = [n for n in runnable if impls.spec(n).distributed]
    worlds = _verify_worlds(gpus, device) if distributed else []
    ranked = [c for n in distributed for w in worlds
              for c in seqpar.cases_for(n, device, [d for d in dtypes if d in impls.spec(n).dtypes], w)]
    given = _params(None, None, None, param)
    configs = {n: [impls.normalize_config(n, {k: v for k, v in given.items() if k in {p.name for p in impls.spec(n).params}})]
               for n in names if given}
    cases = [c for n in single for c in default_cases(n, device, [d for d in dtypes if d in impls.spec(n).dtypes], mode, configs.get(n))]
    broken = _contract_violations([n for n in single if impls.spec(n).source], device, dtypes, configs)
    if not cases and not ranked:
        raise AttnbenchError(f"no reference check to run: {', '.join(names)} cannot run {'/'.join(dtypes)} on {device}; "
                             "see `attnbench list` for each implementation's devices and dtypes")
    env = capture_env() if out else None
    if out:
        check_same_machine(out, env["machine"])
    with console.status(f"running {len(cases) + len(ranked)} reference checks on {device}"):
        rows = run_reference_checks(cases + ranked)
    t = Table(title=f"attnbench verify on {device}: relative error ||out - ref|| / ||ref|| against float64")
    grad_cols = ("dq err", "dk err", "dv err", "grad tol.") if mode == "fwd_bwd" else ()
    for col in ("impl", "config", "ranks", "B", "N", "H", "D", "causal", "dtype", "rel. error", "vs single", "tolerance",
                *grad_cols, "result"):
        t.add_column(col)
    for r in rows:
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.2e}"
        vs_single = "-" if r.get("rel_err_single") is None else f"{r['rel_err_single']:.2e}"
        grads = [_sci(r.get(f"rel_err_{g}")) for g in GRADIENTS] + [f"{GRAD_TOLERANCE[r['dtype']]:.0e}"] if grad_cols else []
        mark = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]"}.get(r["status"], f"[red]{r['status']}[/] {escape(r['message'])}")
        t.add_row(r["impl"], _config_short(r["config"]), str(r.get("world_size", 1)), str(r["batch"]), str(r["seq_len"]),
                  str(r["heads"]), str(r["head_dim"]), "yes" if r["causal"] else "no", r["dtype"], err, vs_single,
                  f"{TOLERANCE[r['dtype']]:.0e}", *grads, mark)
    console.print(t)
    if out:
        writer = ResultsWriter(out)
        for r in rows:
            writer.append(clean_floats({**r, "run": Path(out).name, "env": env}))
    failed = [r for r in rows if r["status"] != "pass"]
    console.print(f"{len(rows) - len(failed)} of {len(rows)} cases pass")
    for line in broken:
        console.print(f"[red]contract violated[/] {escape(line)}")
    if failed or broken:
        raise typer.Exit(1)


def _single_device_only(names: list[str], asked: list[str] | None) -> list[str]:
    """fwd_bwd checks single-device implementations; naming a sequence-parallel one is an error."""
    from attnbench import impls

    ranked = [n for n in names if impls.spec(n).distributed]
    if asked and ranked:
        raise AttnbenchError(f"verify --mode fwd_bwd checks single-device implementations; {', '.join(ranked)} "
                             "runs forward only: drop --mode fwd_bwd or that --impl")
    return [n for n in names if n not in ranked]


def _sci(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"
def _contract_violations(names: list[str], device: str, dtypes: list[str], configs: dict[str, list]) -> list[str]:
    """The contract checks of outside implementations (attnbench/contract.py), one line each."""
    from attnbench import impls
    from attnbench.contract import violations

    return [f"{n} [{dtype}]: {v}" for n in names for config in configs.get(n, [{}]) for dtype in dtypes
            if dtype in impls.spec(n).dtypes for v in violations(n, config, device, dtype)]


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


def _config_short(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={_show(v)}" for k, v in config.items() if k != "max_chunk_tokens" and v not in (None, "")) or "-"


def _resolve_device(device: str) -> str:
    from attnbench.sweeps.runner import cuda_available

    if device not in ("auto", "cpu", "cuda"):
        raise AttnbenchError(f"unknown device {device!r}: choose cpu, cuda or auto")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise AttnbenchError("--device cuda but no CUDA GPU is visible: run on a GPU machine or use --device cpu")
    return device


# ---------------------------------------------------------------------------------------
# max-seq / bench / run
# ---------------------------------------------------------------------------------------

ImplOpt = Annotated[Optional[list[str]], typer.Option("--impl", help="implementation (repeatable); see `attnbench list`")]
HeadsOpt = Annotated[Optional[int], typer.Option("--heads", help="attention heads H [8]")]
HeadDimOpt = Annotated[Optional[int], typer.Option("--head-dim", help="head dimension D [64]")]
BatchOpt = Annotated[Optional[int], typer.Option("--batch", help="batch size B [1]")]
DtypeOpt = Annotated[Optional[str], typer.Option("--dtype", help="fp32 | fp16 | bf16 [bf16]")]
DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="cpu | cuda | auto [auto]")]
ModeOpt = Annotated[Optional[str], typer.Option("--mode", help="fwd | fwd_bwd [fwd]")]
CausalOpt = Annotated[Optional[bool], typer.Option("--causal/--no-causal", help="causal masking [no]")]
SegOpt = Annotated[Optional[str], typer.Option("--segment-lengths", help="dilated: e.g. 2048,4096")]
DilOpt = Annotated[Optional[str], typer.Option("--dilation-rates", help="dilated: e.g. 1,2")]
BackendOpt = Annotated[Optional[str], typer.Option("--backend", help="sdpa: auto|flash|cudnn|efficient|math")]
ParamOpt = Annotated[Optional[list[str]], typer.Option("--param", help="any implementation parameter, KEY=VALUE (repeatable)")]
TrialSecOpt = Annotated[Optional[float], typer.Option("--max-trial-seconds", help="one call longer than this is a time-limit [60]")]
MemLimitOpt = Annotated[Optional[str], typer.Option("--memory-limit", help="cap a trial's memory, e.g. 2GiB")]
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", help="TOML profile (file or name under profiles/)")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="results directory [results/<date>-<machine>-<name>]")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue an interrupted sweep in --out")]
GpusOpt = Annotated[Optional[str], typer.Option("--gpus", help="sequence-parallel implementations: ranks, e.g. 2 (runs 1 and 2) or 1,2,4")]
InProcOpt = Annotated[Optional[bool], typer.Option("--in-process/--isolate", help="run trials in this process instead of one fresh process each")]
BudgetOpt = Annotated[Optional[float], typer.Option("--timing-budget", help="seconds of timed calls per trial [30]")]
RepeatOpt = Annotated[Optional[int], typer.Option("--repeat", help="time each point in K fresh processes (the unit `check` compares) [1]")]


def _params(segment_lengths, dilation_rates, backend, param) -> dict[str, Any]:
    params = {"segment_lengths": segment_lengths, "dilation_rates": dilation_rates, "backend": backend}
    for item in param or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise AttnbenchError(f"--param {item!r}: write KEY=VALUE, e.g. --param max_chunk_tokens=65536")
        params[key.strip().replace("-", "_")] = value.strip()
    return {k: v for k, v in params.items() if v is not None}


def _flags(**kw) -> dict[str, Any]:
    if kw.get("isolate") is not None:
        kw["isolate"] = not kw["isolate"]  # the option is --in-process
    return {k: v for k, v in kw.items() if v is not None}


@app.command("max-seq")
def max_seq(
    impl: ImplOpt = None, heads: HeadsOpt = None, head_dim: HeadDimOpt = None, batch: BatchOpt = None,
    dtype: DtypeOpt = None, device: DeviceOpt = None, mode: ModeOpt = None, causal: CausalOpt = None,
    segment_lengths: SegOpt = None, dilation_rates: DilOpt = None, backend: BackendOpt = None, param: ParamOpt = None,
    start: Annotated[Optional[str], typer.Option("--start", help="first length, e.g. 4096 or 64K")] = None,
    max_seq_len: Annotated[Optional[str], typer.Option("--max-seq-len", help="never try longer than this")] = None,
    resolution: Annotated[Optional[str], typer.Option("--resolution", help="stop bisecting at this gap [granularity]")] = None,
    max_trial_seconds: TrialSecOpt = None, memory_limit: MemLimitOpt = None, gpus: GpusOpt = None,
    profile: ProfileOpt = None, out: OutOpt = None, resume: ResumeOpt = False, in_process: InProcOpt = None,
    timing_budget: BudgetOpt = None,
) -> None:
    """Largest sequence length each implementation runs: double until the first failure, then bisect."""
    flags = _flags(kind="max-seq", heads=heads, head_dim=head_dim, batch=batch, dtype=dtype, device=device, mode=mode,
                   causal=causal, start=start, max_seq_len=max_seq_len, resolution=resolution,
                   max_trial_seconds=max_trial_seconds, memory_limit=memory_limit, isolate=in_process, gpus=gpus,
                   timing_budget_s=timing_budget)
    if profile:
        flags.pop("kind")
    _run_plan("max-seq", impl or [], flags, _params(segment_lengths, dilation_rates, backend, param), profile, out, resume)


@app.command()
def bench(
    seq_lens: Annotated[str, typer.Option("--seq-lens", help="lengths to time, e.g. 65536,131072 or 64K,1M")],
    impl: ImplOpt = None, heads: HeadsOpt = None, head_dim: HeadDimOpt = None, batch: BatchOpt = None,
    dtype: DtypeOpt = None, device: DeviceOpt = None, mode: ModeOpt = None, causal: CausalOpt = None,
    segment_lengths: SegOpt = None, dilation_rates: DilOpt = None, backend: BackendOpt = None, param: ParamOpt = None,
    max_trial_seconds: TrialSecOpt = None, memory_limit: MemLimitOpt = None, gpus: GpusOpt = None,
    out: OutOpt = None, resume: ResumeOpt = False, in_process: InProcOpt = None,
    timing_budget: BudgetOpt = None, repeat: RepeatOpt = None,
) -> None:
    """Time and measure each implementation at the given sequence lengths."""
    flags = _flags(kind="points", seq_lens=seq_lens, heads=heads, head_dim=head_dim, batch=batch, dtype=dtype,
                   device=device, mode=mode, causal=causal, max_trial_seconds=max_trial_seconds,
                   memory_limit=memory_limit, isolate=in_process, gpus=gpus, timing_budget_s=timing_budget,
                   repeat=repeat)
    _run_plan("bench", impl or [], flags, _params(segment_lengths, dilation_rates, backend, param), None, out, resume)


@app.command()
def run(
    profile: Annotated[str, typer.Option("--profile", help="profile name or file; 'auto': default with a GPU, else default-cpu")] = "auto",
    out: OutOpt = None, resume: ResumeOpt = False, repeat: RepeatOpt = None,
) -> None:
    """Run a profile's sweeps (the reference check first), then write its tables."""
    if profile == "auto":
        from attnbench.sweeps.runner import cuda_available

        profile = "default" if cuda_available() else "default-cpu"
    _run_plan(profile, [], _flags(repeat=repeat), {}, profile, out, resume)


def _run_plan(name, impl_names, flags, params, profile, out, resume) -> None:
    from attnbench.plan import build_plan
    from attnbench.report.sweep_files import write_sweep_tables
    from attnbench.results import capture_env, check_output_dir
    from attnbench.sweeps.runner import SweepRunner, resolve

    if out:
        check_output_dir(out)
    plan = resolve(build_plan(name, impl_names, flags, params, profile))
    env = capture_env()
    if plan.clipped:  # every row says what this machine's GPUs could not hold
        env["clipped"] = list(plan.clipped)
    out_dir = Path(out) if out else _default_out(plan, env)
    check_output_dir(out_dir)
    runner = SweepRunner(plan, out_dir, env, resume=resume, reporter=RichReporter(), speedup_reporter=SpeedupReporter())
    speedups = f", {len(plan.speedups)} speedup run{'s' if len(plan.speedups) != 1 else ''}" if plan.speedups else ""
    console.print(f"attnbench {plan.name}: {len(plan.series)} series{speedups} on {env['machine']} -> {out_dir}")
    for note in plan.clipped:
        err_console.print(f"clipped to the visible GPUs: {escape(note)}")
    interrupted = False
    try:
        outcomes = runner.run()
    except KeyboardInterrupt:
        interrupted, outcomes = True, []
    if (out_dir / "trials.jsonl").exists():
        from attnbench.report.speedup_tables import write_speedup_tables

        for path in write_sweep_tables(out_dir) + write_speedup_tables(out_dir):
            console.print(f"wrote {path}")
        _print_summary(out_dir)
        _scaling_readout(out_dir)
    if interrupted:
        err_console.print(f"interrupted: every finished trial is kept in {out_dir}; continue with --resume --out {out_dir}")
        raise typer.Exit(130)
    console.print(f"results in {out_dir}")
    if any(not o.verified for o in outcomes) or runner.speedups_unverified:
        err_console.print("some configurations failed the reference check; their sweeps did not run")
        raise typer.Exit(1)


def _print_summary(out_dir: Path) -> None:
    """Each implementation's largest successful length and what stopped it."""
    from attnbench.report.sweep_tables import max_seq_summary, max_seq_text
    from attnbench.results import read_rows
    from attnbench.units import format_bytes, format_tokens

    summary = max_seq_summary(read_rows(out_dir)[0])
    if not summary:
        return
    t = Table(title="largest sequence per implementation")
    for col in ("implementation", "dtype", "max sequence", "stopped by", "peak at max", "peak / floor"):
        t.add_column(col)
    for s in summary:
        t.add_row(s["label"], s["dtype"], max_seq_text(s),
                  s["stopped_by"] + (f" at {format_tokens(s['first_failure'])}" if s["first_failure"] else ""),
                  format_bytes(s["peak_bytes"]), f"{s['peak_over_floor']:.2f}x" if s["peak_over_floor"] else "-")
    console.print(t)


def _scaling_readout(out_dir: Path) -> None:
    """Sequence-parallel runs: efficiency against one GPU, written to scaling.md and shown."""
    from rich.markdown import Markdown

    from attnbench.report.scaling import scaling_markdown
    from attnbench.results import read_rows, write_text_atomic

    rows, _ = read_rows(out_dir)
    text = scaling_markdown(rows)
    if text:
        write_text_atomic(out_dir / "scaling.md", text)
        console.print(Markdown(text))
        console.print(f"wrote {out_dir / 'scaling.md'}")


def _dated_results_dir(machine: str, name: str) -> Path:
    """results/DATE-MACHINE-NAME, with -2, -3, ... appended rather than mixing into an earlier run."""
    from attnbench.results import now_utc

    slug = re.sub(r"[^a-z0-9]+", "-", f"{machine}-{name}".lower()).strip("-")
    base = Path("results") / f"{now_utc()[:10]}-{slug}"
    path, i = base, 2
    while (path / "trials.jsonl").exists():
        path, i = base.with_name(f"{base.name}-{i}"), i + 1
    return path


def _default_out(plan, env) -> Path:
    on_gpu = (any(s.settings.device == "cuda" for s in plan.series)
              or any(sp.device == "cuda" for sp in plan.speedups)) and env.get("gpus")
    machine = env["gpus"][0]["name"] + f" x{len(env['gpus'])}" if on_gpu else "cpu"
    return _dated_results_dir(machine, plan.name)


class RichReporter:
    """Live progress: a line per finished trial, a spinner while one runs."""

    def __init__(self) -> None:
        self._status = None

    def verify_done(self, rows) -> None:
        for r in rows:
            mark = "[green]pass[/]" if r["status"] == "pass" else f"[red]{r['status'].upper()}[/]"
            console.print(f"  reference check {r['impl']} {_config_short(r['config'])} {r['dtype']} "
                          f"N={r['seq_len']}: rel. error {r['rel_err'] if r['rel_err'] is None else format(r['rel_err'], '.1e')} {mark}")

    def note(self, text) -> None:
        err_console.print(f"warning: {escape(text)}")

    def series_started(self, series, index, total) -> None:
        st = series.settings
        console.rule(f"[{index + 1}/{total}] {series.name}  {st.kind}  {st.dtype} B={st.batch} H={st.heads} "
                     f"D={st.head_dim} {st.mode}{' causal' if st.causal else ''} on {st.device}")

    def trial_started(self, series, seq_len, phase) -> None:
        from attnbench.units import format_tokens

        self._status = console.status(f"{phase} N={format_tokens(seq_len)} ...")
        self._status.start()

    def trial_done(self, series, row, replayed) -> None:
        from attnbench.report.markdown import result_text
        from attnbench.units import format_bytes, format_tokens

        if self._status:
            self._status.stop()
            self._status = None
        bits = [f"  {row.get('phase', ''):6} {format_tokens(row['seq_len']):>24}  {result_text(row['status'])}"]
        if row.get("time_ms"):
            bits.append(f"{row['time_ms']:,.2f} ms")
        if row.get("peak_bytes"):
            bits.append(f"peak {format_bytes(row['peak_bytes'])}" +
                        (f" ({row['peak_over_floor']:.2f}x floor)" if row.get("peak_over_floor") else ""))
        if row.get("tflops_executed"):
            bits.append(f"{row['tflops_executed']:.1f} TFLOP/s")
        if row["status"] != "ok" and row.get("message"):
            bits.append(escape(row["message"][:160]))
        if replayed:
            bits.append("(from earlier run)")
        console.print("  ".join(bits))

    def series_done(self, series, result) -> None:
        from attnbench.units import format_tokens

        if result is None:
            return
        best = format_tokens(result.best) if result.best else "none"
        fail = f" at {format_tokens(result.first_failure)}" if result.first_failure else ""
        console.print(f"  [bold]-> largest length {best}; stopped by {result.stopped_by}{fail}[/]")


# ---------------------------------------------------------------------------------------
# report / predict: read result files only, never run a benchmark
# ---------------------------------------------------------------------------------------

@app.command()
def report(
    results: Annotated[Path, typer.Argument(help="results directory (searched for trials.jsonl) or one trials.jsonl")],
    out: Annotated[Optional[Path], typer.Option("--out", help="where report.md, csv/ and the plots go [RESULTS/report]")] = None,
) -> None:
    """Write report.md (the five seed reports' tables, capacity prediction, plots) and CSV tables from result files."""
    from attnbench.report.build import write_report

    written = write_report(results, out)
    for line in written.problems:
        err_console.print(f"warning: {escape(line)}")
    console.print(f"{len(written.files) - 1} tables and plots, {len(written.machines)} machine(s): "
                  f"{escape(', '.join(written.machines))}")
    console.print(f"report: {written.report}")


@app.command()
def predict(
    impl: Annotated[str, typer.Option("--impl", help="implementation whose measured series to extrapolate")],
    gpu_memory: Annotated[str, typer.Option("--gpu-memory", help="device memory, e.g. 80GiB or 24GB")],
    source: Annotated[Path, typer.Option("--from", help="results directory or trials.jsonl")],
    label: Annotated[Optional[str], typer.Option("--label", help="only the series with this label")] = None,
) -> None:
    """Predict the longest sequence IMPL runs on a GPU of the given memory, from its measured peaks."""
    from attnbench.report.fit import predict_lines

    for line in predict_lines(impl, gpu_memory, source, label):
        console.print(escape(line))


# ---------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------

@app.command()
def check(
    baseline: Annotated[Path, typer.Option("--baseline", help="results directory or trials.jsonl before the change")],
    current: Annotated[Path, typer.Option("--current", help="results directory or trials.jsonl after the change")],
    time_factor: Annotated[float, typer.Option("--time-factor", help="a median slower than this factor may be a regression")] = 1.10,
    memory_factor: Annotated[float, typer.Option("--memory-factor", help="peak memory above this factor is a regression")] = 1.02,
    alpha: Annotated[float, typer.Option("--alpha", help="family-wise significance level of the time test (Holm-corrected across comparisons)")] = 0.05,
    only: Annotated[Optional[str], typer.Option("--only", help="aspects to check: time,memory,capacity,correctness,bytes [all]")] = None,
    deterministic: Annotated[bool, typer.Option("--deterministic", help="only correctness, capacity and bytes, which do not depend on the clock or the CPU model (CPU results of different CPU models compare)")] = False,
    fmt: Annotated[str, typer.Option("--format", help="text | markdown (a pull-request comment) | json")] = "text",
    skip_unreadable: Annotated[bool, typer.Option("--skip-unreadable", help="skip unreadable lines (reported with file:line) instead of stopping")] = False,
    allow_missing: Annotated[bool, typer.Option("--allow-missing", help="pass although trials or reference checks of the baseline are missing from the current results")] = False,
) -> None:
    """Compare results with a baseline: exit 0 when clean, 1 on any regression, 2 on unusable input."""
    from attnbench.check import ASPECTS, DETERMINISTIC_ASPECTS, FORMATS, Thresholds, render, run_check

    if fmt not in FORMATS:
        raise AttnbenchError(f"--format {fmt!r}: choose text, markdown or json")
    default = DETERMINISTIC_ASPECTS if deterministic else ASPECTS
    aspects = tuple(a.strip() for a in only.split(",") if a.strip()) if only else default
    thresholds = Thresholds(time_factor, memory_factor, alpha, aspects, deterministic, allow_missing=allow_missing)
    report = run_check(baseline, current, thresholds, skip_unreadable=skip_unreadable)
    for w in report.warnings:
        err_console.print(f"warning: {escape(w)}")
    sys.stdout.write(render(report, fmt))
    sys.stdout.flush()
    raise typer.Exit(report.exit_code)


# ---------------------------------------------------------------------------------------
# speedup
# ---------------------------------------------------------------------------------------

@app.command()
def speedup(
    impl: Annotated[str, typer.Option("--impl", help="implementation; see `attnbench list`")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs to spread over (on --device cpu: processes)")] = 2,
    cases: Annotated[Optional[str], typer.Option("--cases", help="SEQLENxBATCH cases, e.g. 2048x8,4096x4 or 64Kx2 [default: the seed reports' 2048x8,4096x4,8192x2,16384x1; mp skips 16384x1, which one batch cannot split]")] = None,
    strategy: Annotated[str, typer.Option("--strategy", help="dp, mp (comma-separated; single always runs as the baseline)")] = "dp,mp",
    module: Annotated[str, typer.Option("--module", help="attention | multihead (q/k/v/out projections around it)")] = "attention",
    grad_compression: Annotated[Optional[str], typer.Option("--grad-compression", help="bf16 | fp16: DDP gradient compression (multihead fwd_bwd mp)")] = None,
    heads: Annotated[int, typer.Option("--heads", help="attention heads H")] = 8,
    head_dim: Annotated[int, typer.Option("--head-dim", help="head dimension D")] = 64,
    dtype: Annotated[str, typer.Option("--dtype", help="fp32 | fp16 | bf16")] = "bf16",
    device: Annotated[str, typer.Option("--device", help="cpu | cuda | auto")] = "auto",
    mode: Annotated[str, typer.Option("--mode", help="fwd | fwd_bwd")] = "fwd",
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="causal masking")] = False,
    segment_lengths: SegOpt = None, dilation_rates: DilOpt = None, backend: BackendOpt = None, param: ParamOpt = None,
    max_trial_seconds: Annotated[float, typer.Option("--max-trial-seconds", help="one call longer than this is a time-limit")] = 60.0,
    out: OutOpt = None, resume: ResumeOpt = False,
) -> None:
    """Single GPU vs DataParallel vs multi-process data parallel at (sequence length x batch) cases."""
    from attnbench.report.speedup_tables import write_speedup_tables
    from attnbench.results import capture_env, check_output_dir
    from attnbench.sweeps.speedup import (
        SEED_CASES,
        SpeedupRunner,
        SpeedupSettings,
        check_settings,
        parse_cases,
        parse_strategies,
    )

    if out:
        check_output_dir(out)
    device = _resolve_device(device)
    settings = check_settings(SpeedupSettings(
        impl=impl, config=_params(segment_lengths, dilation_rates, backend, param), cases=parse_cases(SEED_CASES if cases is None else cases), gpus=gpus,
        strategies=parse_strategies(strategy), module=module, grad_compression=grad_compression, dtype=dtype,
        device=device, heads=heads, head_dim=head_dim, mode=mode, causal=causal, max_trial_seconds=max_trial_seconds,
    ), _cuda_device_count() if device == "cuda" else 0, cases_given=cases is not None)
    env = capture_env()
    out_dir = Path(out) if out else _speedup_out(settings, env)
    runner = SpeedupRunner(settings, out_dir, env, resume=resume, reporter=SpeedupReporter())
    console.print(f"attnbench speedup: {impl} on {gpus} {'GPUs' if device == 'cuda' else 'CPU processes'} "
                  f"({', '.join(settings.order())}), {len(settings.cases)} case{'s' if len(settings.cases) != 1 else ''} on {env['machine']} -> {out_dir}")
    interrupted, verified = False, True
    try:
        verified = runner.run()
    except KeyboardInterrupt:
        interrupted = True
    if (out_dir / "trials.jsonl").exists():
        for path in write_speedup_tables(out_dir):
            console.print(f"wrote {path}")
    if interrupted:
        err_console.print(f"interrupted: every finished trial is kept in {out_dir}; continue with --resume --out {out_dir}")
        raise typer.Exit(130)
    if not verified:
        err_console.print("the configuration failed the reference check; no speedup trial ran")
        raise typer.Exit(1)


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def _speedup_out(settings, env) -> Path:
    machine = f"{env['gpus'][0]['name']} x{settings.gpus}" if settings.device == "cuda" and env.get("gpus") else "cpu"
    return _dated_results_dir(machine, f"speedup-{settings.impl}")


class SpeedupReporter:
    """A line per finished trial, a spinner while one runs."""

    def __init__(self) -> None:
        self._status = None
        self._single: dict[str, float] = {}

    def verify_done(self, rows) -> None:
        RichReporter().verify_done(rows)

    def trial_started(self, case, strategy) -> None:
        self._status = console.status(f"{case.label} {strategy} ...")
        self._status.start()

    def trial_done(self, row, replayed) -> None:
        from attnbench.report.markdown import result_text

        if self._status:
            self._status.stop()
            self._status = None
        bits = [f"  {row['case']:>14}  {row['strategy']:6}  {result_text(row['status'])}"]
        if row.get("time_ms"):
            bits.append(f"{row['time_ms']:,.3f} ms")
            if row["strategy"] == "single" and row["status"] == "ok":
                self._single[row["case"]] = row["time_ms"]
            elif row["case"] in self._single:
                bits.append(f"{self._single[row['case']] / row['time_ms']:.2f}x")
        if row["status"] != "ok" and row.get("message"):
            bits.append(escape(row["message"][:200]))
        elif row.get("note"):
            bits.append(escape(row["note"][:200]))
        if replayed:
            bits.append("(from earlier run)")
        console.print("  ".join(bits))


# ---------------------------------------------------------------------------------------
# pattern: a block-sparse pattern, its kept fraction and a picture
# ---------------------------------------------------------------------------------------

@app.command()
def pattern(
    seq_len: Annotated[str, typer.Option("--seq-len", help="sequence length, e.g. 16384 or 16M")],
    pattern_type: Annotated[str, typer.Option("--pattern-type", help="local_window | dilated_sparse | global_local | hierarchical")] = "local_window",
    block_size: Annotated[int, typer.Option("--block-size", help="tokens per block")] = 128,
    sparsity_ratio: Annotated[float, typer.Option("--sparsity-ratio", help="kept fraction of block pairs (0.05 = 95% sparse)")] = 0.05,
    causal: CausalOpt = None,
    segment_lengths: SegOpt = None, dilation_rates: DilOpt = None,
    png: Annotated[Optional[Path], typer.Option("--png", help="draw the pattern into this PNG file")] = None,
) -> None:
    """Build a block-sparse pattern from its block lists: print its kept fraction, build time and memory; draw it."""
    import time

    from attnbench import impls
    from attnbench.measure.memory import current_rss_bytes
    from attnbench.measure.probe import reset_rss_peak, rss_high_water
    from attnbench.results import check_output_file
    from attnbench.units import format_bytes, format_tokens, parse_tokens

    if png:
        check_output_file(png, "--png", ".png")
    n = parse_tokens(seq_len)
    config = _params(segment_lengths, dilation_rates, None, None)
    impl = impls.build("block-sparse", pattern_type=pattern_type, block_size=block_size, sparsity_ratio=sparsity_ratio,
                       **config)
    impl.check_length(n)
    reset_rss_peak()
    base = current_rss_bytes()
    t0 = time.perf_counter()
    p = impl.pattern(n, bool(causal))  # refuses a pattern that cannot keep the ratio
    seconds = time.perf_counter() - t0
    grown = max(0, rss_high_water() - base)
    counts = p.row_counts.float()
    console.print(f"{p.pattern_type}{' causal' if p.causal else ''}  N={format_tokens(n)}  block {block_size}  "
                  f"{p.num_blocks:,} query blocks  ({p.describe()})")
    console.print(f"kept fraction {p.kept_fraction:.4f} of {'causal ' if p.causal else ''}block pairs "
                  f"(sparsity_ratio {sparsity_ratio:g}); {p.kept_blocks:,} block pairs; per query block "
                  f"min {int(counts.min())} / mean {float(counts.mean()):.1f} / max {int(counts.max())} key blocks"
                  + (f"; {p.dense_rows} global rows keep everything" if p.dense_rows else ""))
    console.print(f"built in {seconds:.2f} s; resident memory grew by at most {format_bytes(grown)}; "
                  f"compact lists {format_bytes(p.progressions.numel() * 8)}")
    if png:
        from attnbench.report.pattern_plot import draw_pattern

        console.print(f"wrote {draw_pattern(p, block_size, png)}")


# ---------------------------------------------------------------------------------------

def main() -> None:
    """Console entry: one-line errors with exit 2, never a traceback for bad input."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        code = app(standalone_mode=False)  # click returns a typer.Exit's code here
        sys.exit(code if isinstance(code, int) else 0)
    except AttnbenchError as exc:
        err_console.print(f"error: {escape(str(exc))}", soft_wrap=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:
        # click's (or typer's vendored click's) usage errors and Abort, whichever is installed
        if type(exc).__name__ == "Abort":
            err_console.print("interrupted")
            sys.exit(130)
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            err_console.print(f"error: {escape(exc.format_message())} (see --help)")
            sys.exit(2)
        raise


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt
