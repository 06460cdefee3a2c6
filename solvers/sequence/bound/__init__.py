"""A proven lower bound on the optimal T of a sequence plan at any cluster size, and the solver
that closes it (docs/sequence_bounds.md): `keys` bounds T_mb of every replica device set per
machine (its *key*), `master` bounds T over every set of replicas and batch split, `solver`
starts from the default heuristic's plan and tightens both sides until they meet."""
