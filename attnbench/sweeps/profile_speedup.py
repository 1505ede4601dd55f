"""A profile's ``[[speedup]]`` tables: the runs of ``attnbench speedup`` inside a profile, so one
``attnbench run --profile NAME`` holds max-seq, points, sequence-parallel and speedup runs.

A table names the implementation and its parameters, ``cases`` (SEQLENxBATCH, a list or one
comma-separated string), ``strategies`` (dp, mp; single always runs), ``module``,
``grad_compression`` and ``gpus`` (GPUs to spread over; on the CPU, processes). The profile's
top-level settings that a speedup run has (device, dtype, heads, head_dim, mode, causal,
max_trial_seconds and the timing keys) apply unless the table sets its own.

On CUDA ``gpus`` is clipped to the visible GPUs; with one GPU only the single-GPU baseline runs.
What was clipped is returned in words, for the run's env.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.sweeps.speedup import SpeedupSettings, check_settings, parse_cases, parse_strategies

# settings of plan.Settings that a speedup run uses
SHARED = ("device", "dtype", "heads", "head_dim", "mode", "causal", "max_trial_seconds")
TIMING = ("warmup", "min_samples", "max_samples", "target_ms")
OWN = ("impl", "cases", "strategies", "module", "grad_compression", "gpus")


# the plan's split_entry(entry, where, setting_keys, skip, known) -> (impl, parsed settings, parameters)
EntrySplitter = Callable[..., tuple[str, dict[str, Any], dict[str, Any]]]


def parse_entries(
    entries: list[dict[str, Any]], base: dict[str, Any], profile: str, split_entry: EntrySplitter
) -> list[SpeedupSettings]:
    """Each table as SpeedupSettings (``device`` may still be ``auto``); bad keys name the table.
    ``split_entry`` is the plan's: it splits a table's keys into settings (parsed) and the
    implementation's parameters (passed in: the plan imports this module)."""
    return [parse_entry(e, base, f"profile {profile}, speedup {i}", split_entry) for i, e in enumerate(entries, 1)]


def _known_keys(impl: str, params: set[str]) -> str:
    return (
        f"speedup keys: {', '.join(OWN + SHARED + TIMING)}; parameters of {impl}: {', '.join(sorted(params)) or 'none'}"
    )


def parse_entry(entry: dict[str, Any], base: dict[str, Any], where: str, split_entry: EntrySplitter) -> SpeedupSettings:
    impl, settings, config = split_entry(entry, where, SHARED + TIMING, OWN, _known_keys)
    merged = {k: v for k, v in base.items() if k in SHARED + TIMING}
    merged.update(settings)
    cases = entry.get("cases")
    if cases is None:
        raise AttnbenchError(f'{where}: missing key \'cases\', e.g. cases = ["2048x8", "4096x4"]')
    gpus = entry.get("gpus", 2)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise AttnbenchError(f"{where}: 'gpus' must be a positive number of GPUs, got {gpus!r}")
    strategies = entry.get("strategies", ["dp", "mp"])
    return SpeedupSettings(
        impl=impl,
        config=config,
        cases=parse_cases(",".join(cases) if isinstance(cases, list) else cases),
        gpus=gpus,
        strategies=parse_strategies(",".join(strategies) if isinstance(strategies, list) else strategies),
        module=entry.get("module", "attention"),
        grad_compression=entry.get("grad_compression"),
        dtype=merged.get("dtype", "bf16"),
        device=merged.get("device", "auto"),
        heads=merged.get("heads", 8),
        head_dim=merged.get("head_dim", 64),
        mode=merged.get("mode", "fwd"),
        causal=merged.get("causal", False),
        max_trial_seconds=merged.get("max_trial_seconds", 60.0),
        timing={k: merged[k] for k in TIMING if k in merged},
    )


def resolve(s: SpeedupSettings, have_cuda: bool, cuda_devices: int) -> tuple[SpeedupSettings, str | None]:
    """Device resolved, GPUs clipped to what is visible, every bad input raised; with the
    clipping in words (None when nothing was clipped)."""
    device = s.device
    if device == "auto":
        device = "cuda" if have_cuda else "cpu"
    if device == "cuda" and not have_cuda:
        raise AttnbenchError("--device cuda but no CUDA GPU is visible: run on a GPU machine or use --device cpu")
    s, note = replace(s, device=device), None
    if device == "cuda" and s.gpus > cuda_devices:
        note = f"speedup {s.impl} ({s.module}, {s.mode}): {s.gpus} GPUs asked, {cuda_devices} visible"
        s = replace(s, gpus=max(cuda_devices, 1))
        if s.gpus < 2:  # nothing to spread over: the single-GPU half alone
            note += "; only the single-GPU baseline ran"
            s = replace(s, strategies=(), grad_compression=None)
    return check_settings(s, cuda_devices, cases_given=False), note
