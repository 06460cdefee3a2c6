"""Plan → rank layout: pure rank arithmetic, no torch.distributed (docs/solvers.md §6).

Ranks are numbered in plan order (pipeline, stage, device): pipeline 0's first stage gets
ranks 0..t-1, and so on. From that numbering this module derives every group the runtime
needs — the TP group of each stage, the leader pairs that exchange activations, and the
data-parallel *chunk groups* of the asymmetric gradient sync — so that golden tests can
check them without starting a process, and `runtime.layered.groups` only has to create them.

Parameter units: the embedding, each transformer layer and the LM head are the units of
gradient sync (the embedding and head are the pseudo-layers of docs/cost-model.md §3.4). Unit 0 is
the embedding, unit i+1 is layer i, unit L+1 is the head.
"""

from __future__ import annotations

from functools import cached_property

from pydantic import Field

from planner.base import Frozen
from planner.layered.plan import Plan


class LayoutError(ValueError):
    """A plan that cannot be laid out on ranks (numbers included)."""


class StageRanks(Frozen):
    pipeline: int = Field(ge=0, description="pipeline index in the plan")
    stage: int = Field(ge=0, description="stage index inside its pipeline")
    ranks: tuple[int, ...] = Field(min_length=1, description="global ranks of the TP group")
    devices: tuple[int, ...] = Field(min_length=1, description="plan device ids, same order as ranks")
    layer_start: int = Field(ge=0, description="first transformer layer held")
    layer_end: int = Field(ge=1, description="one past the last layer held")
    first: bool = Field(description="holds the embedding")
    last: bool = Field(description="holds the final norm and LM head")

    @property
    def tp(self) -> int:
        return len(self.ranks)

    @property
    def leader(self) -> int:
        """The rank that exchanges activations with the neighbouring stages."""
        return self.ranks[0]

    def units(self, num_layers: int) -> list[int]:
        """Parameter units held, in sync order (0 = embedding, i+1 = layer i, L+1 = head)."""
        held = [0] if self.first else []
        held += [i + 1 for i in range(self.layer_start, self.layer_end)]
        return held + ([num_layers + 1] if self.last else [])


class P2PPair(Frozen):
    pipeline: int = Field(ge=0, description="pipeline index")
    stage: int = Field(ge=0, description="index of the sending stage k (k → k+1)")
    src: int = Field(ge=0, description="leader rank of stage k")
    dst: int = Field(ge=0, description="leader rank of stage k+1")


class ChunkGroup(Frozen):
    """One finest-shard chunk of one parameter unit, synced by one rank per pipeline."""

    unit: int = Field(ge=0, description="0 = embedding, i+1 = layer i, L+1 = head")
    chunk: int = Field(ge=0, description="chunk index, 0 ≤ chunk < num_chunks")
    num_chunks: int = Field(ge=1, description="largest TP size among the unit's holders")
    ranks: tuple[int, ...] = Field(min_length=1, description="holder of this chunk in each pipeline")


class RankLayout(Frozen):
    num_layers: int = Field(ge=1, description="L, layers of every pipeline")
    num_pipelines: int = Field(ge=1, description="D, data-parallel replicas")
    stages: tuple[StageRanks, ...] = Field(description="every stage, in plan order")
    p2p: tuple[P2PPair, ...] = Field(description="leader pairs between consecutive stages")
    chunk_groups: tuple[ChunkGroup, ...] = Field(description="DP chunk groups, by unit then chunk")
    tied_groups: tuple[ChunkGroup, ...] = Field(
        default=(), description="tied embeddings: each chunk's holders among every first and last stage")

    @property
    def world_size(self) -> int:
        return sum(s.tp for s in self.stages)

    @cached_property
    def _stage_of_rank(self) -> dict[int, StageRanks]:
        return {r: s for s in self.stages for r in s.ranks}

    def stage_of(self, rank: int) -> StageRanks:
        if rank not in self._stage_of_rank:
            raise LayoutError(f"rank {rank} is outside the plan's world of {self.world_size} ranks")
        return self._stage_of_rank[rank]

    def device_of(self, rank: int) -> int:
        stage = self.stage_of(rank)
        return stage.devices[stage.ranks.index(rank)]

    def pipeline_stages(self, pipeline: int) -> list[StageRanks]:
        return [s for s in self.stages if s.pipeline == pipeline]

    def dp_group_keys(self) -> list[tuple[int, ...]]:
        """Distinct rank sets of the chunk groups (size > 1), in the one global sync order."""
        return sorted({g.ranks for g in self.chunk_groups if len(g.ranks) > 1})

    def tied_group_keys(self) -> list[tuple[int, ...]]:
        """Distinct rank sets of the tied groups (size > 1), in one global order."""
        return sorted({g.ranks for g in self.tied_groups if len(g.ranks) > 1})

    def tp_group_keys(self) -> list[tuple[int, ...]]:
        return [s.ranks for s in self.stages if s.tp > 1]


def _stage_ranks(plan: Plan) -> list[StageRanks]:
    stages, next_rank = [], 0
    for p, pipeline in enumerate(plan.pipelines):
        ranges = pipeline.layer_ranges()
        for k, stage in enumerate(pipeline.stages):
            ranks = tuple(range(next_rank, next_rank + stage.tp))
            next_rank += stage.tp
            stages.append(StageRanks(
                pipeline=p, stage=k, ranks=ranks, devices=stage.devices,
                layer_start=ranges[k][0], layer_end=ranges[k][1],
                first=k == 0, last=k == len(pipeline.stages) - 1))
    return stages


def _holders(stages: list[StageRanks], unit: int, num_layers: int, num_pipelines: int) -> list[StageRanks]:
    """The stage of each pipeline that holds `unit` (exactly one per pipeline)."""
    holders = [s for s in stages if unit in s.units(num_layers)]
    assert [s.pipeline for s in holders] == list(range(num_pipelines)), (unit, holders)
    return holders


def _chunk_groups(stages: list[StageRanks], num_layers: int, num_pipelines: int) -> list[ChunkGroup]:
    """Finest-shard chunks: a holder with TP t owns chunks j·(T/t) … (j+1)·(T/t)−1 on rank j,
    where T is the largest TP size among the unit's holders (TP sizes are powers of two)."""
    groups = []
    for unit in range(num_layers + 2):
        holders = _holders(stages, unit, num_layers, num_pipelines)
        finest = max(s.tp for s in holders)
        for chunk in range(finest):
            ranks = tuple(s.ranks[chunk // (finest // s.tp)] for s in holders)
            groups.append(ChunkGroup(unit=unit, chunk=chunk, num_chunks=finest, ranks=ranks))
    return groups


def _tied_groups(stages: list[StageRanks]) -> list[ChunkGroup]:
    """Tied embeddings (docs/cost-model.md §3.4): the embedding of every first stage and the
    head of every last stage are copies of one matrix, cut in vocabulary chunks of the finest
    shard among them; chunk c's group is every rank holding it (a stage that is both first and
    last counts once: it sums its two copies' gradients before the group's all-reduce)."""
    holders = [s for s in stages if s.first or s.last]
    finest = max(s.tp for s in holders)
    return [ChunkGroup(unit=0, chunk=c, num_chunks=finest,
                       ranks=tuple(sorted({s.ranks[c // (finest // s.tp)] for s in holders})))
            for c in range(finest)]


def _check_plan(plan: Plan) -> int:
    """Checks the layout needs (the validator checks the rest against a problem)."""
    layers = [p.layers for p in plan.pipelines]
    if len(set(layers)) != 1:
        raise LayoutError(f"pipelines hold different layer counts {layers}; each must hold all L layers")
    for p, pipeline in enumerate(plan.pipelines):
        for k, stage in enumerate(pipeline.stages):
            if stage.tp & (stage.tp - 1):
                raise LayoutError(f"pipeline {p} stage {k}: TP size {stage.tp} is not a power of two")
    devices = plan.devices
    if len(set(devices)) != len(devices):
        repeated = sorted({d for d in devices if devices.count(d) > 1})
        raise LayoutError(f"devices {repeated} are used by more than one stage")
    return layers[0]


def rank_layout(plan: Plan) -> RankLayout:
    """Every rank, group and pair the runtime needs for `plan` (pure; no processes)."""
    num_layers = _check_plan(plan)
    stages = _stage_ranks(plan)
    pairs = [P2PPair(pipeline=a.pipeline, stage=a.stage, src=a.leader, dst=b.leader)
             for a, b in zip(stages, stages[1:]) if a.pipeline == b.pipeline]
    return RankLayout(num_layers=num_layers, num_pipelines=len(plan.pipelines), stages=tuple(stages),
                      p2p=tuple(pairs), chunk_groups=tuple(_chunk_groups(stages, num_layers, len(plan.pipelines))),
                      tied_groups=tuple(_tied_groups(stages)))
