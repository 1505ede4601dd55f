"""The verdict rule: one way to hold every seed claim against what was measured, with a short
reason for each verdict. docs/verdicts.md says it in words; in order:

1. A claim that names nothing a row measures (the seed's arithmetic, a projection onto hardware
   not measured, another device's absolute speed) is *not comparable*; its note says why.
2. A claim no machine has rows for is *not measured yet*, saying where the rows can come from.
3. The seed's number stands for every value its printing rounds to it (0.03 GB: 0.025 to
   0.035 GB). A number rounded more coarsely than the tolerance cannot be tested by its size:
   *not comparable*.
4. Size: the measured value, its 95% interval where it has one, must meet the seed's range
   widened by the tolerance, a factor of 1.25 either way.
5. Direction: a claim that also says on which side of a threshold the quantity lies (slower
   than one GPU: a speedup below 1) holds there when the whole interval lies on that side.

*confirmed*: size agrees and the direction (if any) holds. *direction confirmed, magnitude
refuted*: the direction holds, the size does not. *refuted*: the direction is wrong, or the
size disagrees where the direction is unsettled or not claimed. *inconclusive*: the size
agrees but the interval spans the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.report.claims import HARDWARE_BOUND, Claim, load_claims, value_text
from attnbench.report.measured import Measured, measure

TOLERANCE = 1.25  # a measured value within this factor of the seed's range agrees with it

CONFIRMED = "confirmed"
DIRECTION_ONLY = "direction confirmed, magnitude refuted"
REFUTED = "refuted"
INCONCLUSIVE = "inconclusive"
NOT_COMPARABLE = "not comparable"
NOT_MEASURED = "not measured yet"
VERDICTS = (CONFIRMED, DIRECTION_ONLY, REFUTED, INCONCLUSIVE, NOT_COMPARABLE, NOT_MEASURED)

SEEDS_GPU_COMMAND = "attnbench run --profile seeds"
SEEDS_CPU_COMMAND = "attnbench run --profile seeds-cpu"


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    why: str  # one short sentence
    measured: Measured | None

    @property
    def ratio(self) -> float | None:
        """Measured over the seed's value, where both exist and the seed's is not zero."""
        if self.measured is None or not self.claim.seed_value:
            return None
        return self.measured.value / self.claim.seed_value


def verdicts(machines, claims: list[Claim] | None = None) -> list[Verdict]:
    claims = load_claims() if claims is None else claims
    out = []
    for c in claims:
        found = [x for x in (measure(c, m) for m in machines) if x is not None] if c.comparable else []
        out.append(judge(c, found))
    return out


def chosen(found: list[Measured]) -> Measured:
    """The measurement a verdict rests on: a GPU's before the CPU's (the seeds measured GPUs),
    then the newest."""
    return max(found, key=lambda m: (not m.machine.startswith("cpu"), m.date, m.machine))


def judge(claim: Claim, found: list[Measured]) -> Verdict:
    """The verdict of one claim from its measurements (one per machine that has rows)."""
    if not claim.comparable:
        return Verdict(claim, NOT_COMPARABLE, claim.note, None)
    if claim.metric in HARDWARE_BOUND and claim.over is None:  # rule 1: another device's speed
        m = chosen(found) if found else None
        here = f"; this is {device_name(m.machine)}'s" if m else ""
        return Verdict(claim, NOT_COMPARABLE, f"a GTX 1080's absolute speed{here}", m)
    if not found:
        return Verdict(claim, NOT_MEASURED, where_from(claim), None)
    m = chosen(found)
    low = m.low if m.low is not None else m.value
    high = m.high if m.high is not None else m.value
    side = _side(claim.direction, low, high)
    if is_bound(claim):  # "at least 2M tokens": the side is the whole claim
        said = f"{_side_words(claim)}: {value_text(claim.metric, m.value)}"
        verdict = {"holds": CONFIRMED, "fails": REFUTED}.get(side, INCONCLUSIVE)
        return Verdict(claim, verdict, said if side == "holds" else f"not {said}", m)
    size = _size(claim, low, high)
    ratio = ratio_words(m.value, claim, size)
    if side == "fails":
        side_name, x = claim.direction.split(":")
        return Verdict(claim, REFUTED, f"not {side_name} {x}: {ratio}", m)
    if size == "coarse":
        if side == "holds":
            return Verdict(
                claim, CONFIRMED, f"{_side_words(claim)} as the seed says; its number is too coarse to test", m
            )
        lo, hi = claim.seed_range
        pct = (hi - lo) / 2 / claim.seed_value * 100
        return Verdict(
            claim,
            NOT_COMPARABLE,
            f"the seed's {claim.seed_text} is rounded to ±{pct:.0f}%, coarser than the tolerance",
            m,
        )
    if side == "holds":
        if size == "agrees":
            return Verdict(claim, CONFIRMED, f"{_side_words(claim)}, {ratio}", m)
        return Verdict(claim, DIRECTION_ONLY, f"{_side_words(claim)} as the seed says, but {ratio}", m)
    if side == "unsettled" and size == "agrees":
        side_name, x = claim.direction.split(":")
        return Verdict(claim, INCONCLUSIVE, f"the 95% interval spans {x}; {ratio}", m)
    return Verdict(claim, CONFIRMED if size == "agrees" else REFUTED, ratio, m)


def device_name(machine: str) -> str:
    """A machine in a sentence: 'a CPU', 'an NVIDIA H200 x1'."""
    return "a CPU" if machine.startswith("cpu") else f"an {machine}"


def where_from(claim: Claim) -> str:
    where = claim.where
    if where == "two GPUs":
        return "needs two GPUs"
    if where == "CPU":
        return f"the CPU measures it: `{SEEDS_CPU_COMMAND}`"
    return f"one GPU measures it: `{SEEDS_GPU_COMMAND}`"


def is_bound(claim: Claim) -> bool:
    """A claim whose number is its threshold ("at least 2M tokens"): it has no size to test."""
    return bool(claim.direction) and float(claim.direction.partition(":")[2]) == claim.seed_value


def _size(claim: Claim, low: float, high: float) -> str:
    """agrees, differs, or coarse (the seed's rounding is wider than the tolerance)."""
    seed, (s_low, s_high) = claim.seed_value, claim.seed_range
    if seed == 0:  # nothing to scale a tolerance by: the seed's rounding is the range
        return "agrees" if low <= s_high and high >= s_low else "differs"
    if (s_high - s_low) / 2 / abs(seed) > TOLERANCE - 1:
        return "coarse"
    lo, hi = sorted((s_low / TOLERANCE, s_high * TOLERANCE))
    return "agrees" if high >= lo and low <= hi else "differs"


def _side(direction: str | None, low: float, high: float) -> str | None:
    """holds, fails or unsettled for a claim that states a side of a threshold; None otherwise."""
    if not direction:
        return None
    side, _, x = direction.partition(":")
    bound = float(x)
    if side == "above":
        return "holds" if low > bound else "fails" if high <= bound else "unsettled"
    return "holds" if high < bound else "fails" if low >= bound else "unsettled"


def _side_words(claim: Claim) -> str:
    side, x = claim.direction.split(":")
    return f"{side} {value_text(claim.metric, float(x)) if claim.over is None else x}"


def ratio_words(value: float, claim: Claim, size: str) -> str:
    """The measured value against the seed's, in a few words."""
    seed = claim.seed_value
    if seed == 0:
        zero = size == "agrees"
        return "zero, as the seed says" if zero else f"{value_text(claim.metric, value)} where the seed says zero"
    r = value / seed
    if r <= 0:
        return f"{value_text(claim.metric, value)} where the seed says {claim.seed_text}"
    if 1 / TOLERANCE <= r <= TOLERANCE:
        return f"{r:.2f}x the seed's value, within a factor of {TOLERANCE:g}"
    if size == "agrees":  # outside the factor by the point value, inside by its interval or the seed's rounding
        return f"{r:.2f}x the seed's value, within a factor of {TOLERANCE:g} of its rounding or the interval"
    if r > 1:
        return f"{factor(r)}x the seed's value"
    return f"1/{factor(1 / r)} of the seed's value"


def factor(x: float) -> str:
    """2.4, 57, 2,676: two significant digits, whole numbers from 10 up."""
    return f"{x:.2g}" if x < 10 else f"{x:,.0f}"
