"""Solvers for sequence plans (DESIGN.md §7): none yet — they come next, built on
`planner.sequence` (`SeqPlan.from_rings` to assemble a plan, `MemberTable.from_arrays` and
`planner.sequence.iteration_time(problem, table, check=False)` for the inner loop)."""
