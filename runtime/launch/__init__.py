"""Starting and watching runs: `launcher` (`run_plan`, local processes, torchrun commands; no
torch), `worker` (the per-rank entry: `python -m runtime.launch.worker`), `resume` (a job
started from a checkpoint; no torch), `elastic` (re-plan and restart after a lost rank).
Modules are imported by their full name; this package imports nothing, so a worker's
start does not import the launcher.
"""
