"""The regression check: compare the result files of a change with those of a baseline.

Trials match by identity: implementation, configuration, shape, dtype, device, mode,
causality, world size and strategy, and the device model they ran on (results of different
device models are never compared). Each matched pair is judged on

- time: a regression only when the current time is slower than the stated minimum factor
  (``--time-factor``; 1.10 on a GPU, 1.8 on a CPU) and than the noise between that trial's
  own processes (the largest ratio between two of them on one side); a process's time is its
  median call on a GPU, its fastest call on a CPU (by the CPU time of its calls where both
  sides recorded it). A point timed in one process on a side, with too few samples, calls too
  short for the timer or CPU processes at different thread counts, or moved within the noise,
  is *not gated*: reported with the reason, never a regression;
- memory: peak memory above ``memory_factor`` times the baseline's and beyond the noise of its
  counter (the spread between processes; a CPU resident set at least ``RSS_NOISE_BYTES``);
- capacity: a lower max-seq for the same series (one stopped by the time limit only beyond
  one bisection step), or a trial that ran and now fails;
- correctness: any reference check (``verify`` row) in the current results that does not pass
  (one the baseline found unsupported too, a shape the implementation declines, is unchanged);
- bytes: exact accounting (floor bytes, FLOPs; q, k, v bytes where the allocator counts them).

``deterministic`` keeps only what does not depend on the clock or on the CPU model
(correctness, capacity under a memory limit, bytes), so a CI runner whose CPU differs from
the baseline's can still gate on them. Reads result files only.

The package: ``significance`` (the time test), ``identity`` (which trials match, and how a
trial is named in a finding), ``loading`` (one side's rows, keyed for matching), ``compare``
(the comparison of two sides), ``outcome`` (thresholds, findings and the report of a check)
and ``render`` (text, markdown, JSON).
"""

from attnbench.check.compare import run_check
from attnbench.check.outcome import ASPECTS, DETERMINISTIC_ASPECTS, Thresholds
from attnbench.check.render import FORMATS, render
from attnbench.check.significance import compare_times

__all__ = ["ASPECTS", "DETERMINISTIC_ASPECTS", "FORMATS", "Thresholds", "compare_times", "render", "run_check"]
