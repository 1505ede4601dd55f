"""attnbench: measure how long a sequence an attention implementation handles, how fast,
and with how much memory on each GPU."""

__version__ = "0.1.0"
