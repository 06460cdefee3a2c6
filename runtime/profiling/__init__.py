"""`hexiscale profile` (docs/calibration.md §9): `launcher` (settings, raw results, the processes' launcher;
no torch), `measure` (the measuring processes: `python -m runtime.profiling.measure`), `fit`
(raw timings → a cluster file; no torch).
"""
