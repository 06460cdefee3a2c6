"""What the evaluator of sequence plans returns: the iteration time with every part of
docs/sequence-plans.md §7.2 per member, group and replica, and the memory of §7.3 per device."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from planner.base import Frozen
from planner.headline import Headline


class MemberEstimate(Frozen):
    replica: int = Field(ge=0)
    group: int = Field(ge=0, description="ring position g of the member's group")
    index: int = Field(ge=0, description="position inside the group (token order)")
    device: int = Field(ge=0)
    machine: str = Field(description="machine holding the device")
    heads: int = Field(ge=1)
    tokens: int = Field(ge=1, description="t_i")
    kv_heads: float = Field(ge=0, description="kv_i = heads_i·k/a")
    linear_s: float = Field(ge=0, description="Clin_i per layer and micro-batch")
    attention_s: float = Field(ge=0, description="Catt_i per layer and micro-batch")
    ring_s: float = Field(ge=0, description="ring_i per layer and micro-batch (one pass)")
    head_s: float = Field(ge=0, description="Chead_i per micro-batch")
    states_gib: float = Field(ge=0, description="μ·P_total/N_r")
    gathered_gib: float = Field(ge=0, description="2·β·max(P_layer, P_head)")
    activations_gib: float = Field(ge=0, description="kept layer inputs and one layer's working set")
    ring_buffers_gib: float = Field(ge=0, description="2·b·T_max·2·kv_i·d·β")
    logits_gib: float = Field(ge=0, description="4·b·t_i·V")
    memory_gib: float = Field(ge=0, description="the sum with the reserve R")
    capacity_gib: float = Field(gt=0)
    headroom_gib: float = Field(description="capacity − memory; negative means out of memory")


class GroupEstimate(Frozen):
    replica: int = Field(ge=0)
    index: int = Field(ge=0, description="g, ring position")
    tokens: int = Field(ge=1, description="T_g")
    first_token: int = Field(ge=0, description="x_g: the shard is [x_g, x_g+T_g/2) ∪ [s−x_g−T_g/2, s−x_g)")
    pairs: float = Field(ge=0, description="causal pairs ℓ_g·(s+1)")
    hp_bw_gbps: float | None = Field(description="bw_g, smallest between two members (None: one member)")
    hp_lat_s: float = Field(ge=0, description="α_g")
    a2a_qkv_s: float = Field(ge=0, description="qkv exchange per layer and micro-batch")
    a2a_out_s: float = Field(ge=0, description="output exchange per layer and micro-batch")
    a2a_s: float = Field(ge=0, description="a2a_g = the sum of the two")
    ring_bw_gbps: float = Field(gt=0, description="bw_{g−1,g} from the previous group")
    ring_lat_s: float = Field(ge=0, description="lat_{g−1,g}")
    ring_s: float = Field(ge=0, description="max ring_i of the group's members")
    members: tuple[MemberEstimate, ...]


class ReplicaEstimate(Frozen):
    index: int = Field(ge=0)
    batch: int = Field(ge=1, description="B_r")
    micro_batches: int = Field(ge=1, description="m_r")
    devices: int = Field(ge=1, description="N_r")
    linear_s: float = Field(ge=0, description="max_i Clin_i")
    a2a_s: float = Field(ge=0, description="r_a2a·max_g a2a_g")
    attention_s: float = Field(ge=0, description="max_i Catt_i")
    ring_s: float = Field(ge=0, description="ρ·T_ring")
    layer_s: float = Field(ge=0, description="T_layer")
    zero_bw_gbps: float | None = Field(description="bw_r, smallest between two devices (None: one device)")
    zero_layer_s: float = Field(ge=0, description="Z_layer")
    zero_ends_s: float = Field(ge=0, description="Z_ends per micro-batch")
    head_s: float = Field(ge=0, description="max_i Chead_i")
    micro_batch_s: float = Field(ge=0, description="T_mb = L·(T_layer + Z_layer) + max Chead + Z_ends")
    time_s: float = Field(ge=0, description="T_rep = m_r·T_mb")
    groups: tuple[GroupEstimate, ...]


BottleneckKind = Literal["linear_compute", "attention_compute", "head_parallel", "context_parallel",
                         "zero", "lm_head", "data_parallel"]


class Bottleneck(Frozen):
    kind: BottleneckKind
    replica: int | None = Field(default=None, description="replica of the limiting term")
    group: int | None = Field(default=None, description="ring position of the limiting group")
    member: int | None = Field(default=None, description="position of the limiting member in its group")
    seconds: float = Field(ge=0, description="the term's share of the iteration time")
    description: str


class SeqEstimate(Headline):
    replica_s: float = Field(ge=0, description="max_r T_rep")
    dp_s: float = Field(ge=0, description="T_dp")
    dp_bw_gbps: float | None = Field(description="bw_x between replicas (None: one replica)")
    min_headroom_gib: float = Field(description="smallest headroom over every used device")
    replicas: tuple[ReplicaEstimate, ...]
    bottleneck: Bottleneck

    @property
    def groups(self) -> list[GroupEstimate]:
        return [g for r in self.replicas for g in r.groups]

    @property
    def members(self) -> list[MemberEstimate]:
        return [m for g in self.groups for m in g.members]
