"""Outside implementations: import paths, entry points, the contract, flex, the example plugin.

The example package (examples/attnbench-sliding-window) is pip-installed into a temporary
directory put on PYTHONPATH, as a user's plugin would be installed into their environment.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.masks import bounds
from attnbench.masks import mask_mod as masks
from attnbench.trials.contract import violations
from attnbench.trials.reference import VerifyCase, run_case

from conftest import ROOT, run_cli

EXAMPLE = ROOT / "examples" / "attnbench-sliding-window"
TINY = ["--device", "cpu", "--dtype", "fp32", "--heads", 2, "--head-dim", 8]


def sliding_pairs(n: int, w: int, heads: int, causal: bool) -> int:
    """Hand count: a query at t keeps [t-w, t+w] (causal [t-w, t]) clipped to [0, n)."""
    return heads * sum(min(t if causal else t + w, n - 1) - max(t - w, 0) + 1 for t in range(n))


# --- pair counts from a mask_mod -------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_mask_mod_pairs_exact_and_by_blocks_equal_the_hand_count(causal):
    def window(b, h, q, kv):
        return (q - kv).abs() <= 40

    mod = masks.with_causal(window) if causal else window
    n = 300  # not a multiple of the 128-token block: the last tiles are short
    expected = sliding_pairs(n, 40, 3, causal)
    assert masks.count_exact(mod, n, 3) == expected
    assert bounds.count_blocks(mod, n, 3) == expected


def test_head_dependent_mask_counts_each_head():
    def mod(b, h, q, kv):
        return (q - kv).abs() <= 10 * (h + 1)

    expected = sum(sliding_pairs(200, 10 * (h + 1), 1, False) for h in range(3))
    assert masks.count_exact(mod, 200, 3) == bounds.count_blocks(mod, 200, 3) == expected
    assert int(masks.key_mask(mod, 200, 3).sum()) == expected


# --- an outside implementation by import path -------------------------------------------------

USER_MODULE = """
import torch
import torch.nn.functional as F


class Window(torch.nn.Module):
    def __init__(self, window, causal_ok=True, shape_ok=True, declared_extra=0, noise=0.0):
        super().__init__()
        self.window, self.causal_ok, self.shape_ok = window, causal_ok, shape_ok
        self.declared_extra, self.noise = declared_extra, noise

    def mask_mod(self, b, h, q, kv):
        return (q - kv).abs() <= self.window + self.declared_extra

    def forward(self, q, k, v, is_causal=False):
        n = q.shape[1]
        i = torch.arange(n, device=q.device)
        keep = (i[:, None] - i[None, :]).abs() <= self.window
        if is_causal and self.causal_ok:
            keep &= i[None, :] <= i[:, None]
        out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=keep)
        out = out + self.noise * torch.randn_like(out)
        return out.transpose(1, 2) if self.shape_ok else out


def good(window: int = 16):
    "a sliding window"
    return Window(window)


def ignores_causal():
    return Window(16, causal_ok=False)


def wrong_shape():
    return Window(16, shape_ok=False)


def declares_wrong_mask():
    return Window(16, declared_extra=8)


def noisy():
    return Window(16, noise=1e-2)


def raises():
    raise RuntimeError("no GPU kernel for this")


def not_a_module():
    return 42


NOT_CALLABLE = 3


def not_a_mask_mod(x):
    return 7


class EagerFlex(torch.nn.Module):
    "FlexAttention called as is: on the CPU torch warns at every call that it is not compiled"

    def forward(self, q, k, v, is_causal=False):
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)


def eager_flex():
    return EagerFlex()
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "userattn.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{tmp_path}")
    sys.modules.pop("userattn", None)
    yield tmp_path
    sys.modules.pop("userattn", None)


def test_import_path_builds_with_params_from_the_signature(user_module):
    entry = impls.spec("userattn:good")
    assert [(p.name, p.default, p.kind) for p in entry.params] == [("window", 16, "int")]
    assert entry.source["import_path"] == "userattn:good"
    impl = impls.build("userattn:good", window="5")  # --param text coerced to the default's type
    assert impl.config() == {"window": 5}
    assert impl.useful_pairs(64, 2, causal=True) == sliding_pairs(64, 5, 2, True)
    assert impl.pairs_counted == "blocks"


def test_a_contract_keeping_module_has_no_violations(user_module):
    assert violations("userattn:good", {}, "cpu", "fp32") == []


@pytest.mark.parametrize(
    "factory, expected",
    [
        ("ignores_causal", "is_causal=True is ignored"),
        ("wrong_shape", "is not the input's (B, N, H, D)"),
        ("declares_wrong_mask", "disagrees with the declared key sets (mask_mod)"),
        ("noisy", "not deterministic"),
    ],
)
def test_each_violation_is_reported(user_module, factory, expected):
    found = violations(f"userattn:{factory}", {}, "cpu", "fp32")
    assert any(expected in line for line in found), found
    assert all("\n" not in line for line in found)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("nosuchmodule:factory", "does not import"),
        ("userattn:missing", "has no attribute 'missing'"),
        ("userattn:NOT_CALLABLE", "not a factory"),
        ("userattn:raises", "raised RuntimeError: no GPU kernel"),
        ("userattn:not_a_module", "not a torch.nn.Module"),
    ],
)
@pytest.mark.slow
def test_bad_outside_implementation_is_one_line_exit_2_nothing_written(user_module, tmp_path, name, expected):
    out = tmp_path / "run"
    r = run_cli("max-seq", "--impl", name, *TINY, "--out", out, env={"PYTHONPATH": os.environ["PYTHONPATH"]})
    assert r.returncode == 2, r.stderr
    assert expected in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()


def test_flex_mask_that_is_not_callable_is_a_config_error(user_module):
    with pytest.raises(AttnbenchError, match="not a mask_mod"):
        impls.build("flex", mask="userattn:not_a_mask_mod", mask_args="x=1")
    with pytest.raises(AttnbenchError, match="not callable"):
        impls.build("flex", mask="userattn:NOT_CALLABLE")


# --- flex ----------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_flex_matches_the_float64_reference_with_a_head_dependent_mask(user_module, causal):
    (user_module / "headmask.py").write_text("def per_head(b, h, q, kv):\n    return (q - kv).abs() <= 8 + 24 * h\n")
    config = impls.normalize_config("flex", {"mask": "headmask:per_head"})
    row = run_case(VerifyCase("flex", config, 1, 256, 3, 16, causal, "fp32", "cpu"), seed=1)
    assert row.status == "pass", row
    impl = impls.build("flex", **config)
    assert impl.per_head
    assert impl.useful_pairs(256, 3, causal) == sum(sliding_pairs(256, 8 + 24 * h, 1, causal) for h in range(3))


# --- the example plugin, installed -----------------------------------------------------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target, source = tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("src") / "plugin"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))  # builds leave files
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return {"PYTHONPATH": f"{ROOT}{os.pathsep}{target}"}


@pytest.mark.slow
def test_installed_plugin_is_listed_and_verifies(installed):
    r = run_cli("list", env=installed)
    assert r.returncode == 0, r.stderr
    assert "sliding-window " in r.stdout and "package attnbench-sliding-window 0.1.0" in r.stdout
    r = run_cli(
        "verify",
        "--impl",
        "sliding-window",
        "--impl",
        "sliding-window-naive",
        "--param",
        "window=20",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--full",
        env=installed,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "12 of 12 cases pass" in r.stdout and "contract violated" not in r.stdout


@pytest.mark.slow
def test_plugin_through_a_profile_then_a_report_that_imports_nothing(installed, tmp_path):
    profile = tmp_path / "plugin.toml"
    profile.write_text(
        textwrap.dedent("""
        device = "cpu"
        dtype = "fp32"
        heads = 2
        head_dim = 8
        max_trial_seconds = 5
        target_ms = 1
        min_samples = 1
        start = 128
        max_seq_len = 256

        [[sweep]]
        impl = "sliding-window"
        window = 16

        [[sweep]]
        impl = "attnbench_sliding_window:sliding_window_naive"
        window = 16

        [[sweep]]
        impl = "flex"
        mask = "attnbench_sliding_window:sliding_window_mask"
        mask_args = "window_size=16"
    """)
    )
    out = tmp_path / "run"
    r = run_cli("run", "--profile", profile, "--out", out, env=installed)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    trials = [r for r in rows if r.get("kind") == "max-seq" and r.get("status") == "ok"]
    by_impl = {r["impl"]: r for r in trials if r["seq_len"] == 256}
    assert set(by_impl) == {"sliding-window", "attnbench_sliding_window:sliding_window_naive", "flex"}
    for impl, row in by_impl.items():  # the same key sets, counted three ways
        assert row["flops_useful"] == 4.0 * 8 * sliding_pairs(256, 16, 2, False), impl
    plugin = by_impl["sliding-window"]
    source = plugin["impl_source"]
    assert {k: v for k, v in source.items() if k != "source_sha256"} == {
        "import_path": "attnbench_sliding_window:sliding_window",
        "package": "attnbench-sliding-window",
        "version": "0.1.0",
        "memory_order": 1,
    }
    assert len(source["source_sha256"]) == 16 and plugin["verified"] is True
    assert plugin["pairs_counted"] == "blocks"  # from its mask_mod, after the measurement
    assert by_impl["attnbench_sliding_window:sliding_window_naive"]["pairs_counted"] == "declared"
    assert by_impl["attnbench_sliding_window:sliding_window_naive"]["impl_source"]["memory_order"] == 2
    # the report reads the rows only: it runs without the plugin importable
    r = run_cli("report", out, env={"PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sliding-window" in (out / "report" / "report.md").read_text()


def test_an_outside_module_calling_flex_on_the_cpu_runs_without_a_warning_per_call(user_module):
    """The warning torch gives for FlexAttention without torch.compile (the CPU's only path)
    would fill the console of every trial and check: attnbench silences it for outside modules
    as for its own flex."""
    import warnings

    import torch

    impl = impls.build("userattn:eager_flex")
    q = torch.randn(1, 128, 2, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = impl(q, q, q)
    assert out.shape == q.shape
    assert not [w for w in caught if "flex_attention" in str(w.message)]
