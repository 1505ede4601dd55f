"""The tables a report holds, each from rows alone: a sweep's maximum, memory and time tables
(``sweep``), the training table (``training``), block-sparse sparsity (``sparsity``), multi-GPU
speedup and ring rows against one GPU (``multigpu``), speedup rows as CSV (``speedup``), where a
data-parallel call's time goes (``call_cost``) and the first screen's "does a second GPU help?"
(``second_gpu``)."""
