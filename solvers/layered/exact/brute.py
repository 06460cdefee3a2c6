"""Brute force for tiny problems: every valid plan, priced by `planner`, the best kept — the
best of the problem's objective (least T, least T within the budget, least cost per token) and
the time–rent frontier, from the best plan of every rented machine set (`solvers.brute_objective`).

The independent oracle of the exact models' tests. It shares no code with them: plans are
enumerated straight from docs/plan-space.md §2 and judged on their stage tables by the planner's
`breakdown` (what `iteration_time` prices) and memory function. Two symmetries are used, both
exact (docs/formulation.md §5): devices of one machine are interchangeable (a stage is a machine
and a TP size, its devices the machine's next free ones), and the order of the pipelines does
not change T (pipelines are enumerated as a sorted multiset). Under ZeRO-1 a stage's memory
depends on the plan's D (§11), so pipelines are judged once per D.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from planner.layered import cost
from planner.layered.pricing import breakdown, stage_shapes
from planner.layered.plan import Plan, devices_in_order
from planner.solver_info import SolveStatus
from planner.problem import Problem
from planner.layered.table import StageTable, table_of_stages
from solvers.brute_objective import BestPerMachineSet, BrutePoint, brute_frontier, brute_result
from solvers.common import SolveResult, SolverOptions
from planner.base import plural

MAX_DEVICES, MAX_LAYERS = 5, 6
# every split of B/b micro-batches over the pipelines is enumerated: B/b = 10⁸ ran past its time limit at 4 GB
MAX_MICRO_BATCHES = 64

StageKey = tuple[int, int]  # (machine, t)
PipeKey = tuple[tuple[StageKey, ...], tuple[int, ...], int]  # stage types, layer counts, m_p


def stage_sequences(problem: Problem) -> list[tuple[StageKey, ...]]:
    """Every ordered list of stages whose devices fit in the machines (rules 1, 2)."""
    counts = [m.count for m in problem.cluster.machines]
    kinds = [(m, t) for m, c in enumerate(counts) for t in problem.model.tp_sizes(c)]
    out: list[tuple[StageKey, ...]] = []

    def grow(seq: tuple[StageKey, ...], free: list[int]) -> None:
        if seq:
            out.append(seq)
        if len(seq) == problem.model.layers:
            return
        for m, t in kinds:
            if free[m] >= t:
                free[m] -= t
                grow(seq + ((m, t),), free)
                free[m] += t

    grow((), counts[:])
    return out


def compositions(total: int, parts: int):
    """Every tuple of `parts` positive integers summing to `total` (rule 3)."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        yield tuple(b - a for a, b in zip((0, *cuts), (*cuts, total)))


def make_plan(problem: Problem, pipes: list[PipeKey]) -> Plan:
    """The plan of these pipelines, each machine handing out its devices in order [R1]."""
    devices = devices_in_order(problem.cluster.first_device, [seq for seq, _, _ in pipes])
    return Plan.from_stages(problem=problem.name,
                            batches=[m * problem.training.micro_batch for _, _, m in pipes],
                            stages=[list(zip(d, layers)) for d, (_, layers, _) in zip(devices, pipes)])


def plan_table(problem: Problem, pipes: list[PipeKey]) -> StageTable:
    """The stage table of `make_plan(problem, pipes)`, built from the keys: T and memory depend
    on the stages' machines, t, n and the batches only. (Building the Plan object, validated field
    by field, was most of the memory check's time and a third of the enumeration's; the T and the
    memory verdicts are the same to the bit: tested.)"""
    stages = [stage for seq, _, _ in pipes for stage in seq]
    b = problem.training.micro_batch
    return table_of_stages(sizes=np.array([len(seq) for seq, _, _ in pipes]),
                           machine=np.array([m for m, _ in stages]), tp=np.array([t for _, t in stages]),
                           layers=np.array([n for _, layers, _ in pipes for n in layers]),
                           batch=np.array([m * b for _, _, m in pipes]), micro_batch=b)


def fits_memory(problem: Problem, pipe: PipeKey, pipelines: int = 1) -> bool:
    """Rule 5 for one pipeline in a plan of D = `pipelines` (memory depends only on the
    pipeline's own stages, m_p and, under ZeRO-1, D)."""
    table = plan_table(problem, [pipe])
    shape = stage_shapes(problem, table).with_(pipelines=pipelines)
    need = cost.stage_memory_bytes(problem.model, problem.training, shape)
    return bool(np.all(need <= problem.cluster.machine_memory_bytes[table.machine]))


def most_micro_batches(problem: Problem, seq, layers, pipelines: int = 1) -> int:
    """Largest m_p with which the pipeline fits in memory (0: none). Memory grows with m_p
    only through the schedule's in-flight count q (1F1B: min(S − k, m_p), flat from m_p = S
    on; GPipe: m_p, never flat), so once q stops growing every larger m_p fits too."""
    training, total = problem.training, problem.training.micro_batches
    index = np.arange(len(seq))
    saturated = cost.in_flight_micro_batches(training, len(seq), index, total)
    best = 0
    for m in range(1, total + 1):
        if not fits_memory(problem, (seq, layers, m), pipelines):
            return best
        best = m
        if np.array_equal(cost.in_flight_micro_batches(training, len(seq), index, m), saturated):
            return total
    return best


def pipeline_structures(problem: Problem, pipelines: int = 1) -> list[tuple[tuple[StageKey, ...], tuple[int, ...], int]]:
    """(stage types, layer counts, most micro-batches) of every pipeline that fits in a plan
    of D = `pipelines`."""
    out = []
    for seq in stage_sequences(problem):
        for layers in compositions(problem.model.layers, len(seq)):
            top = most_micro_batches(problem, seq, layers, pipelines)
            if top:
                out.append((seq, layers, top))
    return out


def enumerate_plans(problem: Problem):
    """Every valid plan up to the two symmetries: a sorted multiset of pipeline structures
    whose devices fit (rule 1), with every split of the micro-batches (rule 4, 5). Under
    ZeRO-1 the structures that fit are listed again for each D."""
    if problem.training.zero_stage != 1:
        yield from _plans_of(problem, pipeline_structures(problem), None)
        return
    for d in range(1, min(problem.cluster.num_devices, problem.training.micro_batches) + 1):
        yield from _plans_of(problem, pipeline_structures(problem, d), d)


def _plans_of(problem: Problem, structures: list, size: int | None):
    """The plans of `enumerate_plans` made of these structures, of `size` pipelines (any: None)."""
    machines = len(problem.cluster.machines)
    usage = [[sum(t for m, t in seq if m == k) for k in range(machines)] for seq, _, _ in structures]
    total = problem.training.micro_batches
    most = total if size is None else size

    def pick(start: int, chosen: list[int], free: list[int]):
        if chosen and (size is None or len(chosen) == size):
            yield list(chosen)
        if len(chosen) == most:
            return
        for i in range(start, len(structures)):
            if all(u <= f for u, f in zip(usage[i], free)):
                chosen.append(i)
                yield from pick(i, chosen, [f - u for f, u in zip(free, usage[i])])
                chosen.pop()

    for chosen in pick(0, [], [m.count for m in problem.cluster.machines]):
        for split in compositions(total, len(chosen)):
            if all(m <= structures[i][2] for i, m in zip(chosen, split)):
                yield [(structures[i][0], structures[i][1], m) for i, m in zip(chosen, split)]


def _too_big(problem: Problem) -> str | None:
    n, big_l = problem.cluster.num_devices, problem.model.layers
    micro = problem.training.micro_batches
    if n > MAX_DEVICES or big_l > MAX_LAYERS or micro > MAX_MICRO_BATCHES:
        return (f"brute force handles ≤ {MAX_DEVICES} devices, ≤ {MAX_LAYERS} layers and ≤ {MAX_MICRO_BATCHES} "
                f"micro-batches B/b; this problem has {plural(n, 'device')}, {plural(big_l, 'layer')} and "
                f"{micro:,} micro-batch{'es' if micro != 1 else ''}")
    return None


def best_per_machine_set(problem: Problem) -> list[BrutePoint]:
    """Every rented machine set's least-T plan, priced (docs/prices.md §13): a plan rents exactly
    the machines of its stages, and the two symmetries keep each set's machines."""
    best = BestPerMachineSet()
    for pipes in enumerate_plans(problem):
        machines = tuple(sorted({m for seq, _, _ in pipes for m, _ in seq}))
        best.offer(machines, breakdown(problem, plan_table(problem, pipes)).iteration, pipes)
    return best.points(problem, lambda pipes: make_plan(problem, pipes))


def frontier(problem: Problem) -> list[BrutePoint]:
    """The time–rent Pareto frontier by exhaustion, within the problem's budget (tiny priced
    problems only): the oracle of `hexiscale frontier`."""
    if (why := _too_big(problem)) is not None:
        raise ValueError(why)
    return brute_frontier(problem, best_per_machine_set(problem))


def solve(problem: Problem, options: SolverOptions | None = None) -> SolveResult:
    """The optimum of the problem's objective by exhaustion (tiny problems only: ≤ 5 devices,
    ≤ 6 layers): least T, least T within the budget, or least cost per token."""
    start = time.perf_counter()
    if (why := _too_big(problem)) is not None:
        return SolveResult(solver="brute", status=SolveStatus.unknown, wall_s=0.0, message=why)
    return brute_result(problem, best_per_machine_set(problem), start,
                        "no plan fits in memory (every plan enumerated)")


solve.honours_objective = True  # solvers.objective leaves it as it is
