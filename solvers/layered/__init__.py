"""Solvers of layered plans (docs/solvers.md §5): `exact/` (CP-SAT, MILP, brute force), `heuristic/`
(two-phase hierarchical graph partitioning), `baselines/` (symmetric, random, ablations) and
`replan` (the repair after lost devices, §10)."""

from solvers.solver_kind import SolverKind

SOLVER_KIND = SolverKind(
    name="layered", default_solvers=("heuristic", "cpsat", "milp", "symmetric", "symmetric-all", "random"),
    reference="symmetric", reference_label="×sym",  # Megatron-style: one TP × PP shape everywhere
    replan="solvers.layered.replan:candidates")
