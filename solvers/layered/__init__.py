"""Solvers of layered plans (DESIGN.md §5): `exact/` (CP-SAT, MILP, brute force), `heuristic/`
(two-phase hierarchical graph partitioning) and `baselines/` (symmetric, random, ablations)."""
