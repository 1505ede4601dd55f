"""Measuring one trial: timing, memory (allocator and NVML), OOM classification."""
