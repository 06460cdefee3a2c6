"""The sequence plan: replicas (data-parallel), each a ring of groups (context parallelism),
each group a list of members (head parallelism) — docs/sequence-plans.md §7.1, §7.4.

Typed data only; `planner.sequence.validate` checks a plan against a problem and
`planner.sequence.evaluate` prices it. What needs no problem is checked here: counts written
as integers, device ids in range, a device named once inside a group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator

from planner.base import Frozen
from planner.layered.plan import MAX_DEVICE_ID, whole_numbers
from planner.solver_info import SolverInfo
from planner.base import plural, sizes_phrase

SEQPLAN_FORMAT = "hexiscale.seqplan/1"

MemberSpec = tuple[int, int, int]  # (device, heads, tokens) of one member, before it is a `Member`


class Member(Frozen):
    device: int = Field(ge=0, le=MAX_DEVICE_ID, description="global device id")
    heads: int = Field(ge=1, description="query heads held inside attention (a multiple of a/k)")
    tokens: int = Field(ge=1, description="t_i, tokens of the group's shard held outside attention "
                                          "(a multiple of the token block q)")

    @field_validator("device", "heads", "tokens", mode="before")
    @classmethod
    def _integers(cls, value: Any, info) -> Any:
        return whole_numbers(value, "device ids" if info.field_name == "device" else info.field_name)


class Group(Frozen):
    members: tuple[Member, ...] = Field(min_length=1, description="the head-parallel group, in token order")

    @field_validator("members")
    @classmethod
    def _distinct_devices(cls, members: tuple[Member, ...]) -> tuple[Member, ...]:
        devices = [m.device for m in members]
        if len(set(devices)) != len(devices):
            twice = sorted({d for d in devices if devices.count(d) > 1})
            raise ValueError(f"a group names device {twice[0]} twice: devices {devices}")
        return members

    @property
    def tokens(self) -> int:
        """T_g: the group's shard of the sequence."""
        return sum(m.tokens for m in self.members)

    @property
    def heads(self) -> int:
        return sum(m.heads for m in self.members)

    @property
    def devices(self) -> list[int]:
        return [m.device for m in self.members]


class Replica(Frozen):
    batch: int = Field(ge=1, description="B_r, sequences per iteration for this replica")
    ring: tuple[Group, ...] = Field(min_length=1, description="context-parallel groups in ring order")

    @field_validator("batch", mode="before")
    @classmethod
    def _integer_batch(cls, value: Any) -> Any:
        return whole_numbers(value, "batch")

    @property
    def tokens(self) -> int:
        """Σ_g T_g (must be s)."""
        return sum(g.tokens for g in self.ring)

    @property
    def devices(self) -> list[int]:
        return [m.device for g in self.ring for m in g.members]


class SeqPlan(Frozen):
    format: Literal["hexiscale.seqplan/1"] = Field(default=SEQPLAN_FORMAT, description="file format tag")
    problem: str = Field(default="", description="name of the problem the plan is for")
    replicas: tuple[Replica, ...] = Field(min_length=1, description="data-parallel replicas")
    solver: SolverInfo | None = Field(default=None, description="how the plan was found")

    @property
    def global_batch(self) -> int:
        """B: the sequences of one iteration, over every replica."""
        return sum(r.batch for r in self.replicas)

    @classmethod
    def from_rings(cls, *, problem: str, batches: Sequence[int],
                   rings: Sequence[Sequence[Sequence[MemberSpec]]]) -> SeqPlan:
        """The plan whose replica r has batch `batches[r]` and, in ring order, one group per
        list of `(device, heads, tokens)` in `rings[r]`. The one place a solver turns its own
        lists into a `SeqPlan`; numpy integers are stored as Python ints."""
        if len(batches) != len(rings):
            raise ValueError(f"{len(batches)} batches for {plural(len(rings), 'replica')}")
        return cls(problem=problem, replicas=tuple(
            Replica(batch=int(batch), ring=tuple(
                Group(members=tuple(Member(device=int(d), heads=int(h), tokens=int(t)) for d, h, t in group))
                for group in ring))
            for batch, ring in zip(batches, rings)))

    def rings(self) -> list[list[list[tuple[int, int, int]]]]:
        """Every replica's ring as `from_rings` takes it: per group, `(device, heads, tokens)` of
        each member, in ring order (what the solvers work on)."""
        return [[[(m.device, m.heads, m.tokens) for m in g.members] for g in r.ring] for r in self.replicas]

    @property
    def devices(self) -> list[int]:
        return [d for r in self.replicas for d in r.devices]

    @property
    def num_groups(self) -> int:
        return sum(len(r.ring) for r in self.replicas)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_none=True)


def outline(plan: SeqPlan) -> str:
    """The plan's structure in one phrase: replicas, groups, devices and each group's HP size."""
    hp = sizes_phrase([len(g.members) for r in plan.replicas for g in r.ring])
    return f"D={len(plan.replicas)}, {plural(plan.num_groups, 'group')}, {plural(len(plan.devices), 'device')}, HP {hp}"
