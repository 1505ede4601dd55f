"""``speedup``: does a second GPU help? One implementation at (sequence length x batch) cases,
on one GPU and spread over P GPUs by each strategy (``attnbench.sweeps.kinds.speedup.runner``); a profile's
``[[speedup]]`` table is a series of this kind.

Plan: the device resolved, ``gpus`` clipped to the visible GPUs on CUDA (with one GPU only the
single-GPU baseline runs; what was clipped is returned in words, for the run's env), every bad
input raised. Run: every case, every strategy. Its rows say it all (tables compute speedups)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attnbench import impls
from attnbench.plan import Series
from attnbench.sweeps.kinds import register
from attnbench.sweeps.kinds.base import resolved_device
from attnbench.sweeps.kinds.speedup.runner import SpeedupRunner, check_settings, gpus_of
from attnbench.trials import strategies
from attnbench.trials.reference import VerifyCase


class Speedup:
    name = "speedup"
    row_kinds: tuple[str, ...] = ()  # its rows are replayed by their own key (SpeedupRunner)
    result_kinds: tuple[str, ...] = ()

    def resolve(self, s: Series, have_cuda: bool, gpus: int, clip: bool) -> tuple[Series, str | None]:
        st = s.settings
        device = resolved_device(st.device, have_cuda)
        s, note = replace(s, settings=replace(st, device=device)), None
        if clip and device == "cuda" and gpus_of(s) > gpus:
            note = f"speedup {s.impl} ({st.speedup.module}, {st.mode}): {gpus_of(s)} GPUs asked, {gpus} visible"
            s = replace(s, settings=replace(s.settings, gpus=(max(gpus, 1),)))
            if gpus_of(s) < 2:  # nothing to spread over: what needs one GPU alone
                kept = tuple(n for n in st.speedup.strategies if strategies.get(n).min_gpus <= 1)
                note += f"; only its one-GPU strategies ran ({', '.join(('single', *kept))})"
                s = replace(s, settings=s.settings.with_values(strategies=kept, grad_compression=None))
        return check_settings(s, gpus, cases_given=False), note

    def verify_cases(self, s: Series) -> list[VerifyCase]:
        """The configuration against the float64 reference at a small length (forward)."""
        st = s.settings
        impl = impls.build(s.impl, **s.config)
        return [
            VerifyCase(
                s.impl,
                impl.config(),
                min(st.speedup.cases[0].batch, 2),
                impl.verify_seq_len(),
                st.heads,
                st.head_dim,
                st.causal,
                st.dtype,
                st.device,
            )
        ]

    def run(self, s: Series, runner, index: int, total: int) -> Any:
        runner.reporter.series_started(s, index, total)  # its trial lines name cases, not the series
        SpeedupRunner(s, runner, reporter=runner.speedup_reporter).run_cases()
        return None

    def unverified(self, s: Series, runner, index: int, total: int) -> None:
        """Nothing runs; the outcome says the check failed."""


SPEEDUP = register(Speedup())
