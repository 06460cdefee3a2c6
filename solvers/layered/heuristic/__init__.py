"""The heuristic solver path of docs/solvers.md §5: METIS pools, per-pool pipelines, polish.

Public API (used by the baselines too):
- `HeuristicOptions`: knobs, including the random-partition baseline and the ablations;
- `solve(problem, options)` and `solve_with(problem, options, heuristic)`: the search alone (the
  registry's `heuristic` adds the exact refinement on small clusters: solvers/layered/composed.py,
  so that this package never reaches the exact solvers);
- `build_plan(problem, pools, heuristic, *, tp_cap, max_stages, cache)`: phase 2 (pools of device ids → Plan);
- `partition(problem, D, *, partitioner, protect, seed)`: phase 1 alone;
- `polish(problem, table, *, rounds, exhaustive_moves, deadline)`: the layer / micro-batch local search alone.
"""

from solvers.layered.heuristic.assemble import build_plan
from solvers.layered.heuristic.options import HeuristicOptions
from solvers.layered.heuristic.partition import partition
from solvers.layered.heuristic.polish import polish
from solvers.layered.heuristic.search import solve, solve_with

__all__ = ["HeuristicOptions", "build_plan", "partition", "polish", "solve", "solve_with"]
