"""Keep a GPU busy from a second process, to rehearse `attnbench check` finding a slowdown.

    python scripts/load_gpu.py [--seconds S] [--size N]

Back-to-back bf16 matrix products (N x N, 8192 by default) on the current CUDA device until
S seconds pass or the process is stopped: the GPU's time is shared with whatever else runs on
it, so a benchmark measured meanwhile is slower by an amount the gate must notice.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float("inf"), help="stop after this long (default: never)")
    parser.add_argument("--size", type=int, default=8192, help="matrix side (default 8192)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: load_gpu.py needs a CUDA GPU")
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        for _ in range(20):  # a few hundred ms of work between clock reads
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
