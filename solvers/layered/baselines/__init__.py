"""Baselines the heuristic is measured against (docs/solvers.md §5): the Megatron-style symmetric
layout, a random graph partition, and ablations of the heuristic. All return `SolveResult`s
whose plans `planner.evaluate` judges, like every other solver."""
