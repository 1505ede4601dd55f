"""What a check applies and what it decides: its thresholds, its findings and the report
(verdicts, exit code, headline, JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from attnbench.check.significance import MIN_PROCESSES, MIN_SAMPLES, NOT_GATED, TIME_FACTORS
from attnbench.errors import AttnbenchError
from attnbench.results import clean_floats

ASPECTS = ("time", "memory", "capacity", "correctness", "bytes")
DETERMINISTIC_ASPECTS = ("correctness", "capacity", "bytes")


VERDICTS = ("regression", "improvement", NOT_GATED, "unchanged")
# A resident-set peak (the CPU's counter) moves by several MiB between runs of the same code:
# per-thread allocator arenas, library pages a kernel touches, heap fragmentation. A change
# smaller than this is within that noise, whatever its factor.
RSS_NOISE_BYTES = 16 << 20


@dataclass(frozen=True)
class Thresholds:
    time_factor: float | None = None  # None: the device's stated minimum (TIME_FACTORS)
    memory_factor: float = 1.02
    aspects: tuple[str, ...] = ASPECTS
    deterministic: bool = False
    allow_missing: bool = False  # missing trials or reference checks do not fail the gate

    def check(self) -> None:
        if not (self.time_factor is None or self.time_factor >= 1.0) or not self.memory_factor >= 1.0:
            raise AttnbenchError("--time-factor and --memory-factor must be at least 1.0, e.g. --time-factor 1.10")
        unknown = [a for a in self.aspects if a not in ASPECTS]
        if unknown or not self.aspects:
            raise AttnbenchError(f"--only {','.join(self.aspects)}: choose from {','.join(ASPECTS)}")
        if self.deterministic and set(self.aspects) - set(DETERMINISTIC_ASPECTS):
            raise AttnbenchError(
                f"--deterministic checks only {','.join(DETERMINISTIC_ASPECTS)}: "
                "time and memory depend on the machine; drop them from --only"
            )

    def time_factor_for(self, device: str) -> float:
        """The minimum factor a time change must pass: as given, else the device's."""
        return self.time_factor or TIME_FACTORS.get(device, TIME_FACTORS["cpu"])

    def time_factor_text(self) -> str:
        if self.time_factor:
            return f"x{self.time_factor:g}"
        return ", ".join(f"x{f:g} on {'a GPU' if d == 'cuda' else 'a CPU'}" for d, f in TIME_FACTORS.items())


@dataclass
class Finding:
    aspect: str
    verdict: str  # regression | improvement | not gated | unchanged
    trial: str
    device_model: str
    baseline: str
    current: str
    change: str
    evidence: str = ""  # for "not gated": why the point cannot be judged
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def blocking(self) -> bool:
        """Only a regression fails the gate; a point that cannot be judged says so instead."""
        return self.verdict == "regression"


@dataclass
class CheckReport:
    baseline: dict[str, Any]
    current: dict[str, Any]
    thresholds: Thresholds
    findings: list[Finding]
    added: list[str]
    missing: list[str]
    not_compared: list[str]
    warnings: list[str]

    def of(self, verdict: str) -> list[Finding]:
        return [f for f in self.findings if f.verdict == verdict]

    @property
    def exit_code(self) -> int:
        """1 on a regression or (unless allowed) anything the baseline measured or checked
        that the current results lack."""
        return 1 if any(f.blocking for f in self.findings) or self.missing_blocks else 0

    @property
    def missing_blocks(self) -> bool:
        return bool(self.missing) and not self.thresholds.allow_missing

    def headline(self) -> str:
        regressions = self.of("regression")
        bits = []
        if regressions:
            bits.append(f"{len(regressions)} regression{'s' * (len(regressions) != 1)}")
        if self.missing_blocks:
            bits.append(f"{len(self.missing)} missing (pass --allow-missing to accept)")
        verdict = "FAIL" if self.exit_code else "PASS"
        n = len(self.of("improvement"))
        rest = [f"{n} improvement{'s' * (n != 1)}", f"{len(self.of('unchanged'))} unchanged"]
        if self.of(NOT_GATED):
            rest.append(f"{len(self.of(NOT_GATED))} not gated")
        return f"{verdict}: " + ", ".join(bits + rest)

    def to_json(self) -> dict[str, Any]:
        return clean_floats(
            {
                "result": "fail" if self.exit_code else "pass",
                "exit_code": self.exit_code,
                "baseline": self.baseline,
                "current": self.current,
                "thresholds": asdict(self.thresholds),
                "min_samples_per_side": MIN_SAMPLES,
                "min_processes_per_side": MIN_PROCESSES,
                "counts": {v: len(self.of(v)) for v in VERDICTS},
                "findings": [{**asdict(f), "blocking": f.blocking} for f in self.findings],
                "added": self.added,
                "missing": self.missing,
                "not_compared": self.not_compared,
                "warnings": self.warnings,
            }
        )
