"""The files a results directory gets beside its trials.jsonl (`sweep.md`, `trials.csv`,
`max_seq.csv`), assembled from the sweep tables and the training table."""

from __future__ import annotations

from pathlib import Path

from attnbench.report.data import trials
from attnbench.report.markdown import heading_text
from attnbench.report.tables.sparsity import sparsity_table
from attnbench.report.tables.sweep import (
    max_seq_csv,
    max_seq_summary,
    memory_table,
    series_groups,
    summary_table,
    time_table,
    trials_csv,
)
from attnbench.report.tables.training import training_markdown
from attnbench.results import load_rows, write_text_atomic
from attnbench.results.schema import Row


def sweep_markdown(rows: list[Row]) -> str:
    parts = []
    summary = max_seq_summary(rows)
    if summary:
        parts += ["## Largest sequence per implementation\n", summary_table(summary)]
    parts.append(("\n" if parts else "") + training_markdown(rows))
    for group in series_groups(rows).values():
        head = group[0]
        parts.append(
            f"\n## {heading_text(head.label)}: {head.dtype}, B={head.batch}, H={head.heads}, D={head.head_dim}, "
            f"{head.mode}{', causal' if head.causal else ''}, {head.device}\n"
        )
        parts += ["\n", memory_table(group), "\n", time_table(group)]
    sparse = sparsity_table(rows, level=3)
    if sparse:
        parts += ["\n## Block-sparse vs dense (report 002, Block-Sparse Base Implementation)\n", sparse]
    parts.append(
        "\nMemory columns: 'Memory After QKV' is what allocating q, k and v took; 'Peak Memory' and 'Memory (MB)' "
        "are the trial's peak (`torch.cuda.max_memory_allocated` after a reset on GPU, resident-set growth on CPU). "
        "GB = 10^9 bytes, MB = 10^6 bytes. The floor is q, k, v and the output. "
        "Times are medians ±half their 95% bootstrap interval, n samples: eager time is one synchronised call "
        "(dispatch included), GPU time the device's own (CUDA graph replays or back-to-back calls). "
        "A max-seq is the bracket of its search: the largest length that ran – the first that failed.\n"
    )
    return "".join(parts)


def write_sweep_tables(out_dir: Path) -> list[Path]:
    """Regenerate ``sweep.md``, ``trials.csv`` and ``max_seq.csv`` from ``trials.jsonl``."""
    out_dir = Path(out_dir)
    rows, _ = load_rows(out_dir)
    written = []
    if trials(rows):
        write_text_atomic(out_dir / "sweep.md", sweep_markdown(rows))
        write_text_atomic(out_dir / "trials.csv", trials_csv(rows))
        written += [out_dir / "sweep.md", out_dir / "trials.csv"]
    summary = max_seq_summary(rows)
    if summary:
        write_text_atomic(out_dir / "max_seq.csv", max_seq_csv(summary))
        written.append(out_dir / "max_seq.csv")
    return written
