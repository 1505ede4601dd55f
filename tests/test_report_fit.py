"""The capacity fit on synthetic points whose law is known, and the GPU memory budget rule."""

from __future__ import annotations

import math

import pytest

from attnbench.measure.capacity import fit_memory, measured_budget, memory_degree

from conftest import typed_row

GIB = 2**30


def test_linear_fit_recovers_a_known_slope_and_solves_for_the_budget():
    # 4 KiB per token on top of 1 MB: the memory of four (B=1, H=8, D=64) bf16 tensors per token
    lengths = [65536 * 2**k for k in range(6)]
    fit = fit_memory(lengths, [1e6 + 4096 * n for n in lengths], 1)
    assert fit.coef[0] == pytest.approx(1e6, rel=1e-6) and fit.coef[1] == pytest.approx(4096, rel=1e-9)
    assert fit.max_error < 1e-9
    assert fit.max_seq(80 * GIB) == pytest.approx((80 * GIB - 1e6) / 4096, rel=1e-9)


def test_quadratic_fit_recovers_n_squared_memory():
    # naive attention: scores and probabilities, 2 * H * N^2 bf16 values (H = 8: 32 bytes per pair)
    lengths = [4096, 8192, 12288, 16384, 24576]
    fit = fit_memory(lengths, [5e5 + 100 * n + 32 * n * n for n in lengths], 2)
    assert fit.coef[2] == pytest.approx(32, rel=1e-6)
    n = fit.max_seq(80 * GIB)
    assert n == pytest.approx((-100 + math.sqrt(100**2 - 4 * 32 * (5e5 - 80 * GIB))) / 64, rel=1e-9)


def test_points_on_the_law_give_its_exact_coefficients_and_no_error():
    """The fit is exact arithmetic: integer peaks on an integer law come back as those
    integers, with an error of exactly zero, on any machine (a floating-point solver leaves
    residues of 1e-16 that differ between BLAS builds and so between regenerated reports)."""
    lengths = [1024, 2048, 4096, 8192, 12288]
    linear = fit_memory(lengths, [1_000_003 + 4096 * n for n in lengths], 1)
    assert linear.coef == (1_000_003.0, 4096.0) and linear.max_error == 0.0
    quadratic = fit_memory(lengths, [7 + 100 * n + 32 * n * n for n in lengths], 2)
    assert quadratic.coef == (7.0, 100.0, 32.0) and quadratic.max_error == 0.0
    assert quadratic.max_seq(7 + 100 * 5000 + 32 * 5000**2) == 5000.0  # the closed-form root, exactly


def test_fit_error_is_reported_on_the_measured_points():
    lengths = [1000, 2000, 3000, 4000]
    noise = [0.02, -0.01, 0.0, 0.01]
    fit = fit_memory(lengths, [(1e5 + 10 * n) * (1 + e) for n, e in zip(lengths, noise)], 1)
    errors = fit.errors()
    assert len(errors) == 4 and 0.005 < fit.max_error < 0.03
    assert fit.error_at_largest == errors[3]


def test_no_fit_or_no_limit_where_the_points_cannot_say():
    assert fit_memory([4096, 4096], [1e6, 1e6], 1) is None  # one length: no slope
    assert fit_memory([1, 2], [1.0, 4.0], 2) is None  # two lengths: no curvature
    flat = fit_memory([1, 2, 3], [5.0, 5.0, 5.0], 1)
    assert flat.max_seq(100.0) is None  # never grows: no memory limit follows
    grows = fit_memory([1, 2, 3], [10.0, 20.0, 30.0], 1)
    assert grows.max_seq(-1.0) is None  # not even N = 0 fits


def test_memory_model_per_implementation():
    assert memory_degree("naive") == 2 and memory_degree("sdpa", "math") == 2
    assert memory_degree("sdpa", "flash") == 1 and memory_degree("dilated", "sdpa") == 1


def test_gpu_budget_sets_aside_what_nvml_sees_beyond_the_allocator():
    """The rule for CUDA trials (fields as attnbench.trials.trial writes them): device total minus the
    median, over the three longest successful trials, of NVML used at peak minus
    max_memory_reserved on the trial's GPU."""
    total = 80 * GIB
    context = [600e6, 610e6, 590e6, 2e9]  # the shortest trial's reading is not among the three longest

    def trial(n, extra):
        reserved = 1000 * n
        return {
            "device": "cuda",
            "status": "ok",
            "seq_len": n,
            "device_total_bytes": total,
            "memory_limit": None,
            "peak_bytes": 900 * n,
            "max_memory_reserved": reserved,
            "gpus": [
                {
                    "index": 0,
                    "nvml_used_before": 500e6,
                    "nvml_used_peak": reserved + extra,
                    "max_memory_allocated": 900 * n,
                    "max_memory_reserved": reserved,
                },
                {"index": 1, "nvml_used_before": 4e8, "nvml_used_peak": 4e8},
            ],
        }

    rows = [trial(n, e) for n, e in zip([2**23, 2**22, 2**21, 2**20], context)]

    def whole(v):  # byte counts written as 600e6 are integers in a row
        if isinstance(v, dict):
            return {k: whole(x) for k, x in v.items()}
        if isinstance(v, list):
            return [whole(x) for x in v]
        return int(v) if isinstance(v, float) else v

    def typed(rows):
        return [typed_row(**whole(r)) for r in rows]

    device, overhead, budget, note = measured_budget(typed(sorted(rows, key=lambda r: r["seq_len"])))
    assert device == total and overhead == pytest.approx(600e6) and budget == pytest.approx(total - 600e6)
    assert "NVML" in note
    limited = [{**r, "memory_limit": 8 * GIB} for r in rows]
    assert measured_budget(typed(limited))[2] == 8 * GIB
    no_nvml = [{**r, "gpus": []} for r in rows]
    assert measured_budget(typed(no_nvml))[1:3] == (0.0, total)


def test_the_accuracy_target_applies_to_gpu_series_stopped_by_memory_with_four_trials():
    from attnbench.report.fit import Capacity

    lengths = [2**20, 2**21, 2**22, 2**23]
    fit = fit_memory(lengths, [1e6 + 5000 * n for n in lengths], 1)

    def cap(**kw):
        base = dict(
            series="s",
            label="dilated",
            impl="dilated",
            head={},
            world_size=1,
            fit=fit,
            degree=1,
            successful=4,
            successful_lengths=4,
            device="cuda",
            device_total=80 * GIB,
            overhead=GIB,
            budget=79 * GIB,
            budget_note="",
            measured_max=16_000_000,
            stopped_by="memory",
        )
        return Capacity(**{**base, **kw})

    c = cap()
    assert c.predicted == pytest.approx((79 * GIB - 1e6) / 5000)
    assert c.error == pytest.approx(c.predicted / 16_000_000 - 1) and c.target_applies
    assert c.predict_for(141 * GIB) == pytest.approx((140 * GIB - 1e6) / 5000)
    assert not cap(successful=3).target_applies
    assert not cap(device="cpu").target_applies
    time_stopped = cap(stopped_by="time")
    assert time_stopped.error is None and not time_stopped.target_applies
    # the note: a miss says its cause; a prediction far past its fitted lengths, unmeasured, says how far
    from attnbench.report.fit import capacity_note

    assert capacity_note(cap(measured_max=int(c.predicted), longest_ok=2**23)) == ""
    assert capacity_note(cap(measured_max=20_000_000, longest_ok=2**23)).startswith("predicted low")
    assert capacity_note(cap(measured_max=None, stopped_by=None, longest_ok=2**23)) == ""  # 2x past 8M
    far = capacity_note(cap(measured_max=None, stopped_by=None, longest_ok=2**16))
    assert far == f"{c.predicted / 2**16:,.0f}x past the longest length fitted (64K); no search measured it"


def test_a_gpu_trial_is_fitted_by_the_allocators_footprint_a_cpu_trial_by_its_peak():
    """On a GPU an allocation fails when the reserved footprint cannot grow, fragmentation
    included, so the fit models max_memory_reserved; on a CPU there is only peak_bytes."""
    from attnbench.measure.capacity import fitted_peak

    gpu = {"device": "cuda", "peak_bytes": 900, "max_memory_reserved": 1000, "world_size": 1}
    assert fitted_peak(typed_row(**gpu)) == 1000
    assert fitted_peak(typed_row(**{**gpu, "max_memory_reserved": None})) == 900
    assert fitted_peak(typed_row(device="cpu", peak_bytes=700, world_size=1)) == 700


# --- growth faster than linear, read from the peaks ------------------------------------------------

PLUGIN_SOURCE = {"import_path": "mine:attention", "package": None, "version": None, "memory_order": 1}
GPU_ENV = {"machine": "GPU box", "gpus": [{"index": 0, "name": "G", "memory_total_bytes": 80 * GIB}]}


def plugin_rows(peak, lengths):
    """A plugin that declares linear memory (memory_order 1), its peaks ``peak(n)`` on a GPU."""
    return [
        typed_row(
            kind="max-seq",
            impl="mine:attention",
            seq_len=n,
            max_memory_reserved=int(peak(n)),
            peak_bytes=int(peak(n)),
            impl_source=PLUGIN_SOURCE,
            env=GPU_ENV,
        )
        for n in lengths
    ]


def test_a_plugin_whose_memory_grows_as_n_squared_is_fitted_as_a_curve_whatever_it_declares(tmp_path):
    """N x N fp32 scores of 8 heads: 32 bytes per pair on 256 MiB of fixed costs. A line through
    the points would put 80 GiB an order of magnitude too far; the curve's root is the answer."""
    from attnbench.cli.predict import predict_lines
    from attnbench.report.fit import capacities
    from attnbench.units import format_tokens

    def peak(n):
        return 2**28 + 32 * n * n

    rows = plugin_rows(peak, [2048, 4096, 8192, 16384])
    (c,) = capacities(rows)
    assert (c.degree, c.curve_measured) == (2, True)
    expected = math.sqrt((80 * GIB - 2**28) / 32)  # 51,746 tokens
    assert c.predict_for(80 * GIB) == pytest.approx(expected, rel=1e-9)
    line = fit_memory([r.seq_len for r in rows], [peak(r.seq_len) for r in rows], 1)
    assert line.max_seq(80 * GIB) > 2.5 * expected  # what a line through them would have said
    import json

    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    (said,) = predict_lines("mine:attention", "80GiB", tmp_path)
    assert f"about {format_tokens(int(expected))} tokens on 80GiB" in said, said
    assert "quadratic (the peaks grow faster than a line)" in said


@pytest.mark.parametrize(
    ("name", "peak", "lengths"),
    [
        ("a line", lambda n: 2**20 + 4096 * n, [4096, 8192, 16384, 32768]),
        # a CPU process's fixed costs at short lengths, then a line: a jump, not a curve
        ("fixed costs, then a line", lambda n: 14 * 2**20 + 128 * n if n <= 8192 else 2048 * n, [4096, 8192, 16384]),
        ("two lengths", lambda n: 2**28 + 32 * n * n, [2048, 4096]),
    ],
)
def test_a_line_stays_a_line(name, peak, lengths):
    from attnbench.report.fit import capacities

    (c,) = capacities(plugin_rows(peak, lengths))
    assert (c.degree, c.curve_measured) == (1, False), name


def test_a_line_through_two_lengths_is_said_to_be_one(tmp_path):
    import json

    from attnbench.cli.predict import predict_lines

    rows = plugin_rows(lambda n: 2**28 + 32 * n * n, [2048, 4096])
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    lines = predict_lines("mine:attention", "80GiB", tmp_path)
    assert any("a line through 2 lengths: a curve needs 3 to show" in x for x in lines), lines
