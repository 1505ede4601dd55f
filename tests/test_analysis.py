"""One answer to one question: the report, the regression check and the command line's readout
of a results directory give a max-seq search the same longest length and first failure
(``attnbench.analysis.search_outcome``), finished or interrupted, a failed confirmation included."""

import json

import pytest

from attnbench.analysis import search_outcome
from attnbench.check.identity import short_tokens
from attnbench.check.loading import load_side
from attnbench.report.tables.sweep import max_seq_summary
from attnbench.results import load_rows
from attnbench.results.convert import to_json

from conftest import run_cli, typed_row

ENV = {"cpu": "test-cpu", "machine": "cpu: test-cpu"}


def search(*steps, result=None):
    """A search's trials (length, phase, status) and, when it finished, its result row."""
    rows = [
        typed_row(kind="max-seq", seq_len=n, phase=phase, status=status, device="cpu", env=ENV, peak_bytes=n)
        for n, phase, status in steps
    ]
    if result is not None:
        best, failure = result
        rows.append(
            typed_row(
                kind="max-seq-result",
                seq_len=best,
                first_failure=failure,
                stop_status="oom",
                stopped_by="memory",
                device="cpu",
                env=ENV,
            )
        )
    return rows


# a length that ran once and failed its fresh-process confirmation: the answer is below it
CONFIRMATION_FAILED = [
    (1024, "grow", "ok"),
    (2048, "predict", "ok"),
    (4096, "bracket", "oom"),
    (2048, "confirm", "oom"),
]


@pytest.mark.parametrize(
    "steps, result, answer, failure",
    [
        (CONFIRMATION_FAILED, (1024, 2048), 1024, 2048),
        (CONFIRMATION_FAILED, None, 1024, 2048),  # interrupted before its result row
        ([(1024, "grow", "ok"), (2048, "grow", "ok"), (4096, "grow", "oom"), (3072, "bisect", "ok")], None, 3072, 4096),
        ([(1024, "grow", "oom")], (None, 1024), 0, 1024),
    ],
)
def test_report_check_and_readout_give_a_search_one_answer(tmp_path, steps, result, answer, failure):
    rows = search(*steps, result=result)
    with open(tmp_path / "trials.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"seq_len": None, **to_json(r)}) + "\n")  # a field the writer keeps as null
    loaded, problems = load_rows(tmp_path)
    assert problems == []

    (report,) = max_seq_summary(loaded)
    side, _ = load_side(tmp_path, "current")
    (check,) = side.capacity.values()
    assert (report.max_seq_len, report.first_failure) == (answer, failure)
    assert (check.max_seq_len, check.first_failure) == (answer, failure)
    assert report.complete == check.complete == (result is not None)
    assert report.stopped_by == check.stopped_by

    # the check of a directory against itself, as a user runs it, states that same answer
    done = run_cli("check", "--baseline", str(tmp_path), "--current", str(tmp_path), "--format", "json")
    (capacity,) = [f for f in json.loads(done.stdout)["findings"] if f["aspect"] == "capacity"]
    if result is not None:
        assert capacity["numbers"] == {"baseline_max_seq": answer, "current_max_seq": answer}
    else:  # a lower bound, said so and not gated
        assert capacity["verdict"] == "not gated" and capacity["current"] == f"{short_tokens(answer)} (unfinished)"


def test_a_length_that_ran_and_failed_is_named_unstable():
    trials = search(*CONFIRMATION_FAILED)
    found = search_outcome(trials, None)
    assert found.unstable == (2048,) and found.best_row.seq_len == 1024


def test_the_search_that_answers_is_on_the_whole_device_then_the_newest():
    """Several searches of one configuration: the answer and the GPU curve read the same one
    (``analysis.answering``): the whole device before a limit (or the limit asked for), then
    the newest run, then the series."""
    from attnbench.analysis.search import answering

    def first_trial(date, limit=None, series="s"):
        env = {**ENV, "date": date}
        return typed_row(kind="max-seq", seq_len=1024, device="cpu", env=env, memory_limit=limit, series=series)

    older_whole = first_trial("2026-01-01")
    newer_whole = first_trial("2026-02-01")
    newest_limited = first_trial("2026-03-01", limit=8 << 30)

    def pick(*heads, limit=None):
        return answering(list(heads), lambda head: head, limit)

    assert pick(older_whole, newest_limited, newer_whole) is newer_whole
    assert pick(older_whole, newest_limited, newer_whole, limit=8 << 30) is newest_limited
    assert pick(newest_limited) is newest_limited  # a limit is an answer where nothing else ran
    assert pick(first_trial("2026-02-01", series="a"), tie := first_trial("2026-02-01", series="b")) is tie
    assert pick() is None


def test_every_grouping_of_rows_derives_from_the_one_workload_identity():
    """The answer table's configuration, the check's search and trial, the multi-GPU tables'
    settings and a figure's line each group rows by the workload's identity less what the
    grouping spans, plus what else must match: rows that differ only there share the key, and
    rows that differ in any other workload field do not."""
    from attnbench.check.identity import capacity_identity
    from attnbench.report.answer import configuration_key
    from attnbench.report.data import settings_key

    base = typed_row(kind="max-seq", seq_len=4096, mode="fwd", memory_limit=1 << 30, max_trial_seconds=60)
    other_len = typed_row(kind="max-seq", seq_len=8192, mode="fwd", memory_limit=1 << 30, max_trial_seconds=60)
    other_mode = typed_row(kind="max-seq", seq_len=4096, mode="fwd_bwd", memory_limit=1 << 30, max_trial_seconds=60)
    other_limit = typed_row(kind="max-seq", seq_len=4096, mode="fwd", memory_limit=1 << 29, max_trial_seconds=60)
    other_impl = typed_row(kind="max-seq", seq_len=4096, mode="fwd", impl="sdpa", memory_limit=1 << 30)
    other_heads = typed_row(kind="max-seq", seq_len=4096, mode="fwd", heads=4, memory_limit=1 << 30)

    assert configuration_key(base) == configuration_key(other_len) == configuration_key(other_mode)
    assert configuration_key(base) != configuration_key(other_impl)
    assert capacity_identity(base) == capacity_identity(other_len)
    assert capacity_identity(base) != capacity_identity(other_limit)  # a search under another limit
    assert capacity_identity(base) != capacity_identity(other_mode)
    assert settings_key(base) == settings_key(other_impl) == settings_key(other_len)  # compared across impls
    assert settings_key(base) != settings_key(other_heads)
    assert base.identity_key() != other_len.identity_key()
    assert (
        base.identity_key(seq_len=False)
        == other_len.identity_key(seq_len=False)
        == other_limit.identity_key(seq_len=False)
    )
    # the key is the identity itself, as canonical JSON: a reader can take it apart again
    assert json.loads(configuration_key(base)) == {k: v for k, v in base.identity(seq_len=False).items() if k != "mode"}
