"""The speedup sweep: does a second GPU help? One implementation at (sequence length x batch)
cases, on one GPU and spread over P GPUs by each strategy.

``kind`` is the sweep kind (a profile's ``[[speedup]]`` table is a series of it), ``runner``
runs its cases (every trial in fresh processes, one row per case and strategy), ``job`` is what
each rank runs, ``strategies`` how a strategy spreads the work, ``rows`` the rows the ranks'
results become.
"""
