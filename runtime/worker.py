"""Per-rank entry point: `python -m runtime.worker JOB.json [--machine I]`.

Reads the job (plan + run settings), finds its place in the rank layout, joins the process
group, trains its stage for the configured steps, and reports. Any failure — a bad
configuration, a peer that died, a collective that timed out — prints one line naming this
rank and the cause, and ends the process with a non-zero code at once, which in turn makes
its peers' pending collectives fail fast: the run never hangs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from runtime.config import Job, RunConfig, check_model_fits
from runtime.data import BatchLoader, make_source
from runtime.grad_sync import replicas_identical, sync_gradients
from runtime.groups import RankGroups, create_groups
from runtime.layout import RankLayout, rank_layout
from runtime.schedule import StageLink, StepRunner
from runtime.stage import StageModel

EXIT_FAILED, EXIT_CONFIG = 1, 2


class ConfigError(ValueError):
    """The job cannot run as configured (world size, TP vs heads, ...)."""


def check_job(layout: RankLayout, config: RunConfig, world_size: int) -> None:
    if world_size != layout.world_size:
        raise ConfigError(f"the plan uses {layout.world_size} devices (one process each) but the "
                          f"world has {world_size} processes")
    try:
        check_model_fits(config.model, [s.tp for s in layout.stages])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def micro_batches(job: Job, pipeline: int, step: int, loader: BatchLoader, device) -> list:
    """(inputs, labels) of each micro-batch of this pipeline's slice of the global batch."""
    offset = sum(p.batch for p in job.plan.pipelines[:pipeline])
    b = job.config.micro_batch
    batches = []
    for start in range(offset, offset + job.plan.pipelines[pipeline].batch, b):
        inputs, labels = loader.batch(step, start, b)
        batches.append((inputs.to(device), labels.to(device)))
    return batches


def step_metrics(runner: StepRunner, groups: RankGroups, device) -> torch.Tensor:
    """[global loss, then forward and backward seconds of every stage], summed over ranks:
    each stage's leader contributes its own times; last-stage leaders their loss share."""
    layout, stage = groups.layout, groups.stage
    metrics = torch.zeros(1 + 2 * len(layout.stages), dtype=torch.float64)
    if groups.is_leader:
        index = layout.stages.index(stage)
        metrics[1 + 2 * index] = runner.times.forward_s
        metrics[2 + 2 * index] = runner.times.backward_s
        if stage.last:
            metrics[0] = runner.loss_sum
    metrics = metrics.to(device)
    dist.all_reduce(metrics)
    return metrics.cpu()


def train(job: Job, rank: int, device: torch.device) -> None:
    config, layout = job.config, rank_layout(job.plan)
    groups = create_groups(layout, rank, config.timeout_s)
    stage = groups.stage
    model = StageModel(config.model, stage, groups.tp_rank, groups.tp, config.seq_len, config.seed,
                       config.recompute).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                  foreach=False)
    loader = BatchLoader(make_source(config.data, config.model.vocab, config.seed), config.seq_len)
    global_batch = sum(p.batch for p in job.plan.pipelines)
    shape = (config.micro_batch, config.seq_len, config.model.hidden)
    history = []
    for step in range(config.steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        runner = StepRunner(model, StageLink.of(groups, shape, config.timeout_s, device),
                            micro_batches(job, stage.pipeline, step, loader, device),
                            1.0 / (global_batch * config.seq_len))
        if rank == config.fail_rank and step == config.fail_step:
            fail_mid_step(runner, config.fail_mode)
        runner.run(config.schedule)
        sync_gradients(model, groups)
        optimizer.step()
        metrics = step_metrics(runner, groups, device)
        history.append(report_step(step, config, layout, metrics, time.perf_counter() - start,
                                   global_batch, rank))
    finish(job, model, groups, history, rank, device)


def fail_mid_step(runner: StepRunner, mode: str) -> None:
    """Test hook: after one forward, die without a goodbye or stop answering for good."""
    runner.forward(0)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        time.sleep(60)


def report_step(step: int, config: RunConfig, layout: RankLayout, metrics: torch.Tensor,
                wall_s: float, global_batch: int, rank: int) -> dict:
    tokens_s = global_batch * config.seq_len / wall_s
    times = metrics[1:].view(-1, 2).tolist()
    record = {"step": step + 1, "loss": float(metrics[0]), "tokens_per_s": tokens_s, "wall_s": wall_s,
              "stages": [{"pipeline": s.pipeline, "stage": s.stage, "forward_s": f, "backward_s": b}
                         for s, (f, b) in zip(layout.stages, times)]}
    if rank == 0:
        per_stage = "  ".join(f"p{s.pipeline}s{s.stage} F {f * 1e3:.0f}ms B {b * 1e3:.0f}ms"
                              for s, (f, b) in zip(layout.stages, times))
        print(f"step {step + 1}/{config.steps}  loss {record['loss']:.5f}  tokens/s {tokens_s:,.0f}  "
              f"| {per_stage}", flush=True)
    return record


def finish(job: Job, model: StageModel, groups: RankGroups, history: list[dict], rank: int,
           device: torch.device) -> None:
    """Replica check, parameter dump and metrics file; then leave the group cleanly."""
    config = job.config
    replicas_ok = None
    if config.check_replicas:
        ok = torch.tensor([1 if replicas_identical(model, groups) else 0], device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        replicas_ok = bool(ok.item())
    out = Path(config.out_dir) if config.out_dir else None
    if out and config.dump_params:
        shards = {name: (param.detach().cpu(), dim)
                  for unit in groups.stage.units(config.model.layers)
                  for name, param, dim in model.unit_shards(unit)}
        torch.save({"pipeline": groups.stage.pipeline, "tp_rank": groups.tp_rank, "tp": groups.tp_size,
                    "params": shards}, out / f"rank{rank}.pt")
    if rank == 0 and out:
        (out / "metrics.json").write_text(json.dumps({"steps": history, "replicas_identical": replicas_ok}))
    if rank == 0 and replicas_ok is not None:
        print(f"replicas identical across pipelines and TP groups: {replicas_ok}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def plan_rank(layout: RankLayout, job: Job, machine: int | None) -> int:
    """RANK from the local launcher; under torchrun, the LOCAL_RANK-th used device of machine I."""
    if machine is None:
        return int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    devices = sorted(d for d in job.plan.devices if d in set(job.config.machine_devices[machine]))
    return next(s.ranks[s.devices.index(devices[local])] for s in layout.stages if devices[local] in s.devices)


def spawned_entry(job_path: str, env: dict[str, str], log_path: str, echo: bool, threads: int) -> None:
    """Entry of a process started by the local launcher (forked from a server that has
    already imported torch, so a start costs milliseconds, not an import)."""
    os.environ.update(env)
    torch.set_num_threads(threads)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 2)
    if not echo:
        os.dup2(log, 1)
    sys.exit(main([job_path]))


def short_reason(exc: BaseException) -> str:
    """One line: gloo's messages lose their source-file prefix and boilerplate advice."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = re.sub(r"^\[[^\]]*\.cc:\d+\]\s*", "", text).split(". This is typically")[0]
    if "by peer" in text:
        text = f"a peer process died or closed its connection: {text}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def main(argv: list[str]) -> int:
    job = Job.model_validate_json(Path(argv[0]).read_text())
    machine = int(argv[argv.index("--machine") + 1]) if "--machine" in argv else None
    layout, config = rank_layout(job.plan), job.config
    rank = plan_rank(layout, job, machine)
    world_size = int(os.environ.get("HEXISCALE_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    where = f"rank {rank}"
    try:
        check_job(layout, config, world_size)
        stage = layout.stage_of(rank)
        where = f"rank {rank} (pipeline {stage.pipeline}, stage {stage.stage})"
        device = torch.device("cpu")
        if config.backend == "nccl":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        dist.init_process_group(config.backend, init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                                f"{os.environ['HEXISCALE_PORT']}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=config.timeout_s))
        train(job, rank, device)
    except ConfigError as exc:
        print(f"error: {where}: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_CONFIG)
    except BaseException as exc:  # noqa: BLE001 - any failure must end this rank, not hang it
        print(f"error: {where}: stopping after a failure in the run ({short_reason(exc)})",
              file=sys.stderr, flush=True)
        os._exit(EXIT_FAILED)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
