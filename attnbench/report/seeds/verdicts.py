"""The verdict rule: one way to hold every seed claim against what was measured, with a short
reason for each verdict. docs/design/verdicts.md says it in words; in order:

1. A claim that names nothing a row measures (the seed's arithmetic, another device's absolute
   speed) is *not comparable*; its note says why.
2. A claim no machine has rows for on the seed's terms is *not measured yet*, saying where the
   rows can come from.
3. The seed's number stands for every value its printing rounds to it (0.03 GB: 0.025 to
   0.035 GB). A number rounded more coarsely than the tolerance cannot be tested by its size:
   *not comparable*.
4. Size: the measured value, its 95% interval where it has one, must meet the seed's range
   widened by the tolerance, a factor of 1.25 either way. A lower bound (a search stopped by
   time or its cap, or run under less memory than the claim's) settles only what it already
   exceeds. Memory of a seed that states no heads or head dim is also read over the floor: where
   half to twice the assumed width would close the gap, the verdict is *inconclusive* and says so.
5. Direction: a claim that also says on which side of a threshold the quantity lies (slower
   than one GPU: a speedup below 1) holds there when the whole interval lies on that side. A
   speed ratio whose one-GPU calls spend ``HOST_SHARE`` or more of their time on the host is
   judged by its direction alone (*direction confirmed, magnitude not judged*).

Before any of that, comparable terms: only a measurement on the seed's terms settles a claim. A
fit's prediction never does, nor a ring that sent less than ``RING_SHARE`` of a shard's keys and
values per call (both *not measured yet*), nor a speedup case the speedup tables flag as an
anomaly (*inconclusive*), nor a CPU's speed where a GPU measured the claim. Every reason ends with
the quantity and the hardware on each side, and what the claim assumed.

*confirmed*: size agrees and the direction (if any) holds. *direction confirmed, magnitude
refuted*: the direction holds, the size does not. *refuted*: the direction is wrong, or the
size disagrees where the direction is unsettled or not claimed. *inconclusive*: the size
agrees but the interval spans the threshold, a lower bound stops short of the claim, the unknown
shape spans the gap, or the only case is an anomaly.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.report.seeds.claims import BYTES, HARDWARE_BOUND, Claim, load_claims, value_text
from attnbench.report.seeds.measured import HOST_SHARE, RING_SHARE, Measured, compute_bound, measure
from attnbench.units import short_tokens

TOLERANCE = 1.25  # a measured value within this factor of the seed's range agrees with it
SHAPE_SPAN = 2  # an unstated width (heads x head dim) lies within this factor of the assumed one

CONFIRMED = "confirmed"
DIRECTION_HOLDS = "direction confirmed, magnitude not judged"
DIRECTION_ONLY = "direction confirmed, magnitude refuted"
REFUTED = "refuted"
INCONCLUSIVE = "inconclusive"
NOT_COMPARABLE = "not comparable"
NOT_MEASURED = "not measured yet"
VERDICTS = (CONFIRMED, DIRECTION_HOLDS, DIRECTION_ONLY, REFUTED, INCONCLUSIVE, NOT_COMPARABLE, NOT_MEASURED)

SEEDS_GPU_COMMAND = "attnbench run --profile seeds"
SEEDS_8GIB_COMMAND = "attnbench run --profile seeds-8gib"
SEEDS_TWO_GPU_COMMAND = "attnbench run --profile multi-gpu"
SPEED = ("speedup", "efficiency", "time_ms", "tokens_per_s")  # what a CPU's rows never settle where a GPU's exist


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    why: str  # the reason, the quantity and the hardware on each side, what was assumed
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
    return max(found, key=lambda m: (m.device == "cuda", m.date, m.machine))


def judge(claim: Claim, found: list[Measured]) -> Verdict:
    """The verdict of one claim from its measurements (one per machine that has rows)."""
    if not claim.comparable:
        return Verdict(claim, NOT_COMPARABLE, _reason(claim, claim.note), None)
    if claim.metric in SPEED and any(m.device == "cuda" for m in found):
        found = [m for m in found if m.device == "cuda"]  # a CPU's speed says nothing where a GPU's was measured
    if claim.metric in HARDWARE_BOUND and claim.over is None:  # rule 1: another device's speed
        m = chosen(found) if found else None
        return Verdict(claim, NOT_COMPARABLE, _reason(claim, "a GTX 1080's absolute speed is no other device's", m), m)
    if not found:
        return Verdict(claim, NOT_MEASURED, _reason(claim, where_from(claim)), None)
    settled = [m for m in found if unsettled(m) is None]
    if not settled:
        return _unsettled_verdict(claim, chosen(found))
    m = chosen(settled)
    if m.bound:
        verdict, why = _compare_bound(claim, m)
    elif speed_ratio(claim) and not is_bound(claim) and not compute_bound(m.hosts):
        verdict, why = _direction_alone(claim, m)
    else:
        verdict, why = _compare(claim, m)
    return Verdict(claim, verdict, _reason(claim, why, m), m)


def speed_ratio(claim: Claim) -> bool:
    """A ratio of times (a speedup, an efficiency, one time over another): portable from a GTX
    1080 only where the GPU's work, not the host's launch cost, sets the times."""
    return claim.metric in ("speedup", "efficiency") or (claim.over is not None and claim.metric in HARDWARE_BOUND)


def unsettled(m: Measured) -> str | None:
    """Why a measurement is off the seed's terms (comparable terms), or None where it settles."""
    if m.fitted:
        return "fitted"
    if any(share is None for share in m.moved):
        return "sent unrecorded"
    if any(share < RING_SHARE for share in m.moved):
        return "moved too little"
    if m.anomaly:
        return "anomaly"
    return None


def _unsettled_verdict(claim: Claim, m: Measured) -> Verdict:
    why = unsettled(m)
    if why == "fitted":  # only a longest sequence under a limit is ever fitted
        core = f"not measured under the seed's {claim.budget_gib} GB: {where_from(claim)}; "
        if claim.over is None:
            core += (
                f"{m.notes[0]} on {m.hardware} predicts about {short_tokens(int(m.value))}, a prediction and no verdict"
            )
        else:
            core += f"only memory fits on {m.hardware} predict it, and a prediction is no verdict"
        return Verdict(claim, NOT_MEASURED, _reason(claim, core), None)
    if why == "moved too little":
        core = (
            f"the ring of {m.workload} on {m.hardware} sent {share_text(min(m.moved))} of a shard's keys and values "
            f"per call, under the {RING_SHARE:.0%} a ring needs to settle what a ring holds or costs: {where_from(claim)}"
        )
        return Verdict(claim, NOT_MEASURED, _reason(claim, core), None)
    if why == "anomaly":
        core = f"the only matching case is one the speedup tables flag ({m.anomaly}): it settles nothing"
        return Verdict(claim, INCONCLUSIVE, _reason(claim, core, m), m)
    core = f"the ring's rows do not record the bytes it sent, so whether keys and values moved is unknown; {where_from(claim)}"
    return Verdict(claim, NOT_MEASURED, _reason(claim, core), None)


def share_text(share: float) -> str:
    """0.0094%, 6.2%, 81%, 300%: two significant digits below 10%, whole percents above."""
    pct = share * 100
    return f"{pct:.2g}%" if pct < 10 else f"{pct:.0f}%"


def _reason(claim: Claim, why: str, m: Measured | None = None) -> str:
    """A verdict's reason: why, then how the rows met the seed's terms (the ring's share of K/V,
    the host's share of a speed ratio's one-GPU calls), then the quantity and the hardware on each
    side, then what the claim assumed where the seed said nothing."""
    against = f" against {m.hardware}" if m else ""
    bits = [why, *terms(claim, m), f"{claim.quantity}: {claim.seed_hardware}{against}"]
    if claim.assumed:
        bits.append(f"assumed {claim.assumed}")
    return "; ".join(bits)


def terms(claim: Claim, m: Measured | None) -> list[str]:
    """How a measurement met the seed's terms, in words, where a rule asked."""
    if m is None:
        return []
    out = []
    if m.moved and all(share is not None for share in m.moved):
        out.append(f"the ring sent {share_text(min(m.moved))} of a shard's keys and values per call")
    if speed_ratio(claim) and m.hosts:
        shares = [h for h in m.hosts if h is not None]
        if shares:
            calls = "call spends" if len(m.hosts) == 1 else "calls spend at most"
            their = "its" if len(m.hosts) == 1 else "their"
            out.append(f"the one-GPU {calls} {share_text(max(shares))} of {their} eager time on the host")
    return out


def _direction_alone(claim: Claim, m: Measured) -> tuple[str, str]:
    """A speed ratio whose one-GPU call the host dominates: its size says how fast this host
    launches a call, not what the seed's GPU-bound calls would do; only its side is judged."""
    if any(h is None for h in m.hosts) or not m.hosts:
        why = "the one-GPU call's host share is not recorded"
    else:
        why = f"the host takes {HOST_SHARE:.0%} or more of the one-GPU call"
    low = m.low if m.low is not None else m.value
    high = m.high if m.high is not None else m.value
    side = _side(claim.direction, low, high)
    if side is None:
        return NOT_MEASURED, f"no compute-bound case: {why}; {where_from(claim)}"
    said = f"{_side_words(claim)}: {value_text(claim.metric, m.value)}"
    if side == "holds":
        return DIRECTION_HOLDS, f"{said}, as the seed says; its size is not judged: {why}"
    if side == "fails":  # the wrong side whatever the host costs
        return REFUTED, f"not {said}"
    return INCONCLUSIVE, f"the 95% interval spans {claim.direction.partition(':')[2]}; its size is not judged: {why}"


def _compare(claim: Claim, m: Measured) -> tuple[str, str]:
    """Verdict and reason from a measured value and its interval (rules 3 to 5)."""
    low = m.low if m.low is not None else m.value
    high = m.high if m.high is not None else m.value
    side = _side(claim.direction, low, high)
    if is_bound(claim):  # "at least 2M tokens": the side is the whole claim
        said = f"{_side_words(claim)}: {value_text(claim.metric, m.value)}"
        verdict = {"holds": CONFIRMED, "fails": REFUTED}.get(side, INCONCLUSIVE)
        return verdict, said if side == "holds" else f"not {said}"
    size = _size(claim, low, high)
    ratio = ratio_words(m.value, claim, size)
    shape = _shape_span(claim, m, low, high) if size == "differs" else None
    if shape is not None and side is None:
        spans, words = shape
        return (INCONCLUSIVE, f"{ratio} at the assumed shape, but {words}") if spans else (REFUTED, f"{ratio}; {words}")
    if side == "fails":
        side_name, x = claim.direction.split(":")
        return REFUTED, f"not {side_name} {x}: {ratio}"
    if size == "coarse":
        if side == "holds":
            return CONFIRMED, f"{_side_words(claim)} as the seed says; its number is too coarse to test"
        lo, hi = claim.seed_range
        pct = (hi - lo) / 2 / claim.seed_value * 100
        return NOT_COMPARABLE, f"the seed's {claim.seed_text} is rounded to ±{pct:.0f}%, coarser than the tolerance"
    if side == "holds":
        if size == "agrees":
            return CONFIRMED, f"{_side_words(claim)}, {ratio}"
        return DIRECTION_ONLY, f"{_side_words(claim)} as the seed says, but {ratio}"
    if side == "unsettled" and size == "agrees":
        side_name, x = claim.direction.split(":")
        return INCONCLUSIVE, f"the 95% interval spans {x}; {ratio}"
    return (CONFIRMED if size == "agrees" else REFUTED), ratio


def _compare_bound(claim: Claim, m: Measured) -> tuple[str, str]:
    """A lower bound settles only what it already passed: a threshold below it, a size it exceeds."""
    text = f"at least {value_text(claim.metric, m.value)}"
    side, _, x = (claim.direction or "").partition(":")
    past = bool(x) and m.value > float(x)
    if side == "below" and past:
        return REFUTED, f"not {_side_words(claim)}: {text}"
    if side == "above" and past and is_bound(claim):
        return CONFIRMED, f"{_side_words(claim)}: {text}"
    if not is_bound(claim) and m.value > claim.seed_range[1] * TOLERANCE:
        words = f"{text}, at least {factor(m.value / claim.seed_value)}x the seed's value"
        return (DIRECTION_ONLY, f"{_side_words(claim)} as the seed says, but {words}") if past else (REFUTED, words)
    return INCONCLUSIVE, f"{text}, a lower bound that does not settle the seed's {claim.seed_text}: {where_from(claim)}"


def _shape_span(claim: Claim, m: Measured, low: float, high: float) -> tuple[bool, str] | None:
    """Memory of a seed that states no heads or head dim, read over the floor (q, k, v and the
    output of the tokens it holds): whether a width from 1/SHAPE_SPAN to SHAPE_SPAN times the
    assumed one brings the seed's number within the tolerance of the measured, and in words."""
    if claim.shape_stated or claim.metric not in BYTES or claim.over is not None or not m.floor:
        return None
    s_low, s_high = claim.seed_range
    spans = high >= s_low / (TOLERANCE * SHAPE_SPAN) and low <= s_high * TOLERANCE * SHAPE_SPAN
    seed = claim.seed_value / m.floor
    words = (
        f"the seed states no heads or head dim: over the floor of q, k, v and the output "
        f"({value_text(claim.metric, m.floor)} at the assumed shape), the measured is {m.value / m.floor:.2f}x, "
        f"the seed's {seed:.2f}x, and {seed / SHAPE_SPAN:.2f}x to {seed * SHAPE_SPAN:.2f}x at "
        f"{SHAPE_SPAN:g} times to 1/{SHAPE_SPAN:g} of the assumed width"
    )
    return spans, words + (": the unknown shape spans the gap" if spans else ": no such shape closes the gap")


def where_from(claim: Claim) -> str:
    if claim.rows_from:
        return claim.rows_from
    where = claim.where
    if where == "two GPUs":
        if claim.metric == "max_seq_8gb":
            return f"needs two GPUs under an 8 GiB allocator limit: `{SEEDS_TWO_GPU_COMMAND} --part seed-capacity`"
        return f"needs two GPUs: `{SEEDS_TWO_GPU_COMMAND}`"
    if claim.metric == "max_seq_8gb":
        return f"one GPU measures it under an 8 GiB allocator limit: `{SEEDS_8GIB_COMMAND}`"
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
