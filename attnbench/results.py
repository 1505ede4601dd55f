"""The result schema: one JSON object per trial, appended to ``trials.jsonl`` as each ends.

Every row carries the environment it ran in, its raw timing samples and per-GPU memory, so
reports and the regression check read result files and nothing else. A killed sweep loses
at most the trial in flight: each row is one ``write`` of one line, flushed and synced, and
a reader skips (and reports) a truncated last line.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnbench import __version__
from attnbench.errors import AttnbenchError
from attnbench.schema import SCHEMA_VERSION, SchemaError, validate

TRIALS_FILE = "trials.jsonl"
# Trial statuses; everything but "ok" is a failure that stops a max-seq search.
STATUSES = ("ok", "oom", "time-limit", "error")


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-c", "safe.directory=*", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10
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
    commit = _git("rev-parse", "HEAD")
    if commit:
        dirty = _git("status", "--porcelain", "--untracked-files=no")
        return commit + ("-dirty" if dirty else "")
    return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_inventory() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """GPUs as NVML reports them (name, memory, links), without creating a CUDA context."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        return [], {"nvml": f"unavailable ({type(exc).__name__})"}
    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        name = pynvml.nvmlDeviceGetName(h)
        gpus.append({
            "index": i,
            "name": name.decode() if isinstance(name, bytes) else name,
            "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
            "nvlinks_active": _active_nvlinks(pynvml, h),
        })
    driver = pynvml.nvmlSystemGetDriverVersion()
    info = {"nvml": "ok", "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "gpu_links": gpu_links(pynvml)}
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
_TOPOLOGY = {"INTERNAL": "same board", "SINGLE": "one PCIe switch", "MULTIPLE": "several PCIe switches",
             "HOSTBRIDGE": "one PCIe host bridge", "NODE": "host bridges of one NUMA node", "SYSTEM": "across NUMA nodes"}


def gpu_links(pynvml) -> list[dict[str, Any]]:
    """How each pair of GPUs is connected, as NVML reports it: the PCIe topology level and
    whether peer-to-peer access over NVLink works."""
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    levels = {getattr(pynvml, f"NVML_TOPOLOGY_{k}", None): v for k, v in _TOPOLOGY.items()}
    links = []
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            link: dict[str, Any] = {"gpus": [i, j]}
            try:
                link["topology"] = levels.get(pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]), "unknown")
            except Exception:
                link["topology"] = "unknown"
            try:
                status = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                link["p2p_nvlink"] = "ok" if status == pynvml.NVML_P2P_STATUS_OK else "not supported"
            except Exception:
                link["p2p_nvlink"] = "unknown"
            links.append(link)
    return links


def capture_env(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from attnbench.measure.memory import nvml_settings

    gpus, gpu_info = gpu_inventory()
    env = {
        "attnbench": __version__,
        "commit": source_commit(),
        "date": now_utc(),
        "command": " ".join(argv if argv is not None else sys.argv),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
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
    env["machine"] = machine_key(env)
    return env


def _nccl_version() -> str | None:
    try:
        import torch

        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:
        return None


def machine_key(env: dict[str, Any]) -> str:
    """What results are grouped by: the GPU model and count, or the CPU model."""
    gpus = env.get("gpus") or []
    if gpus:
        names = sorted({g["name"] for g in gpus})
        return f"{' + '.join(names)} x{len(gpus)}"
    return f"cpu: {env.get('cpu', 'unknown')}"


def series_key(workload: dict[str, Any], world_size: int = 1, strategy: str = "single", kind: str = "max-seq") -> str:
    """Identity of a sweep line: everything about a trial except its sequence length."""
    ident = {k: v for k, v in workload.items() if k != "seq_len"}
    ident.update(world_size=world_size, strategy=strategy, kind=kind)
    blob = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


class ResultsWriter:
    """Appends rows to ``DIR/trials.jsonl``; each row is one line written at once, and only
    a row its kind's schema accepts (a writer that breaks the schema fails at once)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / TRIALS_FILE

    def append(self, row: dict[str, Any]) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        row = {"schema": SCHEMA_VERSION, **row}
        line = json.dumps(row, default=_jsonable, allow_nan=False) + "\n"
        validate(json.loads(line))  # the row as a reader will see it
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot store {type(value).__name__} in a result row")


def clean_floats(row: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinity are not JSON: store them as null."""
    def fix(v):
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return None
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v
    return fix(row)


def result_files(path: Path) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise AttnbenchError(f"results path {path} does not exist: give a results directory or trials.jsonl")
    return sorted(path.rglob(TRIALS_FILE))


def read_rows(paths: Path | Iterable[Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """All rows under the given files or directories, each valid for its kind's schema, and
    one problem line per line skipped (not JSON, or not a valid row: the field is named)."""
    if isinstance(paths, (str, Path)):
        paths = [Path(paths)]
    rows, problems = [], []
    for root in paths:
        for file in result_files(Path(root)):
            with open(file, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                        if not isinstance(row, dict):
                            raise ValueError("not an object")
                    except ValueError as exc:
                        problems.append(f"{file}:{lineno}: unreadable line skipped ({exc})")
                        continue
                    try:
                        validate(row)
                    except SchemaError as exc:
                        problems.append(f"{file}:{lineno}: invalid row skipped ({exc})")
                        continue
                    row["_file"] = str(file)
                    rows.append(row)
    return rows, problems


def rows_to_resume(out_dir: Path, resume: bool, machine: str) -> list[dict[str, Any]]:
    """The rows a run may continue from: refuses to overwrite a results directory without
    ``resume``, and to mix machines in one directory."""
    trials = Path(out_dir) / TRIALS_FILE
    if not trials.exists():
        return []
    if not resume:
        raise AttnbenchError(f"{out_dir} already holds results: pass --resume to continue it or choose another --out")
    rows, _ = read_rows(trials)
    machines = {r.get("env", {}).get("machine") for r in rows if r.get("env")}
    if machines and machine not in machines:
        raise AttnbenchError(
            f"{out_dir} was measured on {', '.join(sorted(map(str, machines)))}, this is {machine}: "
            "resume on the same machine or choose another --out"
        )
    return rows


def write_text_atomic(path: Path, text: str) -> None:
    """Write a derived file (CSV, markdown) so a reader never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
