"""A sequence plan as flat arrays: one entry per member, per group, per replica, so that the
rules and the pricing run as a few numpy operations. Solvers may build a `MemberTable`
straight from their own arrays (`from_arrays`) and price it without making a `SeqPlan`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.sequence.plan import SeqPlan


def _offsets(sizes: np.ndarray) -> np.ndarray:
    """[0, s0, s0+s1, …]: where each segment starts, and the total at the end."""
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


@dataclass(frozen=True, eq=False)
class MemberTable:
    device: np.ndarray  # (M,) global device id of each member, group after group
    heads: np.ndarray  # (M,) heads_i
    tokens: np.ndarray  # (M,) t_i
    group_start: np.ndarray  # (G+1,) first member of each group (groups replica after replica)
    ring_start: np.ndarray  # (D+1,) first group of each replica
    batch: np.ndarray  # (D,) B_r

    @classmethod
    def from_arrays(cls, devices: Sequence[int], heads: Sequence[int], tokens: Sequence[int],
                    group_sizes: Sequence[int], ring_sizes: Sequence[int], batches: Sequence[int]) -> MemberTable:
        """Members in order (group after group, replica after replica); n_g of each group;
        G_r of each replica; B_r of each replica."""
        as_int = lambda x: np.asarray(x, dtype=np.int64).reshape(-1)  # noqa: E731
        group_sizes, ring_sizes = as_int(group_sizes), as_int(ring_sizes)
        table = cls(as_int(devices), as_int(heads), as_int(tokens), _offsets(group_sizes),
                    _offsets(ring_sizes), as_int(batches))
        if not (len(table.device) == len(table.heads) == len(table.tokens) == table.group_start[-1]) \
                or table.ring_start[-1] != len(group_sizes) or len(ring_sizes) != len(table.batch):
            raise ValueError("member, group and replica arrays disagree in length")
        if (group_sizes < 1).any() or (ring_sizes < 1).any():
            raise ValueError("every group needs a member and every replica a group")
        return table

    @classmethod
    def of(cls, plan: SeqPlan) -> MemberTable:
        members = [m for r in plan.replicas for g in r.ring for m in g.members]
        return cls.from_arrays(
            [m.device for m in members], [m.heads for m in members], [m.tokens for m in members],
            [len(g.members) for r in plan.replicas for g in r.ring], [len(r.ring) for r in plan.replicas],
            [r.batch for r in plan.replicas])

    # -- sizes ---------------------------------------------------------------------------
    @cached_property
    def num_members(self) -> int:
        return len(self.device)

    @cached_property
    def num_groups(self) -> int:
        return len(self.group_start) - 1

    @cached_property
    def num_replicas(self) -> int:
        return len(self.batch)

    @cached_property
    def group_size(self) -> np.ndarray:
        """n_g."""
        return np.diff(self.group_start)

    @cached_property
    def ring_size(self) -> np.ndarray:
        """G_r of each replica."""
        return np.diff(self.ring_start)

    # -- who belongs where ---------------------------------------------------------------
    @cached_property
    def group(self) -> np.ndarray:
        """(M,) global group index of each member."""
        return np.repeat(np.arange(self.num_groups), self.group_size)

    @cached_property
    def group_replica(self) -> np.ndarray:
        """(G,) replica of each group."""
        return np.repeat(np.arange(self.num_replicas), self.ring_size)

    @cached_property
    def position(self) -> np.ndarray:
        """(G,) ring position g of each group inside its replica."""
        return np.arange(self.num_groups) - self.ring_start[self.group_replica]

    @cached_property
    def prev_group(self) -> np.ndarray:
        """(G,) global index of the previous group in the ring (cyclic; itself when G_r = 1)."""
        r = self.group_replica
        return self.ring_start[r] + (self.position - 1) % self.ring_size[r]

    @cached_property
    def member_start(self) -> np.ndarray:
        """(D+1,) first member of each replica."""
        return self.group_start[self.ring_start]

    @cached_property
    def replica_size(self) -> np.ndarray:
        """(D,) N_r: devices of each replica."""
        return np.diff(self.member_start)

    @cached_property
    def replica(self) -> np.ndarray:
        """(M,) replica of each member."""
        return np.repeat(np.arange(self.num_replicas), self.replica_size)

    @cached_property
    def group_tokens(self) -> np.ndarray:
        """(G,) T_g."""
        return np.add.reduceat(self.tokens, self.group_start[:-1])

    @cached_property
    def group_heads(self) -> np.ndarray:
        """(G,) Σ heads of each group."""
        return np.add.reduceat(self.heads, self.group_start[:-1])

    @cached_property
    def replica_tokens(self) -> np.ndarray:
        """(D,) Σ_g T_g of each replica."""
        return np.add.reduceat(self.group_tokens, self.ring_start[:-1])

    @cached_property
    def first_token(self) -> np.ndarray:
        """(G,) x_g = Σ_{j<g} ℓ_j: where the group's first half-shard starts (§7.1 layout)."""
        half = self.group_tokens / 2
        before = np.cumsum(half) - half
        return (before - before[self.ring_start[self.group_replica]]).astype(np.int64)
