"""Training one rank of a layered plan: the per-rank entry points that `runtime.launch.worker`
calls (see `runtime.runtime_kind`). Every exchange with other ranks goes through the
communicator passed in.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch

from planner.schedules import get_schedule
from runtime.communication.communicator import Communicator, RankPlace
from runtime.config import Job, RunConfig, check_model_fits, check_sequence_parallel
from runtime.model.data import BatchLoader, eval_due, eval_loader, run_source
from runtime.errors import ConfigError
from runtime.metrics.loss import check_loss
from runtime.failure import FailureInjection
from runtime.checkpoints.manifest import clear_partials
from runtime.checkpoints.tensors import save_step
from runtime.checkpoints.hf_weights import report_init, save_hf_folder
from runtime.layered.checkpoint import (build_manifest, checkpoint_reader, init_rank, load_moments, load_weights,
                                        rank_tensors)
from runtime.layered.grad_sync import replicas_identical, sync_gradients
from runtime.layered.groups import RankGroups, create_groups
from runtime.layered.layout import RankLayout, rank_layout
from runtime.layered.optimizer import StageOptimizer
from runtime.layered.schedule import StepRunner, make_link
from runtime.precision import scheme_line
from runtime.layered.stage import StageModel
from runtime.communication.packing import PackBuffers
from runtime.layered.clipping import clip_gradients
from runtime.metrics.memory import peak_mib, reset_peak
from runtime.metrics.progress import StepLines
from runtime.metrics.timing import STAGE_PHASES, STEP, SYNC, TP, TP_KINDS, PhaseTimer, device_synchronizer
from planner.base import plural

STEPS_FILE = "steps.jsonl"


def check_job(job: Job, world_size: int) -> None:
    layout, config = rank_layout(job.plan), job.config
    if world_size != layout.world_size:
        raise ConfigError(f"the plan uses {plural(layout.world_size, 'device')} (one process each) but the "
                          f"world has {world_size} processes")
    try:
        check_model_fits(config.model, [s.tp for s in layout.stages])
        check_sequence_parallel(config.seq_len, config.sequence_parallel, [s.tp for s in layout.stages])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def plan_rank(job: Job, machine: int | None) -> int:
    """RANK from the local launcher; under torchrun, the LOCAL_RANK-th used device of machine I."""
    if machine is None:
        return int(os.environ["RANK"])
    layout, local = rank_layout(job.plan), int(os.environ["LOCAL_RANK"])
    devices = sorted(d for d in job.plan.devices if d in set(job.cluster.devices_of(machine)))
    return next(s.ranks[s.devices.index(devices[local])] for s in layout.stages if devices[local] in s.devices)


def describe_rank(job: Job, rank: int) -> str:
    stage = rank_layout(job.plan).stage_of(rank)
    return f"rank {rank} (pipeline {stage.pipeline}, stage {stage.stage})"


def rank_places(job: Job) -> tuple[RankPlace, ...]:
    """Device, machine and vendor of every rank (vendor `other` without a cluster)."""
    layout, cluster = rank_layout(job.plan), job.cluster
    devices = [layout.device_of(rank) for rank in range(layout.world_size)]
    if cluster is None:
        return tuple(RankPlace(device=d) for d in devices)
    machines = [int(cluster.machine_of_device[d]) for d in devices]
    return tuple(RankPlace(device=d, machine=m, vendor=cluster.gpu_of(m).vendor)
                 for d, m in zip(devices, machines))


def micro_batches(job: Job, pipeline: int, step: int, loader: BatchLoader, device) -> list:
    """(inputs, labels) of each micro-batch of this pipeline's slice of the global batch."""
    offset = sum(p.batch for p in job.plan.pipelines[:pipeline])
    b = job.config.micro_batch
    batches = []
    for start in range(offset, offset + job.plan.pipelines[pipeline].batch, b):
        inputs, labels = loader.batch(step, start, b)
        batches.append((inputs.to(device), labels.to(device)))
    return batches


def step_metrics(comm: Communicator, runner: StepRunner, groups: RankGroups, bridge_bytes: int = 0,
                 peak: float = math.nan) -> torch.Tensor:
    """[global loss, then each stage's seconds per phase (STAGE_PHASES), then each rank's step
    seconds, then each rank's peak MiB (NaN off a GPU), then the bytes sent over the
    cross-vendor bridge in the step], summed over ranks: each stage's leader contributes its
    own phases, every rank its step time, peak and bridge bytes, last-stage leaders their loss
    share."""
    layout, stage, phases, world = groups.layout, groups.stage, len(STAGE_PHASES), groups.layout.world_size
    metrics = torch.zeros(1 + phases * len(layout.stages) + 2 * world + 1, dtype=torch.float64)
    metrics[-1] = bridge_bytes
    if groups.is_leader:
        index = layout.stages.index(stage)
        metrics[1 + phases * index: 1 + phases * (index + 1)] = torch.tensor(
            [runner.timer.seconds(name) for name in STAGE_PHASES], dtype=torch.float64)
        if stage.last:
            metrics[0] = runner.loss_sum
    per_rank = 1 + phases * len(layout.stages)
    metrics[per_rank + comm.rank] = runner.timer.seconds(STEP)
    metrics[per_rank + world + comm.rank] = peak
    return comm.all_reduce(metrics.to(comm.device), comm.world).cpu()


def step_peak_mib(device: torch.device) -> float:
    """The GPU allocator's peak over the step (reset at its start, read after the optimizer):
    what §3.5 prices; NaN on CPU, whose resident set holds torch too and cannot be reset."""
    return peak_mib(device) if device.type == "cuda" else math.nan


def build_stage(job: Job, comm: Communicator, groups: RankGroups) -> StageModel:
    config = job.config
    return StageModel(config.model, groups.stage, groups.tp_rank, groups.tp, config.seq_len, config.seed,
                      config.recompute, comm=comm, sequence_parallel=config.sequence_parallel).to(comm.device)


def train(job: Job, comm: Communicator) -> None:
    config, layout, rank = job.config, rank_layout(job.plan), comm.rank
    groups = create_groups(layout, comm, tied=config.model.tied_embeddings)
    model = build_stage(job, comm, groups)
    global_batch = job.plan.global_batch
    loader, evaluator = BatchLoader(run_source(config, global_batch), config.seq_len), eval_loader(config, global_batch)
    shape = (config.micro_batch, config.seq_len, config.model.hidden)
    schedule, failure, history = get_schedule(config.schedule), FailureInjection.from_env(), []
    first, optimizer = start_checkpoints(job, comm, model, groups)
    lines = StepLines(config, first)
    buffers = PackBuffers()  # the gradient sync's, kept between steps
    for step in range(first, config.steps):
        start = time.perf_counter()
        reset_peak(comm.device)
        optimizer.zero_grad(set_to_none=True)
        timer = PhaseTimer(synchronize=device_synchronizer(comm.device))
        comm.time_collectives(timer, {TP: (groups.tp, TP_KINDS)})
        runner = StepRunner(model, make_link(comm, groups, model, shape),
                            micro_batches(job, groups.stage.pipeline, step, loader, comm.device),
                            1.0 / (global_batch * config.seq_len), timer)
        if failure and failure.strikes(rank, step):
            failure.strike(first=lambda: runner.forward(0))
        bridge_start = comm.meter.sent  # what the step sends over the vendor bridge (§8)
        with timer.phase(STEP):  # what the cost model's T prices: the schedule and the sync
            runner.run(schedule)
            with timer.phase(SYNC):
                sync_gradients(comm, model, groups, buffers, optimizer)
        grad_norm = clip_gradients(comm, model, groups, config.clip_grad, optimizer)
        optimizer.step(comm, timer)  # ZeRO-1: its all-gather is timed in the step and its sync
        metrics = step_metrics(comm, runner, groups, comm.meter.sent - bridge_start, step_peak_mib(comm.device))
        check_loss(comm, step, float(metrics[0]), runner.loss_sum if groups.is_leader and groups.stage.last else 0.0)
        wall_s = time.perf_counter() - start
        held_out = eval_loss(job, comm, model, groups, evaluator, shape) if eval_due(config, step) else None
        history.append(report_step(step, config, layout, metrics, wall_s, global_batch, rank, held_out,
                                   grad_norm, lines))
        if config.save_every and (step + 1) % config.save_every == 0:
            save_checkpoint(job, comm, model, optimizer, groups, step + 1, failure)
    finish(job, comm, model, optimizer, groups, history)


def eval_loss(job: Job, comm: Communicator, model: StageModel, groups: RankGroups, loader: BatchLoader,
              shape: tuple[int, ...]) -> float:
    """The held-out loss (batch 0 of the eval stream, each pipeline its slice as in training):
    forward passes only, mean over its B·s targets, the same number on every rank."""
    scale = 1.0 / (job.plan.global_batch * job.config.seq_len)
    runner = StepRunner(model, make_link(comm, groups, model, shape),
                        micro_batches(job, groups.stage.pipeline, 0, loader, comm.device), scale)
    with torch.no_grad():
        for index in range(len(runner.micro_batches)):
            runner.forward(index)
            runner.saved.clear()
        runner.link.finish()
    share = runner.loss_sum if groups.is_leader and groups.stage.last else 0.0
    return float(comm.all_reduce(torch.tensor([share], dtype=torch.float64, device=comm.device), comm.world).item())


def report_step(step: int, config: RunConfig, layout: RankLayout, metrics: torch.Tensor,
                wall_s: float, global_batch: int, rank: int, held_out: float | None, grad_norm: float | None,
                lines: StepLines) -> dict:
    tokens_s = global_batch * config.seq_len / wall_s
    phases, world = len(STAGE_PHASES), layout.world_size
    per_stage = metrics[1: 1 + phases * len(layout.stages)].view(-1, phases).tolist()
    times = [(values[0], values[1]) for values in per_stage]
    per_rank = 1 + phases * len(layout.stages)
    peaks = metrics[per_rank + world: per_rank + 2 * world].tolist()
    record = {"step": step + 1, "loss": float(metrics[0]), "tokens_per_s": tokens_s, "wall_s": wall_s,
              "step_s": float(metrics[per_rank: per_rank + world].max()),
              "bridge_bytes": float(metrics[-1]), **({"eval_loss": held_out} if held_out is not None else {}),
              **({"grad_norm": grad_norm} if grad_norm is not None else {}),
              "stages": [{"pipeline": s.pipeline, "stage": s.stage,
                          **{f"{name}_s": value for name, value in zip(STAGE_PHASES, values)},
                          **stage_peak(s, peaks)}
                         for s, values in zip(layout.stages, per_stage)]}
    if rank == 0 and config.out_dir:  # as it goes: a run cut short still shows its steps
        with (Path(config.out_dir) / STEPS_FILE).open("a") as handle:
            handle.write(json.dumps(record) + "\n")
    note = lines.note(record, step)
    if rank == 0 and note is not None:
        per_stage = "  ".join(f"p{s.pipeline}s{s.stage} F {f * 1e3:.0f}ms B {b * 1e3:.0f}ms"
                              for s, (f, b) in zip(layout.stages, times))
        print(f"step {step + 1}/{config.steps}  loss {record['loss']:.5f}{note}  "
              f"| {per_stage}", flush=True)
    return record


def stage_peak(stage, peaks: list[float]) -> dict:
    """{"peak_mib": the largest of the stage's ranks' step peaks} on a GPU; {} on CPU."""
    values = [peaks[rank] for rank in stage.ranks]
    return {} if any(math.isnan(v) for v in values) else {"peak_mib": max(values)}


def start_checkpoints(job: Job, comm: Communicator, model: StageModel,
                      groups: RankGroups) -> tuple[int, StageOptimizer]:
    """Rank 0 clears checkpoints cut mid-write; every rank loads the resumed checkpoint's
    slices (or a model folder's weights), in fp32; then the optimizer takes its masters from
    them and the model goes to the run's precision. Returns the first step to run (0 without
    --resume) and the optimizer."""
    config = job.config
    if config.checkpoint_dir and comm.rank == 0:
        clear_partials(config.checkpoint_dir)
    reader, first = checkpoint_reader(config.resume_from) if config.resume_from else (None, 0)
    if reader is not None:
        load_weights(reader, model, groups)
    if comm.rank == 0 and config.resume_from:
        print(f"resumed from {config.resume_from} at step {first}", flush=True)
    if config.init_from and not config.resume_from:  # a resumed run's weights are the checkpoint's
        report_init(comm.rank, config.init_from, init_rank(config.init_from, model, groups))
    optimizer = StageOptimizer(model, groups, config)
    if reader is not None:
        load_moments(reader, first, model, optimizer, groups)
    optimizer.cast_model()
    if comm.rank == 0:
        print(scheme_line(config, groups.layout.num_pipelines), flush=True)
    comm.barrier()
    return first, optimizer


def save_checkpoint(job: Job, comm: Communicator, model: StageModel, optimizer, groups: RankGroups,
                    step: int, failure: FailureInjection | None) -> None:
    """Pipeline 0's ranks write their chunks; once all have, rank 0 commits (runtime.checkpoints.manifest)."""
    save_step(root=job.config.checkpoint_dir, step=step, comm=comm, failure=failure,
              tensors=rank_tensors(model, optimizer, groups), manifest=lambda: build_manifest(job, groups.layout, step))


def check_replicas(comm: Communicator, model: StageModel, groups: RankGroups) -> bool:
    """True on every rank iff every rank's replicas are identical (`replicas_identical`)."""
    ok = torch.tensor([1 if replicas_identical(comm, model, groups) else 0], device=comm.device)
    return bool(comm.all_reduce(ok, comm.world, "min").item())


def dump_params(path: Path, model: StageModel, optimizer: StageOptimizer, groups: RankGroups,
                num_layers: int) -> None:
    """This rank's weights (as held: bf16 ones read as fp32) and the bytes of training state
    it holds (`StageOptimizer.held_bytes`, what tests compare with §3.5's W_σ)."""
    shards = {name: (param.detach().float().cpu(), dim)
              for unit in groups.stage.units(num_layers) for name, param, dim in model.unit_shards(unit)}
    torch.save({"pipeline": groups.stage.pipeline, "tp_rank": groups.tp_rank, "tp": groups.tp_size,
                "params": shards, "held_bytes": optimizer.held_bytes()}, path)


def finish(job: Job, comm: Communicator, model: StageModel, optimizer: StageOptimizer, groups: RankGroups,
           history: list[dict]) -> None:
    """Replica check, parameter dump and metrics file (the worker then leaves the group)."""
    config, rank = job.config, comm.rank
    replicas_ok = check_replicas(comm, model, groups) if config.check_replicas else None
    out = Path(config.out_dir) if config.out_dir else None
    if out and config.dump_params:
        dump_params(out / f"rank{rank}.pt", model, optimizer, groups, config.model.layers)
    if config.save_hf:
        save_hf_folder(config.save_hf, config.steps, comm, rank_tensors(model, optimizer, groups, moments=False),
                       lambda: build_manifest(job, groups.layout, config.steps), config.save_dtype)
    if rank == 0 and out:
        (out / "metrics.json").write_text(json.dumps({"steps": history, "replicas_identical": replicas_ok}))
    if rank == 0 and replicas_ok is not None:
        print(f"replicas identical across pipelines and TP groups: {replicas_ok}", flush=True)
