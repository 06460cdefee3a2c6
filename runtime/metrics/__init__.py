"""What a run measures (docs/calibration.md §9): `timing` (a per-step `PhaseTimer`, CUDA-synchronized),
`runlog` (the run log `hexiscale calibrate` reads; no torch). Imports nothing of the runtime.
"""
