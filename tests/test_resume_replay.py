"""`attnbench CMD --resume --out DIR` alone continues the command DIR's rows recorded."""

import json
from pathlib import Path

import pytest

from attnbench.cli.resume import recorded_argv, replayed_argv
from attnbench.errors import AttnbenchError

from conftest import ROOT, run_cli

# a reference-check row as `attnbench verify --out` writes it; each test gives it its own env
VERIFY_ROW = {
    "schema": 1,
    "kind": "verify",
    "impl": "naive",
    "config": {},
    "batch": 1,
    "seq_len": 128,
    "heads": 2,
    "head_dim": 16,
    "causal": False,
    "dtype": "fp32",
    "device": "cpu",
    "world_size": 1,
    "seed": 0,
    "tolerance": 1e-4,
    "status": "pass",
    "rel_err": 1e-7,
    "message": "",
    "run": "r",
}


# the environment of a committed run (machine, versions), its command replaced per test
RECORDED_ENV = json.loads((ROOT / "results" / "ci-baseline" / "trials.jsonl").read_text().splitlines()[0])["env"]


def rows_file(out: Path, command: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in RECORDED_ENV.items() if k not in ("argv", "command")}
    (out / "trials.jsonl").write_text(json.dumps({**VERIFY_ROW, "env": {**env, **command}}) + "\n")
    return out


def test_only_resume_and_out_replay_the_recorded_command_with_this_out(tmp_path):
    out = rows_file(tmp_path / "r", {"argv": ["bench", "--impl", "naive", "--seq-lens", "1K", "--out", "elsewhere"]})
    assert replayed_argv(["bench", "--resume", "--out", str(out)]) == [
        "bench",
        "--impl",
        "naive",
        "--seq-lens",
        "1K",
        "--out",
        str(out),
        "--resume",
    ]
    assert replayed_argv(["bench", f"--out={out}", "--resume"])[:5] == ["bench", "--impl", "naive", "--seq-lens", "1K"]


def test_a_command_typed_in_full_or_without_resume_is_taken_as_typed(tmp_path):
    out = rows_file(tmp_path / "r", {"argv": ["bench", "--impl", "naive", "--seq-lens", "1K"]})
    typed = ["bench", "--impl", "sdpa", "--seq-lens", "2K", "--resume", "--out", str(out)]
    assert replayed_argv(typed) == typed
    assert replayed_argv(["bench", "--out", str(out)]) == ["bench", "--out", str(out)]
    assert replayed_argv(["report", "--resume", "--out", str(out)]) == ["report", "--resume", "--out", str(out)]


def test_resume_and_out_alone_where_nothing_was_recorded_is_refused(tmp_path):
    """A mistyped or empty DIR: one error, not a whole new run started under --resume."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (empty, tmp_path / "not-there"):
        with pytest.raises(AttnbenchError, match=r"nothing to resume in .*start a new run"):
            replayed_argv(["run", "--resume", "--out", str(out)])
    assert not (tmp_path / "not-there").exists()


def test_rows_without_argv_replay_their_command_line(tmp_path):
    # the program's path first (python -m attnbench: its __main__.py), quoted arguments kept whole
    out = rows_file(tmp_path / "r", {"command": "/x/attnbench/__main__.py run --profile 'my profile.toml'"})
    assert recorded_argv(out) == ["run", "--profile", "my profile.toml"]


def test_another_command_s_rows_are_refused_with_the_command_to_type(tmp_path):
    out = rows_file(tmp_path / "r", {"argv": ["bench", "--impl", "naive", "--seq-lens", "1K"]})
    with pytest.raises(AttnbenchError, match=r"attnbench bench --resume --out"):
        replayed_argv(["max-seq", "--resume", "--out", str(out)])


PROFILE = """device = "cpu"
dtype = "fp32"
heads = 2
head_dim = 16
kind = "points"
isolate = false
min_samples = 1
max_samples = 1
target_ms = 0

[[sweep]]
impl = "naive"
seq_lens = ["128", "256", "384"]
"""


@pytest.mark.slow
@pytest.mark.parametrize("command", ["bench", "run"])
def test_an_interrupted_bench_or_profile_run_resumes_from_resume_and_out_alone(command, tmp_path):
    out = tmp_path / "run"
    if command == "run":
        profile = tmp_path / "small.toml"
        profile.write_text(PROFILE)
        args = ["run", "--profile", profile]
    else:
        args = ["bench", "--impl", "naive", "--seq-lens", "128,256,384", "--device", "cpu", "--dtype", "fp32"]
        args += ["--heads", 2, "--head-dim", 16, "--in-process"]
    full = run_cli(*args, "--out", out)
    assert full.returncode == 0, full.stderr
    lines = (out / "trials.jsonl").read_text().splitlines()
    points = [json.loads(line)["seq_len"] for line in lines if json.loads(line)["kind"] == "points"]
    assert points == [128, 256, 384]
    # as if interrupted after its first trial: the reference check and one point kept
    (out / "trials.jsonl").write_text("\n".join(lines[:2]) + "\n")
    resumed = run_cli(command, "--resume", "--out", out)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming: attnbench {command}" in resumed.stderr
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert [r["seq_len"] for r in rows if r["kind"] == "points"] == [128, 256, 384]
    assert rows[:2] == [json.loads(line) for line in lines[:2]]
