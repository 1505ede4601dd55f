"""Sweeps: sequences of trials (max-seq search, fixed points), never table formatting."""
