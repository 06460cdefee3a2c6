"""Solvers for sequence plans (DESIGN.md §7), built on `planner.sequence`:

- `brute`: the exhaustive oracle for tiny problems (≤ 5 devices, ≤ 8 shard units);
- `heuristic`: HexiSeq's two-stage scheduler (`coarse` placement, per-group split, `polish`
  and `regroup` moves priced by the planner), any size;
- `baselines`: `seq-uniform` and `seq-roundrobin`;
- `exact/`: CP-SAT and MILP over the whole §7.1 space (small clusters), equal to `brute`;
- `space`: what they share (rings as lists, batched pricing of rings, batch split, memory proof).
"""
