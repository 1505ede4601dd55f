import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args, cwd=None, timeout=600, env=None) -> subprocess.CompletedProcess:
    """Run `python -m attnbench ARGS` as a user would, in a fresh process."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "attnbench", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


@pytest.fixture
def cli():
    return run_cli
