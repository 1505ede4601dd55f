"""What every trial-based sweep kind shares: resolving a series' device and ranks, the checks
of its settings, its reference-check case, and the frame of its run (announce the series,
run its trials, summarise, report the outcome). A kind fills in ``check``, ``lengths`` and
``trials`` (and ``summarise`` where its answer is a row of its own)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from attnbench import impls
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.plan import Series
from attnbench.trials.reference import VerifyCase
from attnbench.trials.workload import check_heads


def resolved_device(device: str, have_cuda: bool) -> str:
    """``auto``: cuda where a GPU is visible, else cpu; cuda where none is, refused."""
    if device == "cuda" and not have_cuda:
        raise AttnbenchError("--device cuda but no CUDA GPU is visible: run on a GPU machine or use --device cpu")
    return ("cuda" if have_cuda else "cpu") if device == "auto" else device


class TrialKind:
    """A kind whose trials are single measured calls at sequence lengths (``runner.trial``)."""

    name = ""
    row_kind = ""  # the kind of row its trials are written as: max-seq or points, so every reader knows them
    result_kinds: tuple[str, ...] = ()

    @property
    def row_kinds(self) -> tuple[str, ...]:
        return (self.row_kind,)

    # --- plan ------------------------------------------------------------------------------
    def resolve(self, s: Series, have_cuda: bool, gpus: int, clip: bool) -> tuple[Series | None, str | None]:
        device = resolved_device(s.settings.device, have_cuda)
        s = replace(s, settings=replace(s.settings, device=device))
        if clip and s.distributed and device == "cuda" and s.world_size > gpus:
            return None, f"{s.name}: {s.world_size} GPUs asked, {gpus} visible; not run"
        check_trial_series(s)
        self.check(s)
        impl = s.build()
        lengths = self.lengths(s)
        try:
            for n in lengths:
                impl.check_shape(n, s.settings.heads)
        except ConfigError as exc:
            raise AttnbenchError(str(exc)) from None
        if lengths:
            check_fits_device(s, min(lengths))
        return s, None

    def check(self, s: Series) -> None:
        """Bad input of this kind's own settings (AttnbenchError naming the fix)."""

    def lengths(self, s: Series) -> list[int]:
        """Lengths whose shape is checked before anything runs."""
        return []

    def verify_cases(self, s: Series) -> list[VerifyCase]:
        """The exact configuration, dtype, device, head layout and causality of the series, at
        a small length where the float64 reference is cheap."""
        impl = s.build()
        st = s.settings
        # a training series checks its gradients too (sequence-parallel ones run forward only)
        mode = st.mode if s.world_size == 1 and not impls.spec(s.impl).distributed else "fwd"
        return [
            VerifyCase(
                s.impl,
                impl.config(),
                min(st.batch, 2),
                impl.verify_seq_len(),
                st.heads,
                st.head_dim,
                st.causal,
                st.dtype,
                st.device,
                s.world_size,
                mode,
                st.kv_heads,
            )
        ]

    # --- run -------------------------------------------------------------------------------
    def run(self, s: Series, runner, index: int, total: int) -> Any:
        runner.reporter.series_started(s, index, total)
        outcome = self.trials(s, runner)
        self.summarise(s, outcome, runner)
        runner.reporter.series_done(s, outcome)
        return outcome

    def unverified(self, s: Series, runner, index: int, total: int) -> None:
        runner.reporter.series_started(s, index, total)
        runner.reporter.series_done(s, None)

    def trials(self, s: Series, runner) -> Any:
        raise NotImplementedError

    def summarise(self, s: Series, outcome: Any, runner) -> None:
        """The row that states the series' answer, where its trials do not say it alone."""


def check_runs_on(s: Series) -> None:
    """The series' implementation runs on its device and dtype (every kind's first check)."""
    spec = impls.spec(s.impl)
    if s.settings.device not in spec.devices:
        raise AttnbenchError(f"{s.impl} does not run on {s.settings.device}: it runs on {', '.join(spec.devices)}")
    if s.settings.dtype not in spec.dtypes:
        raise AttnbenchError(f"{s.impl} does not run {s.settings.dtype}: choose --dtype from {', '.join(spec.dtypes)}")


def check_trial_series(s: Series) -> None:
    """The settings every trial-based series must get right."""
    check_runs_on(s)
    st = s.settings
    # each value's type and range was checked where it was read (plan.parse_settings); here
    # what depends on several values or on the implementation
    if not st.isolate and impls.outside_code_elsewhere(s.impl, s.config):
        raise AttnbenchError(
            f"{s.name} runs outside code, which attnbench runs only in a worker process of its own: "
            "drop --in-process (isolate = false in a profile)"
        )
    impl = s.build()
    check_call(s, impl)
    if s.distributed:
        from attnbench.sweeps import seqpar

        seqpar.check_world(st.device, s.world_size)
        seqpar.check_modes(s.impl, st.mode, st.causal, impl)


def check_call(s: Series, impl) -> None:
    """What every series' call must get right, whatever runs it (its trials here, a speedup's
    strategies): its heads, its sample counts, its device, causal masking where it has none
    (a sequence-parallel implementation's modes are checked with its ranks)."""
    st = s.settings
    check_heads(st.heads, st.kv_heads)
    if st.max_samples < max(1, st.min_samples):
        raise AttnbenchError(f"{s.name}: max_samples {st.max_samples} is below min_samples {st.min_samples}")
    if impl.device_problem(st.device):
        raise AttnbenchError(impl.device_problem(st.device))
    if st.causal and not s.distributed and not impl.supports_causal:
        raise AttnbenchError(
            f"{s.impl} with this configuration runs non-causal only (a 2-D grid has no causal order); drop --causal"
        )


@dataclass(frozen=True)
class Parallelism:
    """How the work is spread, named as a row's fields: a sequence-parallel implementation's
    ranks, or one device."""

    world_size: int
    strategy: str


def parallelism(s: Series) -> Parallelism:
    if s.distributed:
        from attnbench.sweeps.seqpar import STRATEGY

        return Parallelism(s.world_size, STRATEGY)
    return Parallelism(1, "single")


def check_fits_device(s: Series, seq_len: int, batch: int | None = None) -> None:
    """A series whose inputs and output alone, at its shortest length (a speedup case: at its
    length and ``batch``), exceed what the device holds cannot run a single trial: refused
    before anything runs, the keys named."""
    from attnbench.results.environment import device_memory_bytes
    from attnbench.units import format_bytes

    st = s.settings
    wl = s.workload(seq_len, batch)
    floor = wl.floor_bytes
    total = device_memory_bytes(st.device)
    if total is not None and floor > total:
        raise AttnbenchError(
            f"{s.name}: batch {wl.batch} x heads {st.heads} x head_dim {st.head_dim} at {seq_len:,} tokens needs "
            f"{format_bytes(floor)} for q, k, v and the output alone, more than the {st.device}'s "
            f"{format_bytes(total)}: lower batch, heads or the sequence length"
        )
