"""What every measuring run does around its trials, whatever it measures (a sweep, speedup):
refuse or resume a results directory, check against the float64 reference and record the
check, append each row as it ends. The runners add only what they measure."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

from attnbench.results import TRIALS_FILE, ResultsWriter, clean_floats, rows_to_resume
from attnbench.results.read import History
from attnbench.results.schema import Environment, Row, Verify
from attnbench.sweeps.verification import refuse_unrunnable, run_reference_checks
from attnbench.trials.reference import VerifyCase


class Reporter(Protocol):
    """Progress of a run; each runner's reporter adds its own trial events to this."""

    def verify_done(self, rows: list[Verify]) -> None: ...


class SilentReporter:
    """Every event ignored (tests, library use)."""

    def __getattr__(self, name):
        return lambda *a, **k: None

    def trial_running(self, *args) -> AbstractContextManager:
        return nullcontext()


class RunSession:
    def __init__(self, out_dir: Path, env: Environment, resume: bool, reporter: Any) -> None:
        self.out_dir = Path(out_dir)
        self.env = env
        self.resume = resume
        self.reporter = reporter or SilentReporter()
        self.writer = ResultsWriter(self.out_dir)
        self.run_id = self.out_dir.name
        self._resumed: tuple[tuple[int, ...] | None, list[Row]] | None = None
        self.history: History | None = None  # the directory's rows as last read, to read on from

    def resumed_rows(self) -> list[Row]:
        """The rows a resumed run continues from; refuses a used directory without --resume.
        Read again only where the file changed since the last read (a run asks before taking
        the directory's lock and again under it)."""
        stamp = _stamp(self.out_dir / TRIALS_FILE)
        if self._resumed is None or self._resumed[0] != stamp:
            rows, self.history = rows_to_resume(self.out_dir, self.resume, self.env.machine)
            self._resumed = (stamp, rows)
        return self._resumed[1]

    def run_checks(
        self,
        cases: list[VerifyCase],
        isolate: bool = False,
        memory_limit: int | None = None,
        warm: bool = False,
        call_limit_s: float | None = None,
    ) -> list[Verify]:
        """Run the reference check and refuse a case that cannot run; writes nothing, so a
        run with several parts can check all of them before its first row."""
        rows = run_reference_checks(cases, self.run_id, self.env, isolate, memory_limit, warm, call_limit_s)
        refuse_unrunnable(rows)
        return rows

    def record_checks(self, rows: list[Verify]) -> bool:
        """Append the check rows and report them; True when every case passed."""
        for row in rows:
            self.append(row)
        self.reporter.verify_done(rows)
        return all(r.status == "pass" for r in rows)

    def check_against_reference(self, cases: list[VerifyCase]) -> list[Verify]:
        """Run the reference check, refuse a case that cannot run, record the rows."""
        rows = self.run_checks(cases)
        self.record_checks(rows)
        return rows

    def append(self, row: Row) -> None:
        self.writer.append(clean_floats(row.to_json()))


def _stamp(path: Path) -> tuple[int, ...] | None:
    """What changes when a file does: its inode, size and modification time (None: absent)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
