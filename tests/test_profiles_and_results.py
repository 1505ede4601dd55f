"""Committed profiles are valid; result files are read robustly."""

import json
from pathlib import Path

import pytest

from attnbench.plan import PROFILE_DIR, build_plan
from attnbench.results import ResultsWriter, read_rows

PROFILES = sorted(PROFILE_DIR.glob("*.toml"))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_committed_profile_builds(path):
    plan = build_plan(path.stem, [], {}, {}, str(path))
    assert plan.series or plan.speedups
    for s in plan.series:
        impl_granularity = s.granularity()
        assert s.start() % impl_granularity == 0
        for n in s.settings.points.seq_lens:
            # the runner's rule; a search's granularity is stricter (ring-dilated's segments may span shards)
            s.build().check_shape(n, s.settings.heads)


def test_every_profile_setting_is_in_the_profiles_doc():
    """docs/reference/profiles.md is where the README sends a profile's author: each setting a profile
    accepts is named there."""
    import re

    from attnbench.plan import SETTING_PARSERS

    named = set(re.findall(r"`([a-z_0-9]+)`", (PROFILE_DIR.parent / "docs" / "reference" / "profiles.md").read_text()))
    assert [key for key in SETTING_PARSERS if key not in named] == []


def test_cli_flags_override_the_profile():
    plan = build_plan("x", [], {"dtype": "fp32", "heads": 4}, {}, "default-cpu")
    assert all(s.settings.dtype == "fp32" and s.settings.heads == 4 for s in plan.series)


FIXTURE = Path(__file__).parent / "fixtures" / "results" / "cpu-tiny" / "trials.jsonl"


def a_verify_row(seed: int) -> dict:
    row = next(json.loads(line) for line in FIXTURE.read_text().splitlines() if '"kind": "verify"' in line)
    return {k: v for k, v in row.items() if k != "schema"} | {"seed": seed}


def test_corrupt_lines_are_reported_with_file_and_line_and_the_rest_used(tmp_path):
    writer = ResultsWriter(tmp_path)
    writer.append(a_verify_row(1))
    with open(writer.path, "a") as f:
        f.write('{"kind": "verify", "n": 2\n')  # truncated by a kill
        f.write("[1, 2]\n")
    writer.append(a_verify_row(3))
    rows, problems = read_rows(tmp_path)
    assert [r["seed"] for r in rows] == [1, 3]
    assert len(problems) == 2 and f"{writer.path}:2:" in problems[0] and f"{writer.path}:3:" in problems[1]


def test_rows_never_hold_nan(tmp_path):
    writer = ResultsWriter(tmp_path)
    with pytest.raises(ValueError):
        writer.append(a_verify_row(1) | {"rel_err": float("nan")})


def test_attnbench_commit_names_the_commit_over_a_stale_checkout(monkeypatch):
    from attnbench.results import environment

    monkeypatch.setenv("ATTNBENCH_COMMIT", "0123abc")
    assert environment.source_commit() == "0123abc"
    monkeypatch.delenv("ATTNBENCH_COMMIT")
    assert environment.source_commit() != "0123abc"


def test_the_keys_a_row_stores_are_its_workload_identity():
    """A row's ``series`` and a speedup row's ``key``, worked out again from the row's own
    fields through the one identity rule, are what the runner stored when it wrote the row
    (rows of the gate's and the check's fixtures, and every committed speedup run); and a
    key ignores what the identity ignores (a model preset's key-value heads equal to its
    heads, an unset world size)."""
    from dataclasses import replace

    from attnbench.results import load_rows, series_key
    from attnbench.results.schema import Speedup, Trial
    from attnbench.sweeps.kinds.speedup.runner import trial_key

    ROOT = Path(__file__).resolve().parent.parent
    fields = ("impl", "config", "batch", "seq_len", "heads", "head_dim", "dtype", "device", "mode", "causal")

    def series_of(r):
        workload = {k: getattr(r, k) for k in fields}
        workload.update({k: getattr(r, k) for k in ("kv_heads", "model") if getattr(r, k) is not None})
        return series_key(workload, r.world_size or 1, r.strategy or "single", r.sweep or r.kind)

    trials, _ = load_rows([ROOT / "tests/fixtures/cpu-gate", ROOT / "tests/fixtures/check"])
    trials = [r for r in trials if isinstance(r, Trial)]
    assert len(trials) > 50 and all(series_of(r) == r.series for r in trials)
    runs, _ = load_rows(ROOT / "results")
    speedups = [r for r in runs if isinstance(r, Speedup)]
    assert len(speedups) > 100 and all(trial_key(vars(r)) == r.key for r in speedups)
    one = speedups[0]
    assert trial_key(vars(replace(one, kv_heads=one.heads))) == one.key
    assert trial_key(vars(replace(one, kv_heads=1))) != one.key
    assert series_of(replace(trials[0], world_size=None)) == series_of(replace(trials[0], world_size=1))
