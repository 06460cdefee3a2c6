"""What a run measures (docs/calibration.md §9): `timing` (a per-step `PhaseTimer`, CUDA-synchronized),
`runlog` (the run log `hexiscale calibrate` reads; no torch), `memory` (a rank's allocated and peak bytes).
Imports nothing of the runtime.
"""
