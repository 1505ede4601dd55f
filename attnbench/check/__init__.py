"""The regression check: compare the result files of a change with those of a baseline.

Trials match by identity: implementation, configuration, shape, dtype, device, mode,
causality, world size and strategy, and the device model they ran on (results of different
device models are never compared). Each matched pair is judged on

- time: a regression only when the current median is slower than ``time_factor`` times the
  baseline's *and* the bootstrap interval of the ratio of medians excludes 1, with the
  processes a trial ran in (``--repeat``) as the resampled unit and Holm's correction across
  all time comparisons at family-wise ``alpha`` (asv's rule on the right unit); improvements
  the same way. Fewer than ``MIN_SAMPLES`` samples make a moved median *inconclusive*, which
  fails the gate, never a pass;
- memory: peak allocated memory above ``memory_factor`` times the baseline's;
- capacity: a lower max-seq for the same series (one stopped by the time limit only beyond
  one bisection step), or a trial that ran and now fails;
- correctness: any reference check (``verify`` row) in the current results that does not pass;
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
