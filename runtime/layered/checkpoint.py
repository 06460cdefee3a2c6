"""A layered plan's shards ↔ the checkpoint's global tensors (imports torch).

Saving: the ranks of pipeline 0 hold one full copy of every tensor (every pipeline's
replicas are bit-identical after the gradient sync, which the runtime checks), so each of
them writes its TP slice of every parameter it holds, with both AdamW moments; a replicated
norm weight is written by TP rank 0 only. The chunk table is a pure function of the layout
(`saved_tensors`), so rank 0 writes the manifest without gathering anything.

Under ZeRO-1 (docs/checkpoints.md §11) no rank holds a whole replica's optimizer state: every
owner writes the rectangles of its block of each bucket (`zero.share_regions`), for the
weights (in bf16 from its fp32 master) and both moments, across all pipelines; still a pure
function of the layout. bf16 runs write their fp32 masters as `param/`: the weights a
checkpoint holds are always fp32.

Loading: every rank of any plan reads the region of each tensor its own TP slice covers,
whatever the TP size or layer split that wrote it — from a checkpoint, or from a Hugging Face
folder's safetensors (`init_rank`, the same regions through `HFReader`) — and its moments,
for its whole parameters or for its ZeRO-1 block, from whatever chunks wrote them: a run
saved under ZeRO-1 resumes under zero_stage 0 and another plan, and back. A tied head is the
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
from runtime.layered.optimizer import Slot, StageOptimizer
from runtime.layered.stage import StageModel
from runtime.layered.zero import local_region, share_regions, zero_active
from runtime.model.llama import model_tensors, stored_name, unit_params

KINDS = ("param", "adam_m", "adam_v")  # the weights (fp32) and AdamW's two moments


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


def written_regions(layout: RankLayout, spec: ModelSpec, rank: int, zero: bool) -> list[tuple[str, str, tuple, tuple]]:
    """(chunk key suffix, tensor name, offsets, sizes) of every rectangle `rank` writes:
    pipeline 0's TP slices, or under ZeRO-1 every owner's share (the tied head left out)."""
    if not zero:
        return [(name, name, offsets, sizes) for name, offsets, sizes in rank_regions(layout, spec, rank)]
    return [(f"{r.name}@{','.join(map(str, r.offsets))}", r.name, r.offsets, r.sizes)
            for r in share_regions(layout, spec, rank) if stored_name(spec, r.name) == r.name]


def saved_tensors(layout: RankLayout, spec: ModelSpec, zero_stage: int = 0) -> dict[str, TensorEntry]:
    """The manifest's tensor table: every tensor's full shape and its chunks' files."""
    chunks: dict[str, list[Chunk]] = {}
    shapes, zero = model_tensors(spec), zero_active(layout, zero_stage)
    for rank in range(layout.world_size):
        for suffix, name, offsets, sizes in written_regions(layout, spec, rank, zero):
            for kind in KINDS:
                chunks.setdefault(f"{kind}/{name}", []).append(
                    Chunk(file=f"rank{rank}.pt", key=f"{kind}/{suffix}", offsets=offsets, sizes=sizes))
    return {key: TensorEntry(shape=shapes[key.split("/", 1)[1]], chunks=tuple(c)) for key, c in chunks.items()}


def _slot_tensors(slot: Slot, weights: torch.Tensor, at: int, sizes: tuple, kinds) -> dict[str, torch.Tensor]:
    """The weights (fp32: the master where there is one) and moments of one rectangle of a slot."""
    sources = {"param": slot.master if slot.master is not None else weights, "adam_m": slot.m, "adam_v": slot.v}
    count = 1
    for size in sizes:
        count *= size
    return {kind: sources[kind].reshape(-1)[at:at + count].view(sizes).float() for kind in kinds}


def rank_tensors(model: StageModel, optimizer: StageOptimizer, groups: RankGroups,
                 moments: bool = True) -> dict[str, torch.Tensor]:
    """This rank's chunks, by checkpoint key (`moments` False: the weights alone)."""
    kinds, tensors = KINDS if moments else ("param",), {}
    if optimizer.zero:
        blocks = [s.master if s.master is not None else optimizer.pack(s.bucket, grads=False)[s.lo:s.hi]
                  for s in optimizer.slots]  # each block's fp32 weights
        for region in share_regions(groups.layout, model.spec, groups.rank):
            if stored_name(model.spec, region.name) != region.name:
                continue
            slot, weights = optimizer.slots[region.bucket], blocks[region.bucket]
            suffix = f"{region.name}@{','.join(map(str, region.offsets))}"
            for kind, tensor in _slot_tensors(slot, weights, region.at, region.sizes, kinds).items():
                tensors[f"{kind}/{suffix}"] = tensor
        return tensors
    for name, offsets, sizes in rank_regions(groups.layout, model.spec, groups.rank):
        slot = optimizer.slot_of(model.p(name))
        for kind, tensor in _slot_tensors(slot, slot.param.detach(), 0, sizes, kinds).items():
            tensors[f"{kind}/{name}"] = tensor
    return tensors


def build_manifest(job: Job, layout: RankLayout, step: int) -> Manifest:
    config = job.config
    batch = job.plan.global_batch
    settings = {"seq_len": config.seq_len, "seed": config.seed, "data": config.data_id, "global_batch": batch,
                "lr": config.lr, "weight_decay": config.weight_decay, "precision": config.precision,
                "zero_stage": config.zero_stage}
    return Manifest(step=step, data_position=step, sequences_seen=step * batch, rng=rng_state(),
                    plan_kind=job.kind, plan=job.plan.model_dump(mode="json"), problem_hash=job.problem_hash,
                    model=config.model, settings=settings,
                    tensors=saved_tensors(layout, config.model, config.zero_stage))


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


def checkpoint_reader(folder: str | Path) -> tuple[ShardReader, int]:
    """A reader of the checkpoint in `folder` and its step."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    return ShardReader(folder, manifest), manifest.step


def load_weights(reader: ShardReader, model: StageModel, groups: RankGroups) -> None:
    """This rank's slice of every weight (fp32), and the RNG state of the run that saved it."""
    load_params(reader, model, groups)
    restore_rng(reader.manifest.rng)


def load_moments(reader: ShardReader, step: int, model: StageModel, optimizer: StageOptimizer,
                 groups: RankGroups) -> None:
    """This rank's AdamW moments — of its whole parameters, or of its ZeRO-1 blocks — from
    whatever chunks any plan wrote; every slot's step count becomes the checkpoint's."""
    if not step:
        return
    if optimizer.zero:
        for region in share_regions(groups.layout, model.spec, groups.rank):
            slot, stored = optimizer.slots[region.bucket], stored_name(model.spec, region.name)
            for kind, target in (("adam_m", slot.m), ("adam_v", slot.v)):
                values = reader.region(f"{kind}/{stored}", region.offsets, region.sizes).reshape(-1)
                target[region.at:region.at + values.numel()] = values
    else:
        for name, param, offsets, sizes in rank_slices(model, groups):
            slot = optimizer.slot_of(param)
            slot.m.copy_(reader.region(f"adam_m/{name}", offsets, sizes))
            slot.v.copy_(reader.region(f"adam_v/{name}", offsets, sizes))
    for slot in optimizer.slots:
        slot.step.fill_(float(step))
