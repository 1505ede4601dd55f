"""What result rows answer, computed once for every reader: the report, the regression check
and the command line's readouts derive a question's answer here, never each its own way.

- ``search``: how a max-seq search ended (its longest length, the first failure above it, what
  stopped it, whether it finished), from its trials and its result row.
- ``ranks``: how the ranks of one multi-rank trial make one measurement (the slowest rank's
  call, its first call), for sequence-parallel and speedup trials alike.
"""

from attnbench.analysis.search import SearchOutcome, search_outcome

__all__ = ["SearchOutcome", "search_outcome"]
