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
        for n in s.settings.seq_lens:
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
