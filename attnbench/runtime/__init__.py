"""Processes: supervise a child, the worker entry point, torchrun launch.

A job is a plain function named ``"module:function"`` in a JSON job file; the worker
process imports it and writes its result as JSON. Nothing here knows what a trial or a
sweep is: the layers above hand in the function to run.
"""
