"""`attnbench list` and `attnbench verify`: what is registered, and whether each implementation
computes what it declares (against the float64 reference)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.cli.base import app, config_short, console, err_console, show
from attnbench.cli.options import (
    EndpointOpt,
    NnodesOpt,
    NodeRankOpt,
    across_nodes,
    impl_names,
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
            digest = f", source sha256 {s.source['source_sha256']}" if s.source.get("source_sha256") else ""
            console.print(f"    from {s.source['import_path']}{package}{digest}")
        if "availability" in s.extra:
            console.print(f"    {s.extra['availability']()}")
        if not s.params:
            console.print("    parameters: none")
        for p in s.params:
            choices = f" (one of {', '.join(p.choices)})" if p.choices else ""
            console.print(_wrapped(f"    --param {p.name}={show(p.default)}  {p.help}{choices}", 8))
    show_strategies()


def show_strategies() -> None:
    """The multi-GPU strategies, as ``plan.strategies`` declares them."""
    from attnbench.plan.strategies import DECLARED, speedup_names

    head = (
        f"multi-GPU strategies  how a run spreads work over GPUs: `attnbench speedup --strategy` takes "
        f"{', '.join(speedup_names())}; ring is --gpus N of a sequence-parallel implementation"
    )
    console.print("\n[bold]multi-GPU strategies[/]" + _wrapped(head, 4)[len("multi-GPU strategies") :])
    for d in DECLARED:
        console.print(_wrapped(f"    {d.name}  {d.label}: {d.summary}", 8))


def _wrapped(line: str, indent: int, width: int = 120) -> str:
    """One entry of `attnbench list` in lines of at most ``width`` columns, continued under ``indent`` spaces."""
    import textwrap

    return textwrap.fill(line, width, subsequent_indent=" " * indent, break_on_hyphens=False)


@app.command(order=20)
def verify(
    impl: Annotated[
        Optional[list[str]],
        typer.Option("--impl", callback=impl_names, help="implementation (repeatable, or a list: a,b); default: all"),
    ] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda | auto")] = "auto",
    dtype: Annotated[
        Optional[list[str]],
        typer.Option("--dtype", help="dtype (repeatable) \\[default: fp32 on a CPU, bf16 on a GPU; --full: both]"),
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
    seq_len: Annotated[
        Optional[str],
        typer.Option(
            "--seq-len",
            help="check at these lengths only, e.g. 2048 or 512,4K \\[default: each one's own, and a long one]",
        ),
    ] = None,
    heads: Annotated[Optional[int], typer.Option("--heads", help="query heads \\[default: 8]")] = None,
    kv_heads: Annotated[
        Optional[int], typer.Option("--kv-heads", help="key/value heads (divides --heads) \\[default: 2 of 8]")
    ] = None,
    head_dim: Annotated[Optional[int], typer.Option("--head-dim", help="head dimension \\[default: 16]")] = None,
    full: Annotated[
        bool,
        typer.Option("--full", help="every verify configuration and head layout, one row per case"),
    ] = False,
) -> None:
    """Check implementations against the float64 dense masked reference on fresh random inputs
    (sequence-parallel ones on several ranks, also against their single-device counterpart):
    a few shapes each, one line per implementation; --full for the whole matrix."""
    from attnbench.results import check_output_dir, check_same_machine
    from attnbench.results.environment import capture_env
    from attnbench.trials.supervised import run_outside_in_workers
    from attnbench.trials.workload import check_workload_fields
    from attnbench.units import parse_int_list

    for d in dtype or ():  # before torch is imported
        check_workload_fields(d, mode, "cpu")
    nodes = nodes_of(nnodes, node_rank, rdzv_endpoint, worlds=parse_int_list(gpus or "2", "gpus"))
    shapes = _shapes(full, seq_len, heads, kv_heads, head_dim)
    if out:
        check_output_dir(out)
    device = resolve_device(device)
    run_outside_in_workers()  # outside implementations are imported, built and checked in workers only

    from attnbench.sweeps.verification import plan_verify

    given = impl_params(None, None, None, param)
    # a few shapes: in the device's own dtype; the matrix: in both
    dtypes = dtype or (["fp32", "bf16"] if full else ["bf16" if device == "cuda" else "fp32"])
    plan = plan_verify(impl, device, dtypes, mode, gpus, given or None, shapes)
    with across_nodes(nodes, "verify") as hosts:  # any node but node 0 runs node 0's checks instead
        env = capture_env() if out else None
        if out:
            check_same_machine(out, env.machine)
        if env and hosts:
            env.nodes = hosts
        rows = _run_groups(plan, device, out, env, full)
        _report(rows, plan, device, mode, full)


def _report(rows: list[Verify], plan, device: str, mode: str, full: bool) -> None:
    """The matrix (--full; else one line per implementation came as each ran), the count of
    passing cases, warnings and broken contracts; exit 1 if any failed."""
    if full:
        console.print(_table(rows, device, mode))
    # a kernel without the shape (a backend with no grouped-query kernel) computed nothing wrong
    unsupported = [r for r in rows if r.status == "unsupported"]
    failed = [r for r in rows if r.status not in ("pass", "unsupported")]
    passed = len(rows) - len(failed) - len(unsupported)
    console.print(
        f"{passed} of {len(rows)} cases pass"
        + (f", {len(unsupported)} unsupported by the kernel" if unsupported else "")
        + ("" if full else "; every case: attnbench verify --full")
    )
    for line in plan.warnings:
        err_console.print(f"[yellow]warning[/] {escape(line)}")
    for line in plan.broken:
        console.print(f"[red]contract violated[/] {escape(line)}")
    if failed or plan.broken:
        raise typer.Exit(1)


def _shapes(full: bool, seq_len: Optional[str], heads, kv_heads, head_dim):
    """What the options ask to check (bad values: one line, exit 2, before torch)."""
    from attnbench.errors import AttnbenchError
    from attnbench.trials.workload import check_heads
    from attnbench.units import parse_int_list

    lengths = tuple(parse_int_list(seq_len, "seq-len")) if seq_len else ()
    for name, value in (("--seq-len", min(lengths, default=1)), ("--heads", heads), ("--head-dim", head_dim)):
        if value is not None and value <= 0:
            raise AttnbenchError(f"{name} must be positive, got {value}")
    if kv_heads is not None:
        check_heads(heads or 8, kv_heads)
    from attnbench.trials.reference import Shapes  # torch, once the options are known good

    return Shapes(full=full, seq_lens=lengths, heads=heads, kv_heads=kv_heads, head_dim=head_dim)


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


def _run_groups(plan, device: str, out: Optional[Path], env: Optional[dict], full: bool) -> list[Verify]:
    """Each implementation's cases in a process of their own, with progress: a line per
    implementation as it finishes (also when the output is piped, where no bar shows); with
    ``out`` each group's rows are appended as it finishes, so an interrupted verify keeps what it
    checked (without ``out`` the rows name no run: they are shown, never written)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnbench.results import ResultsWriter
    from attnbench.sweeps.verification import run_reference_checks

    writer = ResultsWriter(out) if out else None
    run = Path(out).name if out else ""
    groups = plan.groups(ranks_together=not full)  # quick: one launch of ranks for them all
    rows: list[Verify] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    width = max((len(name) for names, _ in groups for name in names), default=0)
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(f"reference checks on {device}", total=len(plan.cases))
        for i, (names, cases) in enumerate(groups):
            progress.update(task, description=f"{', '.join(names)}: {len(cases)} reference checks on {device}")
            got = run_reference_checks(cases, run, env, warm=device == "cuda" and i + 1 < len(groups))
            for r in got if writer else ():
                writer.append(r.to_json())
            rows += got
            progress.advance(task, len(cases))
            for name in names:
                own = [r for r in got if r.impl == name]
                line = _group_line(name, own, width) if not full else f"  {name}: {_passed(own)} of {len(own)} pass"
                progress.console.print(line, highlight=False)
            console.file.flush()
    return rows


def _passed(rows: list[Verify]) -> int:
    return sum(r.status == "pass" for r in rows)


def _group_line(name: str, rows: list[Verify], width: int) -> str:
    """One implementation's checks in one line: the verdict, how many, the largest error against
    its tolerance and the shapes; the first failure's reason where one failed."""
    from attnbench.trials.reference import GRAD_TOLERANCE, GRADIENTS, TOLERANCE

    bad = [r for r in rows if r.status not in ("pass", "unsupported")]
    verdict = "[red]FAIL[/]" if bad else "[green]pass[/]"
    errors = [  # each error against its tolerance: the output's, and the gradients' where checked
        (err / limit, err)
        for r in rows
        for err, limit in [(r.rel_err, TOLERANCE[r.dtype])]
        + [(getattr(r, f"rel_err_{g}"), GRAD_TOLERANCE[r.dtype]) for g in GRADIENTS]
        if err is not None and err == err
    ]
    worst = max(errors, key=lambda e: e[0], default=None)
    lengths = sorted({r.seq_len for r in rows})
    heads = sorted({str(r.heads) + (f"/{r.kv_heads}" if r.kv_heads else "") for r in rows})
    shape = (
        f"N {'-'.join(map(str, dict.fromkeys([lengths[0], lengths[-1]])))}, H {','.join(heads)}, "
        f"D {','.join(map(str, sorted({r.head_dim for r in rows})))}, {' '.join(dict.fromkeys(r.dtype for r in rows))}"
    )
    text = f"{escape(name):<{width}}  {verdict}  {len(rows) - len(bad)}/{len(rows)} checks, {shape}"
    if worst is not None:
        text += f", worst error {worst[1]:.1e} ({worst[0]:.2g}x its tolerance)"
    unsupported = sum(r.status == "unsupported" for r in rows)
    if unsupported:
        text += f", {unsupported} unsupported by the kernel"
    if bad:
        first = bad[0]
        text += f"\n    first failure at N={first.seq_len}, H={first.heads}" + (
            f"/{first.kv_heads}" if first.kv_heads else ""
        )
        text += f", {first.dtype}{', causal' if first.causal else ''}: {escape(first.message or first.status)}"
    return text
