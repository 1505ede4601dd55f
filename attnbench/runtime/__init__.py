"""Processes: supervise a child, the worker entry point, torchrun launch.

A job for one worker process is a ``jobs.Job``: a function with a typed spec and a typed
result, both sent as JSON and read back checked; the worker finds it by its name,
``"module:function"``. A rank of a multi-process job (``distributed``) is still a function
of a JSON payload returning a JSON object. Nothing here knows what a trial or a sweep is: the
layers above hand in the work to run.
"""
