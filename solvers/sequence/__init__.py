"""Solvers for sequence plans (docs/sequence-plans.md §7), built on `planner.sequence`:

- `brute`: the exhaustive oracle for tiny problems (≤ 5 devices, ≤ 8 shard units);
- `heuristic`: HexiSeq's two-stage scheduler (`coarse` placement with shards by speed capped
  by memory in `shard_memory`, per-group split, `polish` and `regroup` moves priced by the
  planner), any size;
- `baselines`: `seq-uniform` (best uniform layout over the device sets a user would try),
  `seq-uniform-all` (the whole cluster) and `seq-roundrobin`;
- `exact/`: CP-SAT and MILP over the whole §7.1 space (small clusters), equal to `brute`;
- `bound/`: a proven lower bound at any size the keys can be listed, and the `bound` solver
  that starts from the heuristic and closes it (docs/sequence_bounds.md);
- `space`: what they share (rings as lists, batched pricing of rings, batch split, memory proof);
- `replan`: the repair after lost devices (§10).
"""

from solvers.solver_kind import SolverKind

# From this sequence length on, `solve(kind="auto")` plans by sequence: long context, where
# activations and s² attention dominate (docs/sequence-plans.md §7)
LONG_CONTEXT_TOKENS = 32768

SOLVER_KIND = SolverKind(
    name="sequence", default_solvers=("heuristic", "seq-uniform", "seq-roundrobin"),
    reference="seq-uniform", reference_label="×unif",  # Megatron CP / USP: even shares on the best device set
    also_compare=("layered:heuristic",),  # which kind wins at this sequence length
    auto_from_seq_len=LONG_CONTEXT_TOKENS, replan="solvers.sequence.replan:candidates",
    exact_too_big="solvers.sequence.exact.driver:too_big")
