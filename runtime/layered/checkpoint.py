"""A layered plan's shards ↔ the checkpoint's global tensors (imports torch).

Saving: the ranks of pipeline 0 hold one full copy of every tensor (every pipeline's
replicas are bit-identical after the gradient sync, which the runtime checks), so each of
them writes its TP slice of every parameter it holds, with both AdamW moments; a replicated
norm weight is written by TP rank 0 only. The chunk table is a pure function of the layout
(`saved_tensors`), so rank 0 writes the manifest without gathering anything.

Loading: every rank of any plan reads the region of each tensor its own TP slice covers,
whatever the TP size or layer split that wrote it — from a checkpoint, or from a Hugging Face
folder's safetensors (`init_rank`, the same regions through `HFReader`). A tied head is the
embedding: it is written once (by the first stage) and read from the embedding's tensor.
"""

from __future__ import annotations

from pathlib import Path

import torch

from planner.workload import ModelSpec
from runtime.checkpoints.hf_weights import HFReader
from runtime.checkpoints.manifest import Chunk, Manifest, TensorEntry, read_manifest
from runtime.checkpoints.tensors import ShardReader, restore_rng, rng_state
from runtime.config import Job
from runtime.layered.groups import RankGroups
from runtime.layered.layout import RankLayout
from runtime.layered.stage import StageModel
from runtime.model.llama import model_tensors, stored_name, unit_params

# checkpoint tensor kind → AdamW state key (None: the parameter itself)
KINDS = {"param": None, "adam_m": "exp_avg", "adam_v": "exp_avg_sq"}


def local_region(shape: tuple[int, ...], dim: int | None, tp_rank: int, tp: int) -> tuple[tuple, tuple]:
    """Global (offsets, sizes) of TP rank `tp_rank`'s contiguous block along `dim`."""
    offsets, sizes = [0] * len(shape), list(shape)
    if dim is not None and tp > 1:
        sizes[dim] = shape[dim] // tp
        offsets[dim] = tp_rank * sizes[dim]
    return tuple(offsets), tuple(sizes)


def rank_regions(layout: RankLayout, spec: ModelSpec, rank: int) -> list[tuple[str, tuple, tuple]]:
    """(parameter name, offsets, sizes) of every chunk `rank` writes (none off pipeline 0)."""
    stage = layout.stage_of(rank)
    if stage.pipeline != 0:
        return []
    tp_rank, regions = stage.ranks.index(rank), []
    for unit in stage.units(spec.layers):
        for name, (shape, dim) in unit_params(spec, unit).items():
            if (dim is None and tp_rank) or stored_name(spec, name) != name:
                continue
            regions.append((name, *local_region(shape, dim, tp_rank, stage.tp)))
    return regions


def saved_tensors(layout: RankLayout, spec: ModelSpec) -> dict[str, TensorEntry]:
    """The manifest's tensor table: every tensor's full shape and its chunks' files."""
    chunks: dict[str, list[Chunk]] = {}
    shapes = model_tensors(spec)
    for rank in range(layout.world_size):
        for name, offsets, sizes in rank_regions(layout, spec, rank):
            for kind in KINDS:
                key = f"{kind}/{name}"
                chunks.setdefault(key, []).append(Chunk(file=f"rank{rank}.pt", key=key, offsets=offsets, sizes=sizes))
    return {key: TensorEntry(shape=shapes[key.split("/", 1)[1]], chunks=tuple(c)) for key, c in chunks.items()}


def rank_tensors(model: StageModel, optimizer: torch.optim.Optimizer | None, groups: RankGroups) -> dict[str, torch.Tensor]:
    """This rank's chunks, by checkpoint key (the weights alone without an optimizer)."""
    tensors = {}
    for name, _, _ in rank_regions(groups.layout, model.spec, groups.rank):
        param = model.p(name)
        for kind, key in KINDS.items() if optimizer is not None else [("param", None)]:
            tensors[f"{kind}/{name}"] = param.detach() if key is None else optimizer.state[param][key]
    return tensors


def build_manifest(job: Job, layout: RankLayout, step: int) -> Manifest:
    config = job.config
    batch = job.plan.global_batch
    settings = {"seq_len": config.seq_len, "seed": config.seed, "data": config.data_id, "global_batch": batch,
                "lr": config.lr, "weight_decay": config.weight_decay}
    return Manifest(step=step, data_position=step, sequences_seen=step * batch, rng=rng_state(),
                    plan_kind=job.kind, plan=job.plan.model_dump(mode="json"), problem_hash=job.problem_hash,
                    model=config.model, settings=settings, tensors=saved_tensors(layout, config.model))


def rank_slices(model: StageModel, groups: RankGroups):
    """(stored tensor name, local parameter, offsets, sizes) of every parameter this rank holds."""
    shapes = model_tensors(model.spec)
    for unit in groups.stage.units(model.spec.layers):
        for name, param, dim in model.unit_shards(unit):
            stored = stored_name(model.spec, name)
            yield (stored, param, *local_region(shapes[stored], dim, groups.tp_rank, groups.stage.tp))


def load_params(reader, model: StageModel, groups: RankGroups) -> None:
    """This rank's slice of every weight from `reader` (a checkpoint's or a model folder's)."""
    with torch.no_grad():
        for name, param, offsets, sizes in rank_slices(model, groups):
            param.copy_(reader.region(f"param/{name}", offsets, sizes))


def init_rank(folder: str | Path, model: StageModel, groups: RankGroups) -> int:
    """The weights from a Hugging Face folder (lazy slices: this rank's bytes only); returns
    the bytes read."""
    reader = HFReader(folder)
    load_params(reader, model, groups)
    return reader.bytes_read


def load_rank(folder: str | Path, model: StageModel, optimizer: torch.optim.Optimizer, groups: RankGroups) -> int:
    """Load this rank's slice of every weight and AdamW moment; returns the step to resume at."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    reader = ShardReader(folder, manifest)
    load_params(reader, model, groups)
    step = torch.tensor(float(manifest.step))
    for name, param, offsets, sizes in rank_slices(model, groups) if manifest.step else ():
        optimizer.state[param] = {"step": step.clone(), **{
            key: reader.region(f"{kind}/{name}", offsets, sizes).to(param.device)
            for kind, key in KINDS.items() if key is not None}}
    restore_rng(manifest.rng)
    return manifest.step
