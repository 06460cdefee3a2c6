"""Training one rank of a sequence plan: the per-rank entry points that `runtime.launch.worker`
calls (see `runtime.runtime_kind`). Every exchange with other ranks goes through the
communicator passed in.

A step: for each of the replica's m_r = B_r/b micro-batches, this member's tokens of b
sequences (replica r reads sequences [Σ_{q<r} B_q, +B_r) of the step) go forward and
backward (ZeRO-3 gathers and reduce-scatters inside); then the cross-replica sync, then AdamW
on the blocks (element-wise, so AdamW on blocks equals AdamW on the full tensors).
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import torch

from runtime.checkpoints.manifest import clear_partials
from runtime.checkpoints.tensors import save_step
from runtime.communication.communicator import Communicator, RankPlace
from runtime.config import Job, RunConfig
from runtime.model.data import BatchLoader, eval_due, eval_loader, run_source
from runtime.errors import ConfigError
from runtime.metrics.loss import check_loss
from runtime.metrics.memory import current_mib, peak_mib
from runtime.failure import FailureInjection
from runtime.communication.packing import PackBuffers
from runtime.checkpoints.hf_weights import report_init, save_hf_folder
from runtime.sequence.checkpoint import build_manifest, init_rank, load_rank, rank_tensors
from runtime.sequence.attention import AttentionContext, sequence_attention
from runtime.sequence.clipping import clip_gradients
from runtime.sequence.groups import SeqGroups, create_groups
from runtime.sequence.job import run_violations
from runtime.sequence.layout import LayoutError, SeqLayout, seq_rank_layout
from runtime.sequence.member import MemberModel
from runtime.sequence.shards import sync_segments, unit_catalogues
from runtime.sequence.sync import replicas_identical, sync_gradients
from runtime.sequence.zero import ZeroStates
from runtime.metrics.progress import StepLines
from runtime.metrics.timing import HP, HP_KINDS, ZERO, ZERO_KINDS, PhaseTimer, device_synchronizer
from planner.base import plural

STEPS_FILE = "steps.jsonl"


def layout_of(job: Job) -> SeqLayout:
    return seq_rank_layout(job.plan, kv_heads=job.config.model.num_kv_heads)


def check_job(job: Job, world_size: int) -> None:
    config, plan = job.config, job.plan
    if world_size != len(plan.devices):
        raise ConfigError(f"the plan uses {plural(len(plan.devices), 'device')} (one process each) but the "
                          f"world has {world_size} processes")
    problems = run_violations(plan, config.model, config.seq_len)
    problems += [f"replica {r}: batch {rep.batch} is not a multiple of the micro-batch {config.micro_batch}"
                 for r, rep in enumerate(plan.replicas) if rep.batch % config.micro_batch]
    if problems:
        raise ConfigError("; ".join(problems))
    try:
        layout_of(job)
    except LayoutError as exc:
        raise ConfigError(str(exc)) from None


def plan_rank(job: Job, machine: int | None) -> int:
    """RANK from the local launcher; under torchrun, the LOCAL_RANK-th used device of machine I."""
    if machine is None:
        return int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    devices = sorted(d for d in job.plan.devices if d in set(job.cluster.devices_of(machine)))
    return job.plan.devices.index(devices[local])


def describe_rank(job: Job, rank: int) -> str:
    record = layout_of(job).rank(rank)
    return f"rank {rank} (replica {record.replica}, group {record.group}, member {record.member})"


def rank_places(job: Job) -> tuple[RankPlace, ...]:
    """Device, machine and vendor of every rank (vendor `other` without a cluster)."""
    devices, cluster = job.plan.devices, job.cluster
    if cluster is None:
        return tuple(RankPlace(device=d) for d in devices)
    machines = [int(cluster.machine_of_device[d]) for d in devices]
    return tuple(RankPlace(device=d, machine=m, vendor=cluster.gpu_of(m).vendor)
                 for d, m in zip(devices, machines))


def make_attention(layout: SeqLayout, comm: Communicator, groups: SeqGroups):
    """This member's attention: its rows of full causal attention over the sequence (Ulysses
    inside its group, the ring between groups; a one-member, one-group replica goes through
    the same function, whose exchanges are then empty)."""
    ctx = AttentionContext.build(layout=layout, rank=comm.rank, comm=comm, hp_group=groups.hp)
    return functools.partial(sequence_attention, ctx=ctx)


class Member:
    """This rank's model, optimizer and data: what a step needs."""

    def __init__(self, job: Job, comm: Communicator):
        config, self.job, self.comm = job.config, job, comm
        self.layout = layout_of(job)
        self.record = self.layout.rank(comm.rank)
        catalogues = unit_catalogues(config.model)
        replica_ranks = [r.ranks for r in self.layout.replicas]
        self.segments = sync_segments([c.size for c in catalogues], replica_ranks) if len(replica_ranks) > 1 else []
        self.groups = create_groups(self.layout, comm, self.segments)
        self.states = ZeroStates(catalogues, seed=config.seed, comm=comm, group=self.groups.replica,
                                 index=self.groups.replica_index).to(comm.device)
        self.positions = torch.as_tensor(self.layout.positions_of(comm.rank), dtype=torch.int64)
        self.model = MemberModel(config.model, self.states, make_attention(self.layout, comm, self.groups),
                                 positions=self.positions, seq_len=config.seq_len,
                                 recompute=config.recompute).to(comm.device)
        self.optimizer = torch.optim.AdamW(self.states.parameters(), lr=config.lr,
                                           weight_decay=config.weight_decay, foreach=False)
        self.global_batch = job.plan.global_batch
        self.loader = BatchLoader(run_source(config, self.global_batch), config.seq_len)
        self.buffers = PackBuffers()  # the gradient sync's, kept between steps
        self.setup_mib = current_mib(comm.device)  # model, optimizer, groups: before any step
        self.grad_norm: float | None = None  # the last step's before clipping (--clip-grad only)

    def micro_batches(self, step: int, loader: BatchLoader | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(tokens, labels) at this member's positions of each micro-batch of its replica."""
        plan, b, r = self.job.plan, self.job.config.micro_batch, self.record.replica
        offset = sum(rep.batch for rep in plan.replicas[:r])
        out = []
        for start in range(offset, offset + plan.replicas[r].batch, b):
            inputs, labels = (loader or self.loader).batch(step, start, b)
            out.append((inputs[:, self.positions].to(self.comm.device), labels[:, self.positions].to(self.comm.device)))
        return out

    def eval_loss(self, loader: BatchLoader) -> float:
        """The held-out loss (batch 0 of the eval stream, each replica its slice as in
        training): forward passes only, mean over its B·s targets, on every rank."""
        scale = 1.0 / (self.global_batch * self.job.config.seq_len)
        with torch.no_grad():
            share = sum(self.model(tokens, labels, scale).item() for tokens, labels in self.micro_batches(0, loader))
        total = torch.tensor([share], dtype=torch.float64, device=self.comm.device)
        return float(self.comm.all_reduce(total, self.comm.world).item())

    def step(self, step: int, failure: FailureInjection | None) -> torch.Tensor:
        """One optimizer step; returns [loss share, forward s, backward s, peak MiB above the
        setup, step s (micro-batches + gradient sync: what T prices, the optimizer left out),
        head-parallel all-to-all s and ZeRO-3 gather/scatter s (both inside forward and
        backward), bytes sent over the cross-vendor bridge (docs/vendors.md §8)] of this member."""
        scale = 1.0 / (self.global_batch * self.job.config.seq_len)
        collectives = PhaseTimer(synchronize=device_synchronizer(self.comm.device))
        self.comm.time_collectives(collectives, {HP: (self.groups.hp, HP_KINDS),
                                                 ZERO: (self.groups.replica, ZERO_KINDS)})
        bridge_start, step_start = self.comm.meter.sent, time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, forward_s, backward_s = 0.0, 0.0, 0.0
        for index, (tokens, labels) in enumerate(self.micro_batches(step)):
            if failure and index == 0 and failure.strikes(self.comm.rank, step):
                failure.strike(first=lambda: self.model(tokens, labels, scale))
            start = time.perf_counter()
            loss = self.model(tokens, labels, scale)
            middle = time.perf_counter()
            loss.backward()
            forward_s, backward_s = forward_s + middle - start, backward_s + time.perf_counter() - middle
            loss_sum += loss.item()
        sync_gradients(self.comm, self.groups, self.states, self.segments, self.buffers)
        step_s = time.perf_counter() - step_start
        self.grad_norm = clip_gradients(self.comm, self.states, self.record.replica, self.job.config.clip_grad)
        self.optimizer.step()
        peak = peak_mib(self.comm.device) - self.setup_mib
        bridge = self.comm.meter.sent - bridge_start
        return torch.tensor([loss_sum, forward_s, backward_s, peak, step_s, collectives.seconds(HP),
                             collectives.seconds(ZERO), bridge], dtype=torch.float64)


PER_RANK = 6  # forward s, backward s, peak MiB, step s, HP all-to-all s, ZeRO-3 s


def step_metrics(comm: Communicator, own: torch.Tensor) -> torch.Tensor:
    """[global loss, then forward s, backward s, peak MiB, step s, HP all-to-all s and ZeRO-3
    s of every rank, then the bytes sent over the bridge by all ranks]."""
    metrics = torch.zeros(1 + PER_RANK * comm.world_size + 1, dtype=torch.float64)
    metrics[0], metrics[-1] = own[0], own[-1]
    metrics[1 + PER_RANK * comm.rank:1 + PER_RANK * (comm.rank + 1)] = own[1:1 + PER_RANK]
    return comm.all_reduce(metrics.to(comm.device), comm.world).cpu()


def report_step(step: int, config: RunConfig, layout: SeqLayout, metrics: torch.Tensor, wall_s: float,
                global_batch: int, rank: int, held_out: float | None, grad_norm: float | None,
                lines: StepLines) -> dict:
    tokens_s = global_batch * config.seq_len / wall_s
    times = metrics[1:-1].view(-1, PER_RANK).tolist()
    record = {"step": step + 1, "loss": float(metrics[0]), "tokens_per_s": tokens_s, "wall_s": wall_s,
              "step_s": max(t[3] for t in times), "bridge_bytes": float(metrics[-1]),
              **({"eval_loss": held_out} if held_out is not None else {}),
              **({"grad_norm": grad_norm} if grad_norm is not None else {}),
              "members": [{"replica": r.replica, "group": r.group, "member": r.member, "device": r.device,
                           "tokens": r.num_tokens, "forward_s": f, "backward_s": b, "peak_mib": m,
                           "hp_s": hp, "zero_s": zero}
                          for r, (f, b, m, _, hp, zero) in zip(layout.ranks, times)]}
    if rank == 0 and config.out_dir:  # as it goes: a run cut short still shows its steps
        with (Path(config.out_dir) / STEPS_FILE).open("a") as handle:
            handle.write(json.dumps(record) + "\n")
    note = lines.note(record, step)
    if rank == 0 and note is not None:
        per_member = "  ".join(f"r{m['replica']}g{m['group']}m{m['member']} F {m['forward_s'] * 1e3:.0f}ms "
                               f"B {m['backward_s'] * 1e3:.0f}ms" for m in record["members"])
        print(f"step {step + 1}/{config.steps}  loss {record['loss']:.5f}{note}  "
              f"| {per_member}", flush=True)
    return record


def train(job: Job, comm: Communicator) -> None:
    config, member = job.config, Member(job, comm)
    failure, history, evaluator = FailureInjection.from_env(), [], eval_loader(config, member.global_batch)
    first = start_checkpoints(job, comm, member)
    lines = StepLines(config, first)
    for step in range(first, config.steps):
        start = time.perf_counter()
        own = member.step(step, failure)
        metrics = step_metrics(comm, own)
        check_loss(comm, step, float(metrics[0]), float(own[0]))
        wall_s = time.perf_counter() - start
        held_out = member.eval_loss(evaluator) if eval_due(config, step) else None
        history.append(report_step(step, config, member.layout, metrics, wall_s, member.global_batch, comm.rank,
                                   held_out, member.grad_norm, lines))
        if config.save_every and (step + 1) % config.save_every == 0:
            save_checkpoint(job, comm, member, step + 1, failure)
    finish(job, comm, member, history)


def start_checkpoints(job: Job, comm: Communicator, member: Member) -> int:
    """Rank 0 clears checkpoints cut mid-write; every rank loads its blocks of the resumed
    checkpoint (written by any plan). Returns the first step to run (0 without --resume)."""
    config = job.config
    if config.checkpoint_dir and comm.rank == 0:
        clear_partials(config.checkpoint_dir)
    first = load_rank(config.resume_from, member.states, member.optimizer) if config.resume_from else 0
    if comm.rank == 0 and config.resume_from:
        print(f"resumed from {config.resume_from} at step {first}", flush=True)
    if config.init_from and not config.resume_from:  # a resumed run's weights are the checkpoint's
        report_init(comm.rank, config.init_from, init_rank(config.init_from, member.states))
    comm.barrier()
    return first


def save_checkpoint(job: Job, comm: Communicator, member: Member, step: int,
                    failure: FailureInjection | None) -> None:
    """Replica 0's ranks write their chunks; once all have, rank 0 commits (runtime.checkpoints.manifest)."""
    save_step(root=job.config.checkpoint_dir, step=step, comm=comm, failure=failure,
              tensors=rank_tensors(member.states, member.optimizer, replica=member.record.replica),
              manifest=lambda: build_manifest(job, member.layout, step))


def finish(job: Job, comm: Communicator, member: Member, history: list[dict]) -> None:
    """Replica check, parameter dump and metrics file (the worker then leaves the world)."""
    config, rank = job.config, comm.rank
    replicas_ok = (replicas_identical(comm, member.groups, member.states, member.segments)
                   if config.check_replicas else None)
    out = Path(config.out_dir) if config.out_dir else None
    if out and config.dump_params:
        torch.save({"replica": member.record.replica, "pieces": member.states.rank_pieces(),
                    "shapes": {n: s for c in member.states.catalogues for n, (s, _) in c.params.items()}},
                   out / f"rank{rank}.pt")
    if config.save_hf:
        save_hf_folder(config.save_hf, config.steps, comm,
                       rank_tensors(member.states, None, replica=member.record.replica),
                       lambda: build_manifest(job, member.layout, config.steps), config.save_dtype)
    if rank == 0 and out:
        (out / "metrics.json").write_text(json.dumps({"steps": history, "replicas_identical": replicas_ok}))
    if rank == 0 and replicas_ok is not None:
        print(f"parameter segments identical across their owners in every replica: {replicas_ok}", flush=True)


def load_replica_params(out_dir: str | Path) -> list[dict[str, torch.Tensor]]:
    """Each replica's full parameters, reassembled from its ranks' dumped pieces."""
    flats: dict[int, dict[str, torch.Tensor]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(Path(out_dir).glob("rank*.pt")):
        dump = torch.load(path)
        shapes.update(dump["shapes"])
        for name, (offset, values) in dump["pieces"].items():
            full = flats.setdefault(dump["replica"], {}).setdefault(
                name, torch.full((torch.Size(dump["shapes"][name]).numel(),), float("nan")))
            full[offset:offset + values.numel()] = values
    return [{name: flat.view(shapes[name]) for name, flat in flats[r].items()} for r in sorted(flats)]
