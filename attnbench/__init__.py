"""attnbench: measure how long a sequence an attention implementation handles, how fast,
and with how much memory on each GPU."""

__version__ = "0.1.0"


def load(*paths):
    """Result rows under results directories or trials.jsonl files, typed (attnbench.api.load)."""
    from attnbench.api import load

    return load(*paths)


def load_frame(*paths):
    """The same rows as one flat pandas DataFrame (attnbench.api.load_frame)."""
    from attnbench.api import load_frame

    return load_frame(*paths)
