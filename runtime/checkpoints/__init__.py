"""Plan-independent checkpoints (docs/checkpoints.md §10): `manifest` (the format: folders, manifest,
atomic commit, checks; no torch), `tensors` (a rank's chunks written, any region read back).
Each plan kind maps its shards to chunks in its own `checkpoint` module; starting a job from a
checkpoint is `runtime.launch.resume`.
"""
