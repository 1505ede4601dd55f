"""Audit the seed verdicts of a generated report, independently of the report's code.

Draws claims at random (a fixed seed, so the same draw every time), reads the rows each verdict
cites (FILE:LINE in the report's csv/seed-claims.csv) straight from trials.jsonl, recomputes the
measured value from them, and judges the verdict class again by the rule of
docs/design/verdicts.md, written here from scratch: nothing of attnbench is imported. It counts

- numbers wrong: a measured value the cited rows do not give (more than 0.5% off);
- unfair: a verdict whose rows are off the seed's terms (another dtype than the seed's, a ring
  that moved under 10% of a shard's keys and values, a size judged on a host-bound call, a
  forward row for a training claim, a DataParallel case with other replicas than the seed's, an
  efficiency above 1, a search under more memory than the claim's), or whose class the rule,
  applied to the recomputed value, does not give;
- dodged: a claim left "not measured yet" although rows on its terms exist in the results.

Intervals are the report's (bootstrap, as printed); the values and every condition are recomputed.

    python scripts/audit_seed_verdicts.py REPORT_DIR [--results results] [--n 30] [--seed 53]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import re
import statistics
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLAIMS = ROOT / "attnbench" / "report" / "seeds" / "seed_claims.toml"
SEED = 53  # the draw: issue 53
TOLERANCE, RING_SHARE, HOST_SHARE, SHAPE_SPAN = 1.25, 0.10, 0.10, 2
ELEMENT = {"fp32": 4, "fp16": 2, "bf16": 2}
UNIT = {"GB": 1e9, "MB": 1e6, "KB": 1e3, "%": 0.01}
ROW_FIELDS = "kind impl strategy seq_len batch world_size dtype heads head_dim mode module device memory_limit".split()
BYTES = ("peak_bytes", "peak_per_gpu", "inputs_bytes", "added_bytes", "gpu0_bytes", "gpu1_bytes")
SPEEDS = ("speedup", "efficiency")
ABSOLUTE = ("time_ms", "tokens_per_s")
GIB = 1 << 30


# --- the claims, as the claims file states them ------------------------------------------------------


def load_claims(path: Path) -> list[dict]:
    raw = tomllib.loads(path.read_text())
    seeds = {s["id"]: s for s in raw["seed"]}
    claims = []
    for c in raw["claim"]:
        c = dict(c)
        c["dtype"], c["shape_stated"] = seeds[c["seed"]]["dtype"], seeds[c["seed"]]["shape_stated"]
        for side in ("match", "over"):
            if c.get(side) is not None:
                c[side] = {"dtype": c["dtype"], **c[side]}
        claims.append(c)
    return claims


def seed_range(c: dict) -> tuple[float, float, float]:
    """The seed's value and the range its printing or its words give, in the rows' units."""
    scale = UNIT.get(c["unit"].split(" ")[0], 1.0) / (c.get("per") or 1.0)
    value = c["value"] * scale
    if c.get("range"):
        return value, c["range"][0] * scale, c["range"][1] * scale
    text = c.get("printed") or repr(c["value"])
    half = 10.0 ** -(len(text.split(".")[1]) if "." in text else 0) / 2 * scale
    return value, value - half, value + half


# --- the rows -------------------------------------------------------------------------------------------


def read_line(ref: str) -> dict:
    path, line = ref.rsplit(":", 1)
    with open(ROOT / path) as f:
        for i, text in enumerate(f, 1):
            if i == int(line):
                return json.loads(text)
    raise SystemExit(f"{ref}: no such line; regenerate the report from these results")


def all_rows(results: Path) -> list[dict]:
    retired = set()
    superseded = results / "superseded.toml"
    if superseded.exists():
        retired = {r["run"] for r in tomllib.loads(superseded.read_text()).get("superseded", [])}
    rows = []
    for path in sorted(results.glob("*/trials.jsonl")):
        for i, text in enumerate(path.read_text().splitlines(), 1):
            row = json.loads(text)
            if row.get("run") not in retired:
                rows.append({**row, "_ref": f"{path.relative_to(ROOT)}:{i}"})
    return rows


def field(row: dict, key: str):
    if key == "world_size":
        return row.get("world_size") or 1
    if key == "strategy" and row.get("kind") != "speedup":
        return row.get("strategy") or ("ring" if (row.get("world_size") or 1) > 1 else None)
    return row.get(key)


def agrees(row: dict, match: dict) -> bool:
    config = row.get("config") or {}
    for key, want in match.items():
        if key in ROW_FIELDS:  # a list of a row field's values: any of them
            if field(row, key) not in (want if isinstance(want, list) else [want]):
                return False
        elif config.get(key, False if want is False else None) != want:  # a parameter: itself
            return False
    return True


def world(row: dict) -> int:
    return row.get("world_size") or 1


def shard_share(row: dict) -> float | None:
    """Bytes sent per call over one rank's keys and values."""
    if row.get("sent_bytes") is None:
        return None
    kv = 2 * row["batch"] * row["seq_len"] / world(row) * (row.get("kv_heads") or row["heads"]) * row["head_dim"]
    return row["sent_bytes"] / (kv * ELEMENT[row["dtype"]])


def replicas(row: dict) -> int:
    given = row.get("replica_batches")
    return sum(1 for _, b in given if b) if given else min(row.get("batch") or 1, world(row))


def gpu_peak(row: dict, i: int):
    gpus = row.get("gpus") or []
    return gpus[i]["max_memory_allocated"] if len(gpus) > i else None


def peak_per_gpu(row: dict):
    if world(row) > 1 and row.get("gpus"):
        return max(g["max_memory_allocated"] for g in row["gpus"] if g.get("max_memory_allocated") is not None)
    return row.get("peak_bytes")


def value_of(metric: str, rows: list[dict], lookup) -> float | None:
    """The quantity of one side of a claim from its rows alone."""
    if metric in SPEEDS:
        single = next(r for r in rows if r.get("strategy") == "single")
        multi = next(r for r in rows if r.get("strategy") != "single")
        speedup = statistics.median(single["times_ms"]) / statistics.median(multi["times_ms"])
        return speedup / world(multi) if metric == "efficiency" else speedup
    if metric in ("max_seq", "max_seq_8gb"):
        return max(r["seq_len"] for r in rows if r.get("status") == "ok")
    (row,) = {r["_ref"]: r for r in rows}.values()
    tokens = (row.get("batch") or 1) * row["seq_len"]
    return {
        "time_ms": lambda: row["time_ms"],
        "tokens_per_s": lambda: row.get("tokens_per_s") or tokens / (row["time_ms"] / 1e3),
        "peak_bytes": lambda: row["peak_bytes"],
        "peak_per_gpu": lambda: peak_per_gpu(row),
        "inputs_bytes": lambda: row["inputs_bytes"],
        "added_bytes": lambda: row["peak_bytes"] - row["inputs_bytes"],
        "added_per_token": lambda: (row["peak_bytes"] - row["inputs_bytes"]) / tokens,
        "bytes_per_token": lambda: peak_per_gpu(row) / (tokens / world(row)),
        "gpu0_bytes": lambda: gpu_peak(row, 0),
        "gpu1_bytes": lambda: gpu_peak(row, 1),
    }[metric]()


def floor_of(metric: str, row: dict) -> float | None:
    """q, k, v and the output of the tokens the memory holds."""
    per_token = 4 * row["heads"] * row["head_dim"] * ELEMENT[row["dtype"]] * (2 if row.get("mode") == "fwd_bwd" else 1)
    if metric == "peak_bytes":
        return row.get("floor_bytes") or per_token * row["batch"] * row["seq_len"]
    if metric == "peak_per_gpu":
        return per_token * row["batch"] * row["seq_len"] / world(row)
    if metric in ("gpu0_bytes", "gpu1_bytes"):
        gpu = int(metric[3])
        given = row.get("replica_batches") or [[0, row.get("batch") or 1]]
        batch = sum(b for g, b in given if g == gpu)
        return per_token * batch * row["seq_len"] if batch else None
    return None


# --- the rule, from its words -----------------------------------------------------------------------------


def side_of(direction: str | None, low: float, high: float) -> str | None:
    if not direction:
        return None
    side, x = direction.split(":")
    x = float(x)
    if side == "above":
        return "holds" if low > x else "fails" if high <= x else "unsettled"
    return "holds" if high < x else "fails" if low >= x else "unsettled"


def judge(c: dict, value: float, low: float, high: float, bound: bool, compute_bound: bool, floor) -> str:
    seed, s_low, s_high = seed_range(c)
    direction = c.get("direction")
    is_bound = bool(direction) and float(direction.split(":")[1]) == seed
    side = side_of(direction, low, high)
    if bound:
        past = bool(direction) and value > float(direction.split(":")[1])
        if direction and direction.startswith("below") and past:
            return "refuted"
        if direction and direction.startswith("above") and past and is_bound:
            return "confirmed"
        if not is_bound and value > s_high * TOLERANCE:
            return "direction confirmed, magnitude refuted" if past else "refuted"
        return "inconclusive"
    speed_ratio = c["metric"] in SPEEDS or (c.get("over") is not None and c["metric"] in ABSOLUTE)
    if speed_ratio and not is_bound and not compute_bound:
        return {
            None: "not measured yet",
            "holds": "direction confirmed, magnitude not judged",
            "fails": "refuted",
            "unsettled": "inconclusive",
        }[side]
    if is_bound:
        return {"holds": "confirmed", "fails": "refuted"}.get(side, "inconclusive")
    if seed == 0:
        size = "agrees" if low <= s_high and high >= s_low else "differs"
    elif (s_high - s_low) / 2 / abs(seed) > TOLERANCE - 1:
        size = "coarse"
    else:
        size = "agrees" if high >= s_low / TOLERANCE and low <= s_high * TOLERANCE else "differs"
    unstated = not c["shape_stated"] and c["metric"] in BYTES and c.get("over") is None and floor
    if size == "differs" and unstated and side is None:
        wide = high >= s_low / (TOLERANCE * SHAPE_SPAN) and low <= s_high * TOLERANCE * SHAPE_SPAN
        return "inconclusive" if wide else "refuted"
    if side == "fails":
        return "refuted"
    if size == "coarse":
        return "confirmed" if side == "holds" else "not comparable"
    if side == "holds":
        return "confirmed" if size == "agrees" else "direction confirmed, magnitude refuted"
    if side == "unsettled" and size == "agrees":
        return "inconclusive"
    return "confirmed" if size == "agrees" else "refuted"


NUMBER = r"([\d,.]+(?:e[+-]?\d+)?)\s*(x|%|ms|MB|GB|KB/token|tok/s)?"


def interval(measured: str, value: float) -> tuple[float, float]:
    """The report's printed interval, scaled as the value is; the value itself where none is."""
    found = re.search(r"\[" + NUMBER + r", " + NUMBER + r"\]", measured)
    if not found:
        return value, value
    scale = {"%": 0.01, "MB": 1e6, "GB": 1e9, "KB/token": 1e3}
    low = float(found.group(1).replace(",", "")) * scale.get(found.group(2), 1)
    high = float(found.group(3).replace(",", "")) * scale.get(found.group(4), 1)
    return low, high


# --- one claim ------------------------------------------------------------------------------------------------


def sides(c: dict, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """The cited rows of the claim's own side and of its ``over`` side (its stand-in where it stood in)."""

    def mine(m: dict) -> list[dict]:
        found = [r for r in rows if agrees(r, m)]
        return found or [r for r in rows if agrees(r, {**m, **(c.get("stand_in") or {})})]

    if c.get("over") is None:
        return rows, []
    top = mine(c["match"])
    return top, [r for r in rows if r not in top]


def search_bound(c: dict, rows: list[dict], results: list[dict]) -> bool:
    """A search's longest is a lower bound where time or its cap stopped it, or it ran under less
    memory than the claim's."""
    budget = (c.get("budget_gib") or 8) * GIB
    for r in rows:
        if c["metric"] == "max_seq_8gb" and (r.get("memory_limit") or 0) < budget:
            return True
        result = [x for x in results if x.get("kind") == "max-seq-result" and x.get("series") == r.get("series")
                  and x.get("run") == r.get("run")]  # fmt: skip
        if result and result[-1].get("stopped_by") not in ("memory", "host memory"):
            return True
    return bool(c.get("bound_stand_in")) and any(not agrees(r, c["match"]) for r in rows)


def off_terms(c: dict, rows: list[dict], verdict: str) -> list[str]:
    """How the cited rows leave the seed's terms, in words."""
    out = []
    stood = (c.get("stand_in") or {}).get("dtype")
    for r in rows:
        if r.get("dtype") != c["dtype"] and r.get("dtype") not in c["says"] and r.get("dtype") != stood:
            out.append(f"{r['_ref']} is {r.get('dtype')}, seed {c['seed']} is judged in {c['dtype']}")
        if r.get("kind") in ("points", "max-seq") and world(r) > 1:
            share = shard_share(r)
            if share is None or share < RING_SHARE:
                out.append(f"{r['_ref']}: a ring that sent {share} of a shard's K/V")
        wanted = ("fwd_bwd", "multihead") if c.get("training") else ("fwd", None)
        if r.get("mode") != wanted[0] or (wanted[1] and r.get("module") != wanted[1]):
            out.append(f"{r['_ref']}: mode {r.get('mode')}, module {r.get('module')}")
        if c.get("replicas") and r.get("strategy") == "dp" and replicas(r) != c["replicas"]:
            out.append(f"{r['_ref']}: {replicas(r)} replicas where the seed's show {c['replicas']}")
        if c["metric"] == "max_seq_8gb" and (r.get("memory_limit") or 1 << 62) > (c.get("budget_gib") or 8) * GIB:
            out.append(f"{r['_ref']}: searched under {r.get('memory_limit')} bytes, more than the claim's GPU")
    if c["metric"] in SPEEDS:
        multi = [r for r in rows if r.get("strategy") not in ("single", None)]
        value = value_of("speedup", rows, None)
        if multi and value / world(multi[0]) > 1:
            out.append(f"efficiency {value / world(multi[0]):.2f} above 1: an anomaly settled it")
        if verdict in ("confirmed", "direction confirmed, magnitude refuted"):
            singles = [r for r in rows if r.get("strategy") == "single"]
            if not all(r.get("dispatch_share") is not None and r["dispatch_share"] < HOST_SHARE for r in singles):
                out.append("a size judged on a host-bound one-GPU call")
    return out


def audit(c: dict, report: dict, results: list[dict]) -> dict:
    verdict = report["Verdict"]
    refs = (report["Rows"] or "").split()
    out = {"id": c["id"], "verdict": verdict, "wrong": None, "unfair": [], "dodged": None, "checked": ""}
    if not c.get("comparable", True) or (c["metric"] in ABSOLUTE and c.get("over") is None):
        why = "the claims file's note" if not c.get("comparable", True) else "another GPU's absolute speed"
        if verdict != "not comparable":
            out["unfair"].append(f"{verdict} where the rule says not comparable ({why})")
        out["checked"] = f"not comparable: {why}"
        return out
    if not refs:
        found = qualifying(c, results)
        if found and verdict == "not measured yet":
            out["dodged"] = f"rows on the claim's terms exist: {' '.join(found[:4])}"
        out["checked"] = f"{verdict}; no row on its terms in the results" if not found else "rows exist"
        return out
    rows = [{**read_line(ref), "_ref": ref} for ref in dict.fromkeys(refs)]
    top, bottom = sides(c, rows)
    if not top or (c.get("over") is not None and not bottom):
        out["unfair"].append("the cited rows are not the claim's workload (in its seed's dtype)")
        out["checked"] = f"{len(rows)} cited row(s), none of them the claim's"
        return out
    value = value_of(c["metric"], top, None)
    if bottom:
        value /= value_of(c["metric"], bottom, None)
    measured = float(report["Measured Value"])
    if abs(value - measured) > 0.005 * abs(measured) + 1e-12:
        out["wrong"] = f"the cited rows give {value:.6g}, the report {measured:.6g}"
    low, high = interval(report["Measured"], value)
    speed_ratio = c["metric"] in SPEEDS or (c.get("over") is not None and c["metric"] in ABSOLUTE)
    singles = [r for r in rows if (r.get("strategy") == "single" if c["metric"] in SPEEDS else world(r) == 1)]
    hosts = [r.get("dispatch_share") for r in singles]
    compute_bound = not speed_ratio or (bool(hosts) and all(h is not None and h < HOST_SHARE for h in hosts))
    floor = floor_of(c["metric"], top[0]) if c["metric"] in BYTES else None
    bound = c["metric"] in ("max_seq", "max_seq_8gb") and search_bound(c, top, results)
    expected = judge(c, value, low, high, bound, compute_bound, floor)
    if c["metric"] in SPEEDS and anomalous(c, rows, low, high):
        expected = "inconclusive"  # a case the speedup tables flag settles nothing
    if expected != verdict:
        out["unfair"].append(f"the rule gives {expected}, the report {verdict}")
    if verdict != "inconclusive":
        out["unfair"] += off_terms(c, rows, verdict)
    out["checked"] = f"{value:.4g} from {len(rows)} row(s); the rule gives {expected}"
    return out


def anomalous(c: dict, rows: list[dict], low: float, high: float) -> bool:
    """The speedup tables' anomaly: an efficiency above 1, or a speedup interval that includes 1."""
    multi = next(r for r in rows if r.get("strategy") != "single")
    speedup = value_of("speedup", rows, None)
    per = world(multi) if c["metric"] == "efficiency" else 1
    return speedup / world(multi) > 1 or low * per <= 1 <= high * per and low != high


def qualifying(c: dict, results: list[dict]) -> list[str]:
    """Rows on the claim's terms for each side it needs: the refs of one side's rows (empty where a
    side has none)."""
    on = {"device": "cuda", **({"mode": "fwd_bwd", "module": "multihead"} if c.get("training") else {"mode": "fwd"})}
    found = []
    for match in [c["match"]] + ([c["over"]] if c.get("over") else []):
        for m in (match, {**match, **(c.get("stand_in") or {})}):
            rows = [r for r in results if r.get("status") == "ok" and agrees(r, {**on, **m}) and fits(c, r, results)]
            if rows:
                found.append(rows[0]["_ref"])
                break
        else:
            return []
    return found


def fits(c: dict, r: dict, results: list[dict]) -> bool:
    """A row the claim's metric can read on the seed's terms."""
    if r.get("kind") in ("points", "max-seq") and world(r) > 1:
        share = shard_share(r)
        if share is None or share < RING_SHARE:
            return False
    if c.get("replicas") and r.get("strategy") == "dp" and replicas(r) != c["replicas"]:
        return False
    if c["metric"] in ("max_seq", "max_seq_8gb"):
        limit = r.get("memory_limit")
        return r.get("kind") == "max-seq" and (
            c["metric"] == "max_seq" or (limit and limit <= (c.get("budget_gib") or 8) * GIB)
        )
    if c["metric"] in SPEEDS:
        if r.get("kind") != "speedup" or r.get("strategy") == "single":
            return False
        single = [x for x in results if x.get("kind") == "speedup" and x.get("strategy") == "single"
                  and x.get("run") == r.get("run") and x.get("case") == r.get("case") and x.get("impl") == r.get("impl")]  # fmt: skip
        if not single:
            return False
        return bool(c.get("direction")) or (single[-1].get("dispatch_share") or 1) < HOST_SHARE
    if r.get("kind") == "max-seq-result":
        return False
    try:
        return value_of(c["metric"], [r], None) is not None
    except (KeyError, TypeError, ValueError, StopIteration):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a report directory (attnbench report RESULTS --out DIR)")
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    table = args.report / "csv" / "seed-claims.csv"
    if not table.exists():
        print(f"no {table}: generate the report first (attnbench report results --out {args.report})", file=sys.stderr)
        return 2
    report = {r["Id"]: r for r in csv.DictReader(table.open())}
    claims = {c["id"]: c for c in load_claims(CLAIMS)}
    drawn = random.Random(args.seed).sample(sorted(claims), args.n)
    results = all_rows(args.results)
    found = [audit(claims[cid], report[cid], results) for cid in drawn]
    for f in found:
        marks = [m for m in (f["wrong"] and f"WRONG: {f['wrong']}", f["dodged"] and f"DODGED: {f['dodged']}") if m]
        marks += [f"UNFAIR: {u}" for u in f["unfair"]]
        print(f"{f['id']:34} {f['verdict']:42} {f['checked']}" + "".join(f"\n    {m}" for m in marks))
    numbers = sum(1 for f in found if "from" in f["checked"])
    wrong = sum(1 for f in found if f["wrong"])
    unfair = sum(1 for f in found if f["unfair"])
    dodged = sum(1 for f in found if f["dodged"])
    print(
        f"\n{len(found)} claims drawn (seed {args.seed}): {numbers} measured values recomputed from their rows, "
        f"{wrong} wrong; {unfair} unfair; {dodged} dodged."
    )
    return 1 if wrong or unfair or dodged else 0


if __name__ == "__main__":
    raise SystemExit(main())
