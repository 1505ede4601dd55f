"""`attnbench predict`: the longest sequence an implementation would run on a GPU of another
size, solved from the memory fits of its measured series (``report.fit``); reads result files
only, never runs a benchmark."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.markup import escape

from attnbench import impls
from attnbench.cli.base import app, console, err_console
from attnbench.errors import AttnbenchError
from attnbench.measure.capacity import MIN_LENGTHS_FOR_CURVE
from attnbench.registry import did_you_mean
from attnbench.results.schema import Trial
from attnbench.results.series import UNKNOWN_MACHINE
from attnbench.units import brief, format_bytes, format_tokens, parse_bytes, parse_tokens

if TYPE_CHECKING:
    from attnbench.report.fit import Capacity

FAR_BEYOND = 16  # a prediction this many times the longest fitted length is flagged
# A fit that misses one of its own measured peaks by more than this follows no curve of the
# model: its extension to another device is not a prediction.
UNTRUSTED_FIT_ERROR = 0.20


@app.command(order=80)
def predict(
    impl: Annotated[str, typer.Option("--impl", help="implementation whose measured series to extrapolate")],
    source: Annotated[
        list[Path], typer.Option("--from", help="results directory or trials.jsonl (repeatable: their rows together)")
    ],
    gpu_memory: Annotated[Optional[str], typer.Option("--gpu-memory", help="device memory, e.g. 80GiB or 24GB")] = None,
    label: Annotated[Optional[str], typer.Option("--label", help="only the series with this label")] = None,
    gpus: Annotated[
        Optional[int],
        typer.Option("--gpus", help="a sequence-parallel IMPL on this many GPUs like the measured ones"),
    ] = None,
    seq_len: Annotated[Optional[str], typer.Option("--seq-len", help="with --gpus: the length to time (16K)")] = None,
) -> None:
    """Predict the longest sequence IMPL runs on a GPU of the given memory, from its measured peaks,
    or (--gpus P) its longest sequence and time on P GPUs from the GPU counts measured."""
    if gpus is not None:
        if gpu_memory is not None:
            raise AttnbenchError("--gpus predicts for GPUs like the measured ones: drop --gpu-memory")
        lines = gpu_count_lines(impl, gpus, source, parse_tokens(seq_len) if seq_len else None)
    elif gpu_memory is None:
        raise AttnbenchError("give --gpu-memory SIZE (e.g. 80GiB) to predict for a GPU of that memory, or --gpus P")
    else:
        lines = predict_lines(impl, gpu_memory, source, label)
    for line in lines:
        (err_console if line.startswith("warning: ") else console).print(escape(line))


def gpu_count_lines(impl: str, gpus: int, source, seq_len: int | None = None) -> list[str]:
    """Per machine: ``impl``'s longest sequence and time on ``gpus`` GPUs, each a prediction
    labelled as one, with every measured count held against the same rule."""
    from attnbench.report.data import load
    from attnbench.report.tables import gpu_prediction as gp

    if gpus < 1:
        raise AttnbenchError(f"--gpus {gpus}: give a positive number of GPUs")
    results = load(source)
    lines = []
    for machine, rows in results.by_machine.items():
        for p in gp.longest(rows, impl, gpus):
            held = f"; measured {format_tokens(p.measured)} ({p.predicted / p.measured - 1:+.0%})" if p.measured else ""
            lines.append(
                f"{impl} x{p.gpus} [{machine}]: predicted longest {format_tokens(int(p.predicted))} "
                f"(x{p.source}'s search: {format_tokens(int(p.per_rank))} tokens a rank){held}"
            )
        for t in gp.time_at(rows, impl, gpus, seq_len):
            held = (
                f"; measured {t.measured_ms:.3g} ms ({t.predicted_ms / t.measured_ms - 1:+.0%})"
                if t.measured_ms
                else ""
            )
            fitted = ", ".join(f"x{w}" for w in t.fitted_on)
            lines.append(
                f"{impl} x{t.gpus} [{machine}] at {format_tokens(t.seq_len)}: predicted {t.predicted_ms:.3g} ms, "
                f"efficiency {t.efficiency:.2f} (one GPU {t.one_gpu_ms:.3g} ms / {t.gpus} + "
                f"{t.per_peer_ms:.3g} ms per peer x {t.gpus - 1}, fitted on {fitted}){held}"
            )
    if not lines:
        raise AttnbenchError(
            f"{results.source} holds no multi-GPU rows of {impl} to predict from: run `attnbench run --profile multi-gpu "
            f"--part ring` (or `bench --impl {impl} --gpus 2`) and predict --from DIR"
        )
    return lines


def predict_lines(impl: str, gpu_memory: str, source, label: str | None = None) -> list[str]:
    """One line per measured series of ``impl``: its longest sequence on a device of ``gpu_memory``,
    followed by a line starting 'warning: ' where the prediction stands on weak ground."""
    from attnbench.report.data import load
    from attnbench.report.fit import capacities

    device_bytes = parse_bytes(gpu_memory)
    reading = Reading(impl)
    results = load(source, keep=reading.keep)
    _check_known(impl, sorted(reading.measured))
    held = [(machine, c) for machine, rows in reading.in_order(results.by_machine) for c in capacities(rows)]
    chosen = [(machine, c) for machine, c in held if c.impl == impl and (not label or c.label == label)]
    if not chosen:
        raise AttnbenchError(_no_series(impl, label, results.source, [c for _, c in held], reading.measured))
    lines = []
    for machine, c in chosen:
        if c.fit:
            n = c.predict_for(device_bytes)
            lines.append(_prediction_line(machine, c, n, gpu_memory))
            lines.extend(_prediction_warning(c, n))
            lines.extend(_fit_warning(c))
    if not lines:
        scope = f" with label {label!r}" if label else ""
        raise AttnbenchError(
            f"no series of {impl}{scope} in {results.source} has enough successful trials to fit "
            f"(2 lengths, 3 for a quadratic model): run `attnbench max-seq --impl {impl} --out DIR` "
            "and predict --from DIR"
        )
    return lines


@dataclass
class Reading:
    """What a prediction for ``impl`` reads of a history: that implementation's rows alone (a
    history of many is neither typed nor held whole), and on the way every implementation a
    trial names (an unknown name is told what the results hold) and every machine in the
    order the history first names it (predictions are printed in that order, as when every
    row was read)."""

    impl: str
    measured: set[str] = field(default_factory=set)
    machines: dict[str, int] = field(default_factory=dict)

    def keep(self, row: dict[str, Any]) -> bool:
        env = row.get("env")
        machine = (env.get("machine") if isinstance(env, dict) else None) or UNKNOWN_MACHINE
        self.machines.setdefault(machine, len(self.machines))
        if row.get("kind") in Trial.KIND and isinstance(row.get("impl"), str):
            self.measured.add(row["impl"])
        return row.get("impl") == self.impl

    def in_order(self, by_machine: dict[str, list]) -> list[tuple[str, list]]:
        return sorted(by_machine.items(), key=lambda kv: self.machines.get(kv[0], len(self.machines)))


def _check_known(impl: str, measured: list[str]) -> None:
    if impl not in measured and impl not in impls.names():
        raise AttnbenchError(
            f"unknown implementation {brief(impl)}{did_you_mean(impl, measured or impls.names())}: "
            f"the results hold {', '.join(measured) or 'no trials'}"
        )


def _no_series(impl: str, label: str | None, source: str, held: list[Capacity], measured: set[str]) -> str:
    """No series matches at all (not too few trials): say what the results do hold (``held``:
    ``impl``'s series; ``measured``: every implementation the trials name)."""
    labels = sorted({c.label for c in held})
    if label and labels:
        return f"no series of {impl} in {source} has label {label!r}: its labels are {', '.join(map(repr, labels))}"
    return (
        f"{source} holds no series of {impl}: it holds {', '.join(sorted(measured)) or 'no trials'}; "
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


def _fit_warning(c: Capacity) -> list[str]:
    """Where the fit misses one of its own peaks by more than UNTRUSTED_FIT_ERROR: which one,
    by how much, and why that makes the prediction untrustworthy."""
    errors = c.fit.errors()
    worst = max(range(len(errors)), key=lambda i: abs(errors[i]))
    if abs(errors[worst]) <= UNTRUSTED_FIT_ERROR:
        return []
    model = "quadratic" if c.fit.degree == 2 else "linear"
    return [
        f"warning: {c.label}: the prediction is not trustworthy: the {model} fit misses the peak measured at "
        f"{format_tokens(c.fit.seq_lens[worst])} tokens by {abs(errors[worst]):.0%} (more than "
        f"{UNTRUSTED_FIT_ERROR:.0%}), so these peaks do not follow one {model} curve in the length (fixed costs at "
        "short lengths, or noise in the measured peaks) and extending it says little; measure lengths nearer "
        "the one predicted"
    ]
