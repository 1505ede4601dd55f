"""Live progress of sweeps and speedup runs: a line per finished trial, a spinner while one runs."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from rich.markup import escape
from rich.text import Text

from attnbench.cli.base import config_short, console, err_console


class RichReporter:
    """Live progress: a line per finished trial, a spinner while one runs."""

    def __init__(self) -> None:
        self._failed: tuple[int, int] | None = None  # (series, length) of the last row, where it failed

    def verify_done(self, rows) -> None:
        for r in rows:
            mark = "[green]pass[/]" if r.status == "pass" else f"[red]{r.status.upper()}[/]"
            twin = f" (reduced twin of {config_short(r.twin_of)}, lengths / {r.twin_scale})" if r.twin_of else ""
            took = f" {r.elapsed_s:.1f} s" if r.elapsed_s is not None else ""
            console.print(
                f"  reference check {r.impl} {config_short(r.config)} {r.dtype} N={r.seq_len}{escape(twin)}: "
                f"rel. error {r.rel_err if r.rel_err is None else format(r.rel_err, '.1e')} {mark}{took}"
            )

    def note(self, text) -> None:
        err_console.print(f"warning: {escape(text)}")

    def series_started(self, series, index, total) -> None:
        st = series.settings
        # a speedup's batch is each case's: its cases and strategies say what runs
        batch = (
            f"{','.join(f'{c.seq_len}x{c.batch}' for c in st.speedup.cases)} single,{','.join(st.speedup.strategies)}"
            if st.kind == "speedup"
            else f"B={st.batch}"
        )
        console.rule(
            f"[{index + 1}/{total}] {escape(series.name)}  {st.kind}  {st.dtype} {batch} H={st.heads} "
            + (f"H_kv={st.kv_heads} " if st.kv_heads not in (None, st.heads) else "")
            + f"D={st.head_dim} {st.mode}{' causal' if st.causal else ''} on {st.device}"
        )

    def trial_running(self, series, seq_len, phase):
        from attnbench.units import format_tokens

        limit = series.settings.max_trial_seconds
        return _Running(f"{phase} N={format_tokens(seq_len)}", f"(a call may take up to {limit:g} s)").running()

    def trial_done(self, series, row, replayed) -> None:
        from attnbench.report.markdown import result_text
        from attnbench.units import format_bytes, format_tokens, rate_per_device

        # a retry runs a length again right after it failed (a confirmation runs one that succeeded)
        here = (id(series), row.seq_len)
        phase = (row.phase or "") + (" (retry)" if here == self._failed and not replayed else "")
        self._failed = here if row.status != "ok" else None
        bits = [f"  {phase:9} {format_tokens(row.seq_len):>24}  {result_text(row.status)}"]
        if row.time_ms:
            bits.append(f"{row.time_ms:,.2f} ms")
        if row.peak_bytes:
            bits.append(
                f"peak {format_bytes(row.peak_bytes)}"
                + (f" ({row.peak_over_floor:.2f}x floor)" if row.peak_over_floor else "")
            )
        if row.tflops_executed:
            bits.append(rate_per_device(row.tflops_executed, row.world_size or 1))
        if replayed:
            bits.append("(from earlier run)")
        if row.status != "ok" and row.message:
            bits.append(fitted_message(bits, row.message))
        console.print("  ".join(bits))

    def series_done(self, series, result) -> None:
        from attnbench.units import token_pair

        if result is None:
            return
        ran, failed = token_pair(result.best or 0, result.first_failure or 0)  # with decimals that tell them apart
        best = ran if result.best else "none"
        best += ", confirmed in a fresh process" if getattr(result, "confirmed", False) else ""
        fail = f" at {failed}" if result.first_failure else ""
        fail += " (predicted, not run)" if getattr(result, "failure_predicted", False) else ""
        console.print(f"  [bold]-> largest length {best}; stopped by {result.stopped_by}{fail}[/]")


def fitted_message(bits: list[str], message: str) -> str:
    """``message`` as the line's last part, clipped to what the console has left after ``bits``."""
    from attnbench.units import clip_text

    room = max(40, console.width - Text.from_markup("  ".join(bits)).cell_len - 2)
    return escape(clip_text(message, room))


class SpeedupReporter:
    """A line per finished trial, a spinner while one runs."""

    def __init__(self) -> None:
        self._single: dict[str, float] = {}

    def verify_done(self, rows) -> None:
        RichReporter().verify_done(rows)

    def trial_running(self, case, strategy):
        return _Running(f"{case.label} {strategy}").running()

    def trial_done(self, row, replayed) -> None:
        from attnbench.report.markdown import result_text

        bits = [f"  {row.case:>14}  {row.strategy:6}  {result_text(row.status)}"]
        if row.time_ms:
            bits.append(f"{row.time_ms:,.3f} ms")
            if row.strategy == "single" and row.status == "ok":
                self._single[row.case] = row.time_ms
            elif row.case in self._single and row.status == "ok":  # no speedup for a wrong output
                bits.append(f"{self._single[row.case] / row.time_ms:.2f}x")
        if replayed:
            bits.append("(from earlier run)")
        if row.status != "ok" and row.message:
            bits.append(fitted_message(bits, row.message))
        elif row.note:
            bits.append(fitted_message(bits, row.note))
        console.print("  ".join(bits))


class _Running:
    """A spinner with the seconds a trial has run and the phase its process is in (starting,
    compile, warm-up, timing...), so a long trial is seen to be alive and where; gone when it
    stops. A log that is not a terminal gets a line every ``HEARTBEAT_S`` seconds instead
    (rich's spinner would leave a blank line per trial there). Runners hold it through
    ``running()``, so a trial that raises (an interrupt, an error) stops it too: a heartbeat
    thread left behind would print into whatever runs next in the process."""

    def __init__(self, what: str, note: str = "") -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from attnbench.runtime.worker import PHASE_LISTENERS

        self._what, self._note = escape(what), escape(note)
        self._phase = ""
        self._progress = None
        self._listeners = PHASE_LISTENERS
        self._listeners.append(self.phase)
        if not console.is_terminal:
            self._stopped = threading.Event()
            self._beater = threading.Thread(
                target=self._beat, args=(time.monotonic(),), name=HEARTBEAT_THREAD, daemon=True
            )
            self._beater.start()
            return
        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
        )
        self._task = self._progress.add_task(self._line(""), total=None)
        self._progress.start()

    def _line(self, phase: str) -> str:
        return f"{self._what}{'  ' + phase if phase else ''}  [dim]{self._note}[/]"

    def phase(self, name: str) -> None:
        self._phase = escape(PHASE_WORDS.get(name, name))
        if self._progress is not None:
            self._progress.update(self._task, description=self._line(self._phase))

    def _beat(self, started: float) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            self.heartbeat(time.monotonic() - started)

    def heartbeat(self, elapsed_s: float) -> None:
        """One line of a trial still running: its seconds so far and its phase."""
        console.print(f"    ... {elapsed_s:.0f} s: {self._line(self._phase)}")

    @contextmanager
    def running(self):
        """Shown while the block runs, stopped however it ends."""
        try:
            yield self
        finally:
            self.stop()

    def stop(self) -> None:
        if self.phase in self._listeners:
            self._listeners.remove(self.phase)
        if self._progress is not None:
            self._progress.stop()
        else:
            self._stopped.set()
            self._beater.join(HEARTBEAT_S)  # gone once stopped: no line of this trial after the next one's


# A trial in a log that is not a terminal says it is still running this often, from this thread.
HEARTBEAT_S = 10.0
HEARTBEAT_THREAD = "attnbench-heartbeat"


# What the spinner says of a trial's phases (as its worker announces them).
PHASE_WORDS = {
    "startup": "starting python",
    "ready": "started",
    "setup": "setting up",
    "device": "starting the device",
    "inputs": "making inputs",
    "compile": "compiling",
    "first-call": "first call",
    "warm-up": "warming up",
    "timing": "timing",
    "warm-call": "warm call",
    "gpu-timing": "timing on the GPU",
    "compare": "comparing with the reference",
    "accounting": "counting",
    "exit": "writing the result",
}
