"""The tables a report and a results directory hold, each from rows alone: a sweep's maximum,
memory and time tables (``sweep``; ``sweep_files`` writes them beside the rows), the training
table (``training``), block-sparse sparsity (``sparsity``), multi-GPU speedup (``speedup``),
quantities derived across GPUs (``multigpu``), sequence-parallel scaling (``scaling``), where
a data-parallel call's time goes (``call_cost``) and the first screen's "does a second GPU
help?" (``second_gpu``)."""
