"""`attnbench list` and `attnbench verify`: what is registered, and whether each implementation
computes what it declares (against the float64 reference)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.cli.base import app, config_short, console, show
from attnbench.cli.options import (
    EndpointOpt,
    NnodesOpt,
    NodeRankOpt,
    across_nodes,
    impl_params,
    nodes_of,
    resolve_device,
)

if TYPE_CHECKING:
    from attnbench.results.schema import Verify


@app.command("list", order=10)
def list_impls() -> None:
    """Every registered implementation, its parameters with defaults, devices and dtypes."""
    from attnbench import impls  # here, not at the top: `report` and `check` must not import torch
    from attnbench.trials.supervised import run_outside_in_workers

    run_outside_in_workers()  # an installed implementation is described by a worker, never imported here
    for name in impls.names():
        s = impls.spec(name)
        console.print(f"[bold]{name}[/]" + _wrapped(f"{name}  {s.summary}", 4)[len(name) :])
        console.print(
            f"    devices: {', '.join(s.devices)}   dtypes: {', '.join(s.dtypes)}"
            + ("   (multi-GPU, launched by torchrun)" if s.distributed else "")
        )
        if s.source:
            package = f" (package {s.source['package']} {s.source['version']})" if s.source.get("package") else ""
            console.print(f"    from {s.source['import_path']}{package}")
        if "availability" in s.extra:
            console.print(f"    {s.extra['availability']()}")
        if not s.params:
            console.print("    parameters: none")
        for p in s.params:
            choices = f" (one of {', '.join(p.choices)})" if p.choices else ""
            console.print(_wrapped(f"    --param {p.name}={show(p.default)}  {p.help}{choices}", 8))


def _wrapped(line: str, indent: int, width: int = 120) -> str:
    """One entry of `attnbench list` in lines of at most ``width`` columns, continued under ``indent`` spaces."""
    import textwrap

    return textwrap.fill(line, width, subsequent_indent=" " * indent, break_on_hyphens=False)


@app.command(order=20)
def verify(
    impl: Annotated[
        Optional[list[str]], typer.Option("--impl", help="implementation (repeatable); default: all")
    ] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda | auto")] = "auto",
    dtype: Annotated[
        Optional[list[str]], typer.Option("--dtype", help="dtype (repeatable); default fp32 and bf16")
    ] = None,
    gpus: Annotated[
        Optional[str],
        typer.Option(
            "--gpus",
            help="ranks for the sequence-parallel implementations, e.g. 2 or 2,4 \\[default: 2; CUDA: 2 if there are 2 GPUs]",
        ),
    ] = None,
    out: Annotated[Optional[Path], typer.Option(help="also append the verify rows to DIR/trials.jsonl")] = None,
    mode: Annotated[str, typer.Option(help="fwd | fwd_bwd (also dq, dk, dv; single-device implementations)")] = "fwd",
    param: Annotated[
        Optional[list[str]],
        typer.Option(
            "--param",
            help="KEY=VALUE: verify the implementations that have this parameter at this value instead of their verify configurations (repeatable)",
        ),
    ] = None,
    nnodes: NnodesOpt = None,
    node_rank: NodeRankOpt = None,
    rdzv_endpoint: EndpointOpt = None,
) -> None:
    """Check implementations against the float64 dense masked reference on fresh random inputs
    (sequence-parallel ones on several ranks, also against their single-device counterpart)."""
    from attnbench.results import check_output_dir, check_same_machine
    from attnbench.results.environment import capture_env
    from attnbench.trials.supervised import run_outside_in_workers
    from attnbench.trials.workload import check_workload_fields
    from attnbench.units import parse_int_list

    for d in dtype or ():  # before torch is imported
        check_workload_fields(d, mode, "cpu")
    nodes = nodes_of(nnodes, node_rank, rdzv_endpoint, worlds=parse_int_list(gpus or "2", "gpus"))
    if out:
        check_output_dir(out)
    device = resolve_device(device)
    run_outside_in_workers()  # outside implementations are imported, built and checked in workers only

    from attnbench.sweeps.verification import plan_verify

    given = impl_params(None, None, None, param)
    plan = plan_verify(impl, device, dtype or ["fp32", "bf16"], mode, gpus, given or None)
    with across_nodes(nodes, "verify") as hosts:  # any node but node 0 runs node 0's checks instead
        env = capture_env() if out else None
        if out:
            check_same_machine(out, env["machine"])
        if env and hosts:
            env["nodes"] = hosts
        rows = _run_groups(plan, device, out, env)
        _report(rows, plan, device, mode)


def _report(rows: list[Verify], plan, device: str, mode: str) -> None:
    """The table and the count of passing cases; exit 1 if any failed."""
    console.print(_table(rows, device, mode))
    # a kernel without the shape (a backend with no grouped-query kernel) computed nothing wrong
    unsupported = [r for r in rows if r.status == "unsupported"]
    failed = [r for r in rows if r.status not in ("pass", "unsupported")]
    passed = len(rows) - len(failed) - len(unsupported)
    console.print(
        f"{passed} of {len(rows)} cases pass"
        + (f", {len(unsupported)} unsupported by the kernel" if unsupported else "")
    )
    for line in plan.broken:
        console.print(f"[red]contract violated[/] {escape(line)}")
    if failed or plan.broken:
        raise typer.Exit(1)


def _sci(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def _table(rows: list[Verify], device: str, mode: str) -> Table:
    """One line per case: its relative errors against the float64 reference and the verdict."""
    from attnbench.trials.reference import GRAD_TOLERANCE, GRADIENTS, TOLERANCE

    t = Table(title=f"attnbench verify on {device}: relative error ||out - ref|| / ||ref|| against float64")
    grad_cols = ("dq err", "dk err", "dv err", "grad tol.") if mode == "fwd_bwd" else ()
    for col in (
        "impl",
        "config",
        "ranks",
        "B",
        "N",
        "H/Hkv",
        "D",
        "causal",
        "dtype",
        "rel. error",
        "vs single",
        "tolerance",
        *grad_cols,
        "result",
    ):
        t.add_column(col)
    for r in rows:
        grads = (
            [_sci(getattr(r, f"rel_err_{g}")) for g in GRADIENTS] + [f"{GRAD_TOLERANCE[r.dtype]:.0e}"]
            if grad_cols
            else []
        )
        mark = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]"}.get(
            r.status,
            f"[{'yellow' if r.status == 'unsupported' else 'red'}]{r.status}[/] {escape(r.message)}",
        )
        t.add_row(
            r.impl,
            config_short(r.config),
            str(r.world_size or 1),
            str(r.batch),
            str(r.seq_len),
            str(r.heads) + (f"/{r.kv_heads}" if r.kv_heads else ""),
            str(r.head_dim),
            "yes" if r.causal else "no",
            r.dtype,
            _sci(r.rel_err),
            _sci(r.rel_err_single),
            f"{TOLERANCE[r.dtype]:.0e}",
            *grads,
            mark,
        )
    return t


def _run_groups(plan, device: str, out: Optional[Path], env: Optional[dict]) -> list[Verify]:
    """Each implementation's cases in a process of their own, with progress; with ``out`` each
    group's rows are appended as it finishes, so an interrupted verify keeps what it checked
    (without ``out`` the rows name no run: they are shown, never written)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnbench.results import ResultsWriter
    from attnbench.sweeps.verification import run_reference_checks

    writer = ResultsWriter(out) if out else None
    run = Path(out).name if out else ""
    groups = plan.groups()
    rows: list[Verify] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(f"reference checks on {device}", total=len(plan.cases))
        for i, (name, cases) in enumerate(groups):
            progress.update(task, description=f"{name}: {len(cases)} reference checks on {device}")
            got = run_reference_checks(cases, run, env, warm=device == "cuda" and i + 1 < len(groups))
            for r in got if writer else ():
                writer.append(r.to_json())
            rows += got
            progress.advance(task, len(cases))
            passed = sum(r.status == "pass" for r in got)
            progress.console.print(f"  {name}: {passed} of {len(got)} pass")
    return rows
