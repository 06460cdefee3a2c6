"""The exact CP-SAT solver of sequence plans (DESIGN.md §7, docs/formulation.md §7.1):
`structure` enumerates device sets and rings up to the symmetries [S1]/[S2], `model` builds
one CP-SAT model per ring structure for the integers (heads, tokens), `cpsat` runs them and
combines replicas and batches exactly [B1]."""
