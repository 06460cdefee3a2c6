"""The exact solver path (docs/solvers.md §5): CP-SAT (`cpsat`) and MILP (`milp`) models of the
whole plan space, solved per number of pipelines by `driver`, and the brute-force oracle
(`brute`) for tiny problems. docs/formulation.md writes the models down."""
