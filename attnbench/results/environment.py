"""The environment a result row records (``env``): attnbench's version and commit, the
command, host, Python, CPU, torch with its CUDA, cuDNN and NCCL, the GPUs as NVML reports
them (memory, NVLinks, how each pair is connected) and the NVML and allocator settings;
``machine`` (``machine_key``) is what results are grouped by."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from attnbench import __version__
from attnbench.results.schema import Environment, received
from attnbench.results.write import now_utc

# where attnbench's own code lies: the checkout whose commit a run records
PACKAGE_DIR = Path(__file__).resolve().parent


def git(*args: str, cwd: Path = PACKAGE_DIR) -> str | None:
    """``git ARGS`` in ``cwd`` (attnbench's own checkout): its output, or None where git fails."""
    # --no-optional-locks: `git status` would otherwise refresh the index under .git/index.lock,
    # and a run killed meanwhile (kill -9, a test's deadline) would leave the lock, breaking the
    # user's next git command in their checkout
    try:
        out = subprocess.run(
            ["git", "--no-optional-locks", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_commit() -> str:
    """The attnbench commit the run came from. ATTNBENCH_COMMIT, where set, names it: a
    checkout copied to a GPU machine may travel without its .git, or with a stale one that
    names an older commit than the files it holds."""
    if os.environ.get("ATTNBENCH_COMMIT"):
        return os.environ["ATTNBENCH_COMMIT"]
    commit = git("rev-parse", "HEAD")
    if commit:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return commit + ("-dirty" if dirty else "")
    return "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_memory_bytes(device: str) -> int | None:
    """What one device can hold at most: a GPU's memory (the largest visible, by NVML, no CUDA
    context), the CPU's physical memory; None where it cannot be read."""
    if device == "cuda":
        gpus, _ = gpu_inventory()
        return max((g["memory_total_bytes"] for g in gpus), default=None)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gpu_inventory() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The GPUs this run can use, as NVML reports them (name, memory, links), without creating
    a CUDA context: those ``CUDA_VISIBLE_DEVICES`` names, numbered as CUDA numbers them."""
    try:
        import pynvml

        from attnbench.measure.memory import visible_nvml_indices

        pynvml.nvmlInit()
        visible = visible_nvml_indices(pynvml)
    except Exception as exc:
        return [], {"nvml": f"unavailable ({type(exc).__name__})"}
    gpus = []
    for i, j in enumerate(visible):
        h = pynvml.nvmlDeviceGetHandleByIndex(j)
        name = pynvml.nvmlDeviceGetName(h)
        gpus.append(
            {
                "index": i,
                "nvml_index": j,
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                "nvlinks_active": _active_nvlinks(pynvml, h),
            }
        )
    driver = pynvml.nvmlSystemGetDriverVersion()
    info = {
        "nvml": "ok",
        "driver": driver.decode() if isinstance(driver, bytes) else driver,
        "gpu_links": gpu_links(pynvml, visible),
    }
    try:
        info["cuda_driver"] = pynvml.nvmlSystemGetCudaDriverVersion()
    except Exception:
        pass
    return gpus, info


def _active_nvlinks(pynvml, handle) -> int | None:
    links = 0
    for link in range(18):  # NVML_NVLINK_MAX_LINKS on Hopper
        try:
            links += pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
        except Exception:
            break
    return links


# NVML's name for the closest common ancestor of two GPUs, nearest first
_TOPOLOGY = {
    "INTERNAL": "same board",
    "SINGLE": "one PCIe switch",
    "MULTIPLE": "several PCIe switches",
    "HOSTBRIDGE": "one PCIe host bridge",
    "NODE": "host bridges of one NUMA node",
    "SYSTEM": "across NUMA nodes",
}


def gpu_links(pynvml, visible: list[int]) -> list[dict[str, Any]]:
    """How each pair of the run's GPUs (by CUDA index) is connected, as NVML reports it: the
    PCIe topology level and whether peer-to-peer access over NVLink works."""
    handles = [pynvml.nvmlDeviceGetHandleByIndex(j) for j in visible]
    levels = {getattr(pynvml, f"NVML_TOPOLOGY_{k}", None): v for k, v in _TOPOLOGY.items()}
    links = []
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            link: dict[str, Any] = {"gpus": [i, j]}
            try:
                link["topology"] = levels.get(
                    pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]), "unknown"
                )
            except Exception:
                link["topology"] = "unknown"
            try:
                status = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                link["p2p_nvlink"] = "ok" if status == pynvml.NVML_P2P_STATUS_OK else "not supported"
            except Exception:
                link["p2p_nvlink"] = "unknown"
            links.append(link)
    return links


def capture_env(argv: list[str] | None = None) -> Environment:
    """This machine and this command, as every row of the run records them."""
    import torch

    from attnbench.measure.memory import nvml_settings

    gpus, gpu_info = gpu_inventory()
    env = {
        "attnbench": __version__,
        "commit": source_commit(),
        "date": now_utc(),
        "command": " ".join(argv if argv is not None else sys.argv),
        # the arguments as given, from the command's name on: what `--resume --out DIR` replays
        "argv": list((argv if argv is not None else sys.argv)[1:]),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": _nccl_version(),
        "gpus": gpus,
        **gpu_info,
        # the allocator's settings change peaks and times; NVML settings change clocks
        "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        **(nvml_settings() if gpus else {}),
    }
    env["machine"] = machine_key(env["gpus"], env["cpu"])
    return received(Environment, env, "this machine")


def _nccl_version() -> str | None:
    try:
        import torch

        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:
        return None


def machine_key(gpus: list[dict[str, Any]] | None, cpu: str | None) -> str:
    """What results are grouped by: the GPU model and count, or the CPU model."""
    if gpus:
        names = sorted({g["name"] for g in gpus})
        return f"{' + '.join(names)} x{len(gpus)}"
    return f"cpu: {cpu or 'unknown'}"
