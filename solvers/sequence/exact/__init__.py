"""The exact solvers of sequence plans (docs/sequence-plans.md §7, docs/formulation.md §7.1): `structure`
enumerates device sets and rings up to the symmetries [S1]/[S2]; per ring structure, `model`
builds one CP-SAT model and `milp` one MILP (HiGHS via PuLP, [M-S*]) for the integers (heads,
tokens); `driver` runs either over every structure and combines replicas and batches exactly
[B1]; `cpsat` and `milp` are the registered entries."""
