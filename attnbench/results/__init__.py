"""Results files: one JSON object per trial, appended to ``trials.jsonl`` as each ends.

Every row carries the environment it ran in (captured by ``environment``), its raw timing
samples and per-GPU memory, so reports and the regression check read result files and nothing
else. A killed sweep loses at most the trial in flight: each row is one ``write`` of one line,
flushed and synced, and a reader skips (and reports) a truncated last line.

``schema`` holds the row kinds in code (``convert`` turns them to JSON and back), ``write`` appends rows (checked, synced, never through
a link), ``read`` reads them back (the one loader every reader uses), ``possible`` says which
rows no measurement gives, ``paths`` checks output paths before any work and writes derived
files whole, ``series`` says which rows form one series across runs. Every name a caller of ``write``, ``read`` and ``paths`` needs is imported here.
"""

from attnbench.results.convert import clean_floats
from attnbench.results.paths import (
    MANIFEST,
    MIN_FREE_BYTES,
    check_output_dir,
    check_output_file,
    utf8,
    why_not_written,
    write_bytes_atomic,
    write_files_whole,
    write_text_atomic,
)
from attnbench.results.read import (
    REQUIRED_KEYS,
    check_same_machine,
    iter_rows,
    load_rows,
    read_lines,
    read_rows,
    result_files,
    rows_to_resume,
)
from attnbench.results.write import (
    BUDGET,
    LOCK_FILE,
    STATUSES,
    STOPPED_BY,
    TRIALS_FILE,
    ResultsLock,
    ResultsWriter,
    now_utc,
    repair_torn_tail,
    series_key,
)

__all__ = [
    "LOCK_FILE",
    "MANIFEST",
    "MIN_FREE_BYTES",
    "REQUIRED_KEYS",
    "STATUSES",
    "BUDGET",
    "STOPPED_BY",
    "TRIALS_FILE",
    "ResultsLock",
    "ResultsWriter",
    "check_output_dir",
    "check_output_file",
    "check_same_machine",
    "clean_floats",
    "iter_rows",
    "load_rows",
    "now_utc",
    "read_lines",
    "read_rows",
    "repair_torn_tail",
    "result_files",
    "rows_to_resume",
    "series_key",
    "utf8",
    "why_not_written",
    "write_bytes_atomic",
    "write_files_whole",
    "write_text_atomic",
]
