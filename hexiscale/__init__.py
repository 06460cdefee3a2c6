"""hexiscale: plan and run LLM training on heterogeneous GPU clusters.

    import hexiscale as hx
    problem = hx.load_problem("tiny-2-tiny")   # a bundled name (from any folder) or a file's path
    result = hx.solve(problem, solver="heuristic")   # kind="auto": layered, or sequence at long context
    print(hx.evaluate(problem, result.plan).iteration_s)
    run = hx.run_plan(problem, result.plan, model="tiny", steps=2)   # a layered or a sequence plan
    new = hx.replan(problem, result.plan, [0])   # lost device 0: new.plan in the survivors' ids

validate, evaluate, solve, replan and run_plan check their problem and plan afresh (one made with
`model_copy(update=...)` too: pydantic does not validate those) and take a file's path or a
bundled name in their place; a bad field is an InputError naming it. run_plan starts one process
per device of the plan, at most 8 per core (RunError beyond: use `hexiscale run --torchrun`).
"""

from importlib import import_module

# Each name is imported on first use (PEP 562), not with the package: the `hexiscale` command's
# entry point lives in this package, and importing the planner, the solvers and the runtime
# (torch, ortools: about a second) before it runs would put a Ctrl-C in that second outside
# its handling (a traceback instead of one line). `from hexiscale import solve` works as before.
_FROM = {
    "planner": ("Cluster", "Estimate", "GpuType", "InputError", "InvalidPlanError", "Link", "Machine", "ModelSpec",
                "Pipeline", "Plan", "Problem", "Stage", "TrainingSpec", "Violation", "load_plan", "load_problem",
                "save_plan"),
    "solvers.common": ("SolveResult", "SolverOptions"),
    "solvers.replan": ("ReplanResult",),
    # each checks its problem and plan afresh; solve: kind='auto' by default, the kind chosen and
    # why in kind_reason
    "hexiscale.api": ("evaluate", "replan", "run_plan", "solve", "validate"),
}
_MODULE_OF = {name: module for module, names in _FROM.items() for name in names}

__all__ = sorted(_MODULE_OF, key=lambda name: (name[0].islower(), name))


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'hexiscale' has no attribute {name!r}")
    value = getattr(import_module(_MODULE_OF[name]), name)
    globals()[name] = value  # once: later look-ups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
