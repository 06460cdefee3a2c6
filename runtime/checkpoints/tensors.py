"""The tensor side of checkpoints (imports torch): a rank writes its chunks into the
checkpoint's partial folder; a rank of any later plan reads any region of any tensor back
from the chunks that overlap it (`ShardReader.region`). The format is in `runtime.checkpoints.manifest`.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

from runtime.checkpoints.manifest import CheckpointError, Manifest, commit, partial_dir


def write_shard(root: str | Path, step: int, rank: int, tensors: dict[str, torch.Tensor]) -> Path:
    """Write this rank's chunks to `rank<R>.pt` in the step's partial folder (fsynced)."""
    folder = partial_dir(root, step)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}.pt"
    with path.open("wb") as handle:
        torch.save({k: t.detach().cpu().contiguous() for k, t in tensors.items()}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return path


def save_step(*, root: str | Path, step: int, comm, tensors: dict[str, torch.Tensor],
              manifest: Callable[[], Manifest], failure=None) -> None:
    """Every rank with chunks (one replica's ranks: the others hold copies) writes them; after
    a barrier, rank 0 commits the step with `manifest()` (runtime.checkpoints.manifest: atomic rename).
    `failure` (tests only) may cut this rank's file mid-write first."""
    if failure and failure.strikes_saving(comm.rank, step - 1):
        failure.cut_write(partial_dir(root, step) / f"rank{comm.rank}.pt")
    if tensors:
        write_shard(root, step, comm.rank, tensors)
    comm.barrier()
    if comm.rank == 0:
        print(f"saved checkpoint {commit(root, manifest())}", flush=True)


def rng_state() -> dict[str, str]:
    return {"torch_cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}


def restore_rng(state: dict[str, str]) -> None:
    if "torch_cpu" in state:
        raw = bytearray(base64.b64decode(state["torch_cpu"]))
        torch.set_rng_state(torch.frombuffer(raw, dtype=torch.uint8).clone())


def _overlap(offsets, sizes, chunk_offsets, chunk_sizes) -> list[tuple[int, int]] | None:
    """Per dimension, the global [start, end) shared by the region and a chunk (None: disjoint)."""
    spans = []
    for start, size, c_start, c_size in zip(offsets, sizes, chunk_offsets, chunk_sizes):
        lo, hi = max(start, c_start), min(start + size, c_start + c_size)
        if lo >= hi:
            return None
        spans.append((lo, hi))
    return spans


class ShardReader:
    """Reads regions of a checkpoint's tensors; each shard file is loaded once, when needed."""

    def __init__(self, folder: Path, manifest: Manifest):
        self.folder, self.manifest, self._files = folder, manifest, {}

    def _file(self, name: str) -> dict[str, torch.Tensor]:
        if name not in self._files:
            try:
                self._files[name] = torch.load(self.folder / name, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any unreadable shard is named, in one line
                raise CheckpointError(f"{self.folder / name}: unreadable shard ({type(exc).__name__})") from None
        return self._files[name]

    def region(self, name: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
        """The block [offsets, offsets + sizes) of tensor `name`, assembled from its chunks."""
        entry = self.manifest.tensors.get(name)
        if entry is None:
            raise CheckpointError(f"{self.folder / 'manifest.json'}: no tensor {name!r} in the checkpoint")
        out = torch.empty(sizes, dtype=getattr(torch, entry.dtype))
        covered = 0
        for chunk in entry.chunks:
            spans = _overlap(offsets, sizes, chunk.offsets, chunk.sizes)
            if spans is None:
                continue
            source = self._file(chunk.file)[chunk.key]
            src = tuple(slice(lo - c, hi - c) for (lo, hi), c in zip(spans, chunk.offsets))
            dst = tuple(slice(lo - o, hi - o) for (lo, hi), o in zip(spans, offsets))
            out[dst] = source[src]
            covered += math.prod(hi - lo for lo, hi in spans)
        if covered != out.numel():
            raise CheckpointError(f"{self.folder}: the chunks of {name!r} do not cover the region "
                                  f"at {offsets} of size {sizes}")
        return out
