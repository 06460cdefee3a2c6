"""A sequence plan's ZeRO-3 blocks ↔ the checkpoint's global tensors (imports torch); the
format is the plan-independent one of `runtime.checkpoints.manifest`.

A rank's block of a unit is a range of the unit's flat vector, so of each parameter it
holds a range of the row-major flattening: at most three rectangles of the full tensor (a
partial first row, whole rows, a partial last row — `flat_regions`). Those rectangles are
the chunks, with global offsets and sizes like any other plan's, so a layered plan reads
them with `ShardReader.region`, and a sequence plan reads any plan's chunks the same way.

Saving: replica 0's ranks write (every replica is bit-identical after the sync, which the
runtime checks): each its rectangles of every parameter and both AdamW moments. The chunk
table is a pure function of the layout (`saved_tensors`), so nothing is gathered.
"""

from __future__ import annotations

from pathlib import Path

import torch

from planner.workload import ModelSpec
from runtime.checkpoints.hf_weights import HFReader
from runtime.checkpoints.manifest import Chunk, Manifest, TensorEntry, read_manifest
from runtime.checkpoints.regions import Region, flat_regions  # noqa: F401 (Region re-exported)
from runtime.checkpoints.tensors import ShardReader, restore_rng, rng_state
from runtime.config import Job
from runtime.sequence.layout import SeqLayout
from runtime.sequence.shards import UnitCatalogue, block_span, unit_catalogues
from runtime.sequence.zero import ZeroStates

KINDS = {"param": None, "adam_m": "exp_avg", "adam_v": "exp_avg_sq"}  # kind → AdamW state key


def rank_pieces(catalogues: list[UnitCatalogue], *, parts: int, index: int):
    """(unit, name, full shape, region, offset of the region in the block) of every rectangle
    that block `index` of `parts` holds."""
    out = []
    for catalogue in catalogues:
        start, stop = block_span(catalogue.size, parts, index)
        for name, (shape, (lo, hi)) in catalogue.params.items():
            a, b = max(lo, start), min(hi, stop)
            for region in flat_regions(shape, a - lo, b - lo) if a < b else ():
                out.append((catalogue.unit, name, shape, region, lo + region[2] - start))
    return out


def saved_tensors(layout: SeqLayout, spec: ModelSpec) -> dict[str, TensorEntry]:
    """The manifest's tensor table: replica 0's rectangles, by tensor name and kind."""
    chunks: dict[str, list[Chunk]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    ranks = layout.replicas[0].ranks
    for index, rank in enumerate(ranks):
        for _, name, shape, (offsets, sizes, lo, _), _ in rank_pieces(unit_catalogues(spec), parts=len(ranks), index=index):
            shapes[name] = shape
            for kind in KINDS:
                key = f"{kind}/{name}"
                chunks.setdefault(key, []).append(Chunk(file=f"rank{rank}.pt", key=f"{key}@{lo}",
                                                        offsets=offsets, sizes=sizes))
    return {key: TensorEntry(shape=shapes[key.split("/", 1)[1]], chunks=tuple(c)) for key, c in chunks.items()}


def rank_tensors(states: ZeroStates, optimizer: torch.optim.Optimizer | None, *,
                 replica: int) -> dict[str, torch.Tensor]:
    """This rank's chunks by their key in its file (none outside replica 0; the weights
    alone without an optimizer)."""
    if replica != 0:
        return {}
    tensors = {}
    for unit, name, _, (_, sizes, lo, hi), at in rank_pieces(states.catalogues, parts=states.parts,
                                                             index=states.index):
        block = states.blocks[unit]
        for kind, key in KINDS.items() if optimizer is not None else [("param", None)]:
            source = block.detach() if key is None else optimizer.state[block][key]
            tensors[f"{kind}/{name}@{lo}"] = source[at:at + hi - lo].reshape(sizes)
    return tensors


def build_manifest(job: Job, layout: SeqLayout, step: int) -> Manifest:
    config, batch = job.config, job.plan.global_batch
    settings = {"seq_len": config.seq_len, "seed": config.seed, "data": config.data_id, "global_batch": batch,
                "lr": config.lr, "weight_decay": config.weight_decay}
    return Manifest(step=step, data_position=step, sequences_seen=step * batch, rng=rng_state(),
                    plan_kind=job.kind, plan=job.plan.model_dump(mode="json"), problem_hash=job.problem_hash,
                    model=config.model, settings=settings, tensors=saved_tensors(layout, config.model))


def load_params(reader, states: ZeroStates) -> None:
    """This rank's blocks of the weights from `reader` (a checkpoint's or a model folder's)."""
    for unit, name, _, (offsets, sizes, lo, hi), at in rank_pieces(states.catalogues, parts=states.parts,
                                                                   index=states.index):
        with torch.no_grad():
            states.blocks[unit][at:at + hi - lo] = reader.region(f"param/{name}", offsets, sizes).flatten()


def init_rank(folder: str | Path, states: ZeroStates) -> int:
    """This rank's blocks of the weights from a Hugging Face folder (lazy slices: the
    rectangles of its blocks only); returns the bytes read."""
    reader = HFReader(folder)
    load_params(reader, states)
    return reader.bytes_read


def load_rank(folder: str | Path, states: ZeroStates, optimizer: torch.optim.Optimizer) -> int:
    """Fill this rank's blocks (weights and AdamW moments) from any plan's checkpoint;
    returns the step to resume at."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    reader = ShardReader(folder, manifest)
    load_params(reader, states)
    moments = {unit: {key: torch.zeros_like(block) for key in KINDS.values() if key}
               for unit, block in enumerate(states.blocks)}
    for unit, name, _, (offsets, sizes, lo, hi), at in rank_pieces(states.catalogues, parts=states.parts,
                                                                   index=states.index):
        for kind, key in KINDS.items():
            if key and manifest.step:
                moments[unit][key][at:at + hi - lo] = reader.region(f"{kind}/{name}", offsets, sizes).flatten()
    if manifest.step:
        for unit, block in enumerate(states.blocks):
            optimizer.state[block] = {"step": torch.tensor(float(manifest.step)), **moments[unit]}
    restore_rng(manifest.rng)
    return manifest.step
