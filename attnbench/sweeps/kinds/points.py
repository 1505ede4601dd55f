"""``points``: time each of the series' ``seq_lens``, each in ``repeat`` fresh processes (the
gate's unit of a timed point is the process). The trials say it all: no summary row."""

from __future__ import annotations

from attnbench.errors import AttnbenchError
from attnbench.plan import Series
from attnbench.sweeps.kinds import register
from attnbench.sweeps.kinds.base import TrialKind


class Points(TrialKind):
    name = row_kind = "points"

    def check(self, s: Series) -> None:
        if not s.settings.points.seq_lens:
            raise AttnbenchError(f"{s.name}: a points sweep needs seq_lens, e.g. --seq-lens 65536,131072")

    def lengths(self, s: Series) -> list[int]:
        return list(s.settings.points.seq_lens)

    def trials(self, s: Series, runner) -> None:
        for n in s.settings.points.seq_lens:
            runner.trial(s, n, "point", processes=s.settings.points.repeat)


POINTS = register(Points())
