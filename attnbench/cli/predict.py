"""`attnbench predict`: the longest sequence an implementation would run on a GPU of another
size, solved from the memory fits of its measured series (``report.fit``); reads result files
only, never runs a benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape

from attnbench import impls
from attnbench.cli.base import app, console, err_console
from attnbench.errors import AttnbenchError
from attnbench.measure.capacity import MIN_LENGTHS_FOR_CURVE
from attnbench.units import brief, format_bytes, format_tokens, parse_bytes

if TYPE_CHECKING:
    from attnbench.report.fit import Capacity

FAR_BEYOND = 16  # a prediction this many times the longest fitted length is flagged


@app.command(order=80)
def predict(
    impl: Annotated[str, typer.Option("--impl", help="implementation whose measured series to extrapolate")],
    gpu_memory: Annotated[str, typer.Option("--gpu-memory", help="device memory, e.g. 80GiB or 24GB")],
    source: Annotated[Path, typer.Option("--from", help="results directory or trials.jsonl")],
    label: Annotated[Optional[str], typer.Option("--label", help="only the series with this label")] = None,
) -> None:
    """Predict the longest sequence IMPL runs on a GPU of the given memory, from its measured peaks."""
    for line in predict_lines(impl, gpu_memory, source, label):
        (err_console if line.startswith("warning: ") else console).print(escape(line))


def predict_lines(impl: str, gpu_memory: str, source, label: str | None = None) -> list[str]:
    """One line per measured series of ``impl``: its longest sequence on a device of ``gpu_memory``,
    followed by a line starting 'warning: ' where the prediction stands on weak ground."""
    from attnbench.report.data import load, trials
    from attnbench.report.fit import capacities

    device_bytes = parse_bytes(gpu_memory)
    results = load(source)
    _check_known(impl, sorted({r.impl for r in trials(results.rows)}))
    held = [(machine, c) for machine, rows in results.by_machine.items() for c in capacities(rows)]
    chosen = [(machine, c) for machine, c in held if c.impl == impl and (not label or c.label == label)]
    if not chosen:
        raise AttnbenchError(_no_series(impl, label, source, [c for _, c in held]))
    lines = []
    for machine, c in chosen:
        if c.fit:
            n = c.predict_for(device_bytes)
            lines.append(_prediction_line(machine, c, n, gpu_memory))
            lines.extend(_prediction_warning(c, n))
    if not lines:
        scope = f" with label {label!r}" if label else ""
        raise AttnbenchError(
            f"no series of {impl}{scope} in {source} has enough successful trials to fit "
            f"(2 lengths, 3 for a quadratic model): run `attnbench max-seq --impl {impl} --out DIR` "
            "and predict --from DIR"
        )
    return lines


def _check_known(impl: str, measured: list[str]) -> None:
    if impl not in measured and impl not in impls.names():
        raise AttnbenchError(
            f"unknown implementation {brief(impl)}: the results hold {', '.join(measured) or 'no trials'}"
        )


def _no_series(impl: str, label: str | None, source, held: list[Capacity]) -> str:
    """No series matches at all (not too few trials): say what the results do hold."""
    labels = sorted({c.label for c in held if c.impl == impl})
    if label and labels:
        return f"no series of {impl} in {source} has label {label!r}: its labels are {', '.join(map(repr, labels))}"
    impls_held = sorted({c.impl for c in held})
    return (
        f"{source} holds no series of {impl}: it holds {', '.join(impls_held) or 'no trials'}; "
        f"run `attnbench max-seq --impl {impl} --out DIR` and predict --from DIR"
    )


def _prediction_line(machine: str, c: Capacity, n: float | None, gpu_memory: str) -> str:
    """``c``'s longest sequence ``n`` on a device of ``gpu_memory`` (None: nothing fits)."""
    where = (
        f"{c.label} [{machine}, {c.head.dtype}, B={c.head.batch}, H={c.head.heads}, "
        f"D={c.head.head_dim}, {c.head.mode}" + (f", {c.world_size} GPUs" if c.world_size > 1 else "") + "]"
    )
    if n is None:
        return (
            f"{where}: no sequence fits in {gpu_memory} (the fit needs {format_bytes(c.fit(0))} at N=0 "
            f"plus {format_bytes(c.overhead or 0)} set aside)"
        )
    measured_text = f"; measured max {format_tokens(c.measured_max)} on this device" if c.measured_max else ""
    model = "quadratic" if c.fit.degree == 2 else "linear"
    if c.curve_measured:
        model += " (the peaks grow faster than a line)"
    return (
        f"{where}: about {format_tokens(int(n))} tokens on {gpu_memory} ({model} "
        f"fit of {c.successful} successful trials, max fit error {c.fit.max_error:.1%}, "
        f"{format_bytes(c.overhead or 0)} set aside for context and libraries{measured_text})"
    )


def _prediction_warning(c: Capacity, n: float | None) -> list[str]:
    """A CPU fit (resident memory) solved for a GPU, or a length ``n`` far past the measured
    ones: the number is still printed, the ground it stands on is said."""
    if n is None or not c.longest_ok:
        return []
    why = []
    if c.fit.degree == 1 and c.successful_lengths < MIN_LENGTHS_FOR_CURVE:
        why.append(f"a line through {c.successful_lengths} lengths: a curve needs {MIN_LENGTHS_FOR_CURVE} to show")
    if c.device == "cpu":
        why.append("fitted on CPU resident memory, solved for a GPU's memory")
    if n > FAR_BEYOND * c.longest_ok:
        why.append(f"{n / c.longest_ok:,.0f}x beyond the longest measured length")
    measured = f"measured up to {format_tokens(c.longest_ok)} tokens on {c.device}"
    return [f"warning: {c.label}: {'; '.join(why)} ({measured})"] if why else []
