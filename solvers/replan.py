"""Re-planning after lost devices (docs/checkpoints.md §10): the survivors' problem, the old plan
repaired onto it (the warm start), a fresh solve, and the better of the two.

Device ids are positions in the cluster (machine 0's devices first), so removing devices
shifts every later id: `survivors` returns the smaller problem (named `<name>-without-<ids>`,
the lost ids as runs, e.g. `demo-asym-without-0-3,8`: so a plan in its ids is taken neither
for one of the old problem nor for one after other losses) and the map old id → new id, and
every plan returned here is written in the new problem's ids.

Each plan kind repairs its own structure (`SolverKind.replan`: `solvers.layered.replan`,
`solvers.sequence.replan`) and solves afresh; the rest — survivors, id map, the choice of
the faster valid candidate, what changed — is shared here.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from numbers import Integral
from typing import Any

from pydantic import Field

from planner.base import MAX_NAME, Frozen, file_stem, format_runs, format_seconds
from planner.hardware import Cluster
from planner.kinds import AnyPlan, kind_of, validate
from planner.problem import Problem
from planner.violations import InvalidPlanError
from planner.workload import ModelSpec
from solvers.common import SolverOptions
from solvers.kinds import solver_kind
from solvers.repair_parts import valid_time


class ReplanError(ValueError):
    """The lost devices cannot be removed (unknown ids, nothing left); one line."""


class NoReplanError(ReplanError):
    """Neither the repaired plan nor a fresh solve is valid on the survivors: no plan (not bad input)."""


class ReplanResult(Frozen):
    problem: Problem = Field(description="the survivors' problem (new device ids)")
    plan: AnyPlan = Field(description="the new plan (the old plan's kind), in the new problem's ids")
    lost: tuple[int, ...] = Field(description="the lost devices, old ids")
    old_to_new: dict[int, int] = Field(description="old device id → new id, for every survivor")
    old_s: float | None = Field(description="the old plan's T on the old problem")
    new_s: float = Field(description="the new plan's T")
    chosen: str = Field(description="repaired (the old plan's structure) or the fresh solver's name")
    repaired_s: float | None = Field(default=None, description="T of the repaired old plan (None: invalid)")
    repaired_why: str = Field(default="", description="why the repaired plan is no candidate ('' when it is)")
    fresh_s: float | None = Field(default=None, description="T of the fresh solve (None: no plan)")
    fresh_why: str = Field(default="", description="why the fresh solve gave no plan ('' when it gave one)")
    changes: tuple[str, ...] = Field(default=(), description="what changed, one line each")
    wall_s: float = Field(ge=0, description="re-planning wall time")


def _listed(value: Any, argument: str, what: str) -> list:
    """`value` as a list of ids: an iterable, but not a str ('13' read digit by digit lost
    devices 1 and 3) nor a single id."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ReplanError(f"{argument}: expected a list of {what}, got {value!r}")
    return list(value)


def lost_devices(problem: Problem, devices=(), machines=(), *, names=("lost", "lost_machines")) -> set[int]:
    """Device ids (ints) and whole machines (by name or index) → the set of lost device ids; at
    least one must be named (nothing lost re-plans nothing, under a name ending in '-without-').
    `names`: the two lists' names in messages (the CLI's options, where it calls this)."""
    devices = _listed(devices, names[0], "device ids (ints)")
    machines = _listed(machines, names[1], "machine names or indices")
    if not devices and not machines:
        raise ReplanError("name what was lost: lost=[3, 7] (device ids) and/or lost_machines=[NAME, ...]")
    cluster = problem.cluster
    ids, whole = _lost_ids(cluster, devices, names[0]), _lost_machines(cluster, machines, names[1])
    if both := sorted(ids & whole):  # named twice, as a repeated id is: probably a typo for another
        machine = cluster.machines[int(cluster.machine_of_device[both[0]])].name
        raise ReplanError(f"{names[0]}: device {both[0]} is on machine {machine}, which {names[1]} names whole: "
                          f"name each lost device once")
    lost = ids | whole
    if len(lost) >= cluster.num_devices:
        raise ReplanError("every device of the cluster is lost: nothing to re-plan on")
    return lost


def _lost_ids(cluster: Cluster, devices: list, name: str) -> set[int]:
    """Device ids, each named once: a repeat (3,3) is probably a typo for another id, and taken
    as one device it would re-plan without a loss the caller meant."""
    # a bool or a float is probably a mistake (True is device 1; 3.5 would be device 3)
    odd = next((d for d in devices if not isinstance(d, Integral) or isinstance(d, bool)), None)
    if odd is not None:
        raise ReplanError(f"{name}: device ids are ints, got {odd!r} ({type(odd).__name__})")
    lost: set[int] = set()
    for d in map(int, devices):
        if not 0 <= d < cluster.num_devices:
            raise ReplanError(f"{name}: device {d} is not in the cluster (ids 0..{cluster.num_devices - 1})")
        if d in lost:
            raise ReplanError(f"{name}: device {d} is named twice")
        lost.add(d)
    return lost


def _lost_machines(cluster: Cluster, machines: list, name: str) -> set[int]:
    """The devices of whole machines (by name or index), each machine named once, as ids are."""
    index, named, lost = cluster.machine_index, {}, set()
    for m in machines:
        key = int(m) if str(m).isascii() and str(m).isdigit() else index.get(str(m))  # not '²' or '٣'
        if key is None or not 0 <= key < len(cluster.machines):
            raise ReplanError(f"{name}: machine {m!r} is not in the cluster (machines: {', '.join(index)})")
        if key in named:
            spelled = f" (as {named[key]!r} and {m!r})" if str(named[key]) != str(m) else ""
            raise ReplanError(f"{name}: machine {cluster.machines[key].name!r} is named twice{spelled}")
        named[key] = m
        lost.update(cluster.devices_of(key))
    return lost


def survivors(problem: Problem, lost: set[int]) -> tuple[Problem, dict[int, int]]:
    """The problem on the surviving devices and the map old id → new id."""
    cluster, machines, mapping = problem.cluster, [], {}
    for m, machine in enumerate(cluster.machines):
        keep = [d for d in cluster.devices_of(m) if d not in lost]
        for d in keep:
            mapping[d] = len(mapping)
        if keep:
            machines.append(machine.model_dump() | {"count": len(keep)})
    names = {m["name"] for m in machines}
    data = cluster.model_dump()
    data["machines"] = machines
    data["links"] = [link for link in data["links"] if link["a"] in names and link["b"] in names]
    data["racks"] = [rack | {"machines": [n for n in rack["machines"] if n in names]} for rack in data["racks"]
                     if sum(n in names for n in rack["machines"]) >= 2]
    new = problem.model_copy(update={"cluster": Cluster.model_validate(data),
                                     "name": survivors_name(problem.name, lost)})
    return Problem.model_validate(new.model_dump()), mapping


MAX_RUNS_IN_NAME = 64  # characters of lost ids a name spells out; more are counted and hashed
# the name is the survivors' file's name too (`<name>.yaml`), and a file system takes 255 bytes
MAX_NAME_BYTES = 255 - len(".yaml")


def survivors_name(name: str, lost) -> str:
    """The survivors' problem's name: which devices were lost, not only how many (two replans
    that lose as many devices would write one file, and the later would judge the earlier plan).
    Many scattered ids are counted and hashed instead. The name must read back from its file
    (MAX_NAME characters) and name that file (MAX_NAME_BYTES): past either (a long problem name,
    or one that earlier re-plans grew) the problem's name is cut, and a hash of the whole name
    and of every lost id keeps distinct problems and distinct losses apart."""
    runs = format_runs(sorted(lost))
    counted = f"{len(lost)}-devices-{_digest(runs)}"
    for what in ([runs] if len(runs) <= MAX_RUNS_IN_NAME else []) + [counted]:
        if _fits(whole := f"{name}-without-{what}"):
            return whole
    whole_key = "\n".join((name, runs))  # a name holds no newline: no two pairs join alike
    tail = f"…-without-{len(lost)}-devices-{_digest(whole_key)}"
    cut = name[:MAX_NAME - len(tail)]
    while not _fits(cut + tail):  # a character outside ASCII takes 2-4 of a file name's bytes
        cut = cut[:-1]
    return cut + tail


def _fits(name: str) -> bool:
    """Within a name's characters, and its file's name (`file_stem`: '/' takes 3 bytes there)
    within a file name's bytes."""
    return len(name) <= MAX_NAME and len(file_stem(name).encode()) <= MAX_NAME_BYTES


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def replan(problem: Problem, plan: Any, lost=(), *, lost_machines=(), solver: str = "heuristic",
           options: SolverOptions | None = None, trained: ModelSpec | None = None,
           trained_seq_len: int | None = None) -> ReplanResult:
    """Remove the lost devices (ids of `problem`) or machines, repair the old plan and solve
    afresh by the plan's kind (a layered solve warm-starts from the repair; a sequence solve
    runs beside it), and keep the better of the two. With `trained` (an elastic run's model)
    and, for sequence plans, `trained_seq_len` (its sequence), a plan that cannot run that
    model is not chosen: a layered plan's TP sizes must split it; a sequence plan's shares
    must scale to it (`solvers.sequence.replan.RunFit`)."""
    start = time.perf_counter()
    gone = lost_devices(problem, lost, lost_machines)
    broken = [v for v in validate(problem, plan) if v.rule != "memory"]  # over memory: still repaired
    if broken:  # a device beyond the cluster was an IndexError inside the repair
        raise InvalidPlanError(broken)
    new, mapping = survivors(problem, gone)
    options = options or SolverOptions()
    found = solver_kind(kind_of(plan).name).replanner()(
        problem, plan, new, mapping, solver=solver, options=options, trained=trained,
        trained_seq_len=trained_seq_len, deadline=start + options.time_limit_s)
    repaired, repaired_s, changes, fresh, notes = found[:5]
    why_not = found.why or _not_a_candidate(new, plan, repaired, repaired_s)  # the repair's own reason first
    fresh_s = valid_time(new, fresh.plan)
    if repaired_s is None and fresh_s is None:
        raise NoReplanError(f"no valid plan on the {new.cluster.num_devices} surviving devices "
                            f"({'; '.join(notes) or fresh.message or fresh.status.value})")
    use_repaired = fresh_s is None or (repaired_s is not None and repaired_s <= fresh_s)
    chosen_plan, new_s = (repaired, repaired_s) if use_repaired else (fresh.plan, fresh_s)
    old_s = valid_time(problem, plan)
    return ReplanResult(problem=new, plan=chosen_plan, lost=tuple(sorted(gone)), old_to_new=mapping,
                        old_s=old_s, new_s=new_s, chosen="repaired" if use_repaired else fresh.solver,
                        repaired_s=repaired_s, repaired_why=why_not,
                        fresh_s=fresh_s, fresh_why="" if fresh_s is not None else fresh.message or fresh.status.value,
                        wall_s=time.perf_counter() - start,
                        changes=tuple(summary(plan, chosen_plan, (changes if use_repaired else []) + notes, old_s, new_s)))


def _not_a_candidate(problem: Problem, old: Any, repaired: Any, repaired_s: float | None) -> str:
    """Why the repaired plan is no candidate: no unit of the old plan survived, its first broken
    rule, or (valid) the run cannot train it; '' when it is one."""
    if repaired_s is not None:
        return ""
    if repaired is None:
        return f"no {kind_of(old).unit} of the old plan survived whole"
    violations = validate(problem, repaired)
    return str(violations[0]) if violations else "valid, but the trained model cannot run it"


def summary(old: Any, new: Any, repairs: list[str], old_s: float | None, new_s: float) -> list[str]:
    """What changed, one line each: the shape of the plan (`PlanKind.outline`), the repairs, and T."""
    lines = [f"plan: {kind_of(old).outline(old)} → {kind_of(new).outline(new)}", *repairs]
    if old_s is not None:
        lines.append(f"T: {format_seconds(old_s)} → {format_seconds(new_s)} ({(new_s / old_s - 1) * 100:+.1f}%)")
    else:
        lines.append(f"T: {format_seconds(new_s)} (the old plan was not valid for its problem)")
    return lines
