"""A plain install works where torch does: nothing accelerator-only is imported until used, a
Triton kernel asked for without Triton is one line naming the fix, and the version is written
in one place. (`make install-check` installs the package in a fresh environment and runs it.)"""

import subprocess
import sys
import tomllib

import attnbench

from conftest import ROOT

WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # `import triton` now fails, as where it is not installed
import torch
from attnbench import impls
from attnbench.errors import ConfigError

names = impls.names()
q = torch.randn(1, 1024, 2, 16)
for name in ("naive", "sdpa", "dilated", "block-sparse"):
    config = {"segment_lengths": [512], "dilation_rates": [1]} if name == "dilated" else {}
    assert impls.build(name, **config)(q, q, q).shape == q.shape, name
try:
    impls.build("block-sparse", kernel="triton")
except ConfigError as exc:
    print(exc)
print(",".join(names))
"""


def test_every_implementation_loads_and_the_default_kernels_run_without_triton():
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    refusal, names = proc.stdout.strip().splitlines()
    assert "kernel=triton needs Triton" in refusal and "pip install triton" in refusal
    assert {"naive", "sdpa", "dilated", "block-sparse", "flex", "ring"} <= set(names.split(","))


def test_the_version_is_written_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "attnbench.__version__"}
    assert attnbench.__version__
