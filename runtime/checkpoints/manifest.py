"""Plan-independent checkpoints (docs/checkpoints.md §10): the format, its manifest, and its checks.

A checkpoint is one folder `step-NNNNNNNN` under the checkpoint directory:

    manifest.json      format tag, step, data position, RNG state, the plan, the problem's
                       hash, the model and the settings that fix the numbers, every tensor
                       (name, full shape, dtype, chunks with global offsets) and every file
                       (size in bytes, sha256)
    rank<R>.pt         the chunks rank R wrote: {key: tensor}, one tensor per chunk

Tensors are named by what they are, never by where they lived: `param/<name>`,
`adam_m/<name>`, `adam_v/<name>` for the weights and AdamW's two moments (the optimizer's
step count is the manifest's `step`). Each chunk names its file, its key there, and its
global `offsets` and `sizes` in the full tensor, so a plan with any TP sizes, layer split or
batch split reads exactly the region it holds (`runtime.checkpoints.tensors.ShardReader`).

Writes are atomic: ranks write into `.partial-step-NNNNNNNN`; once every rank is done, rank 0
hashes the files, writes the manifest (temporary name, then rename) and renames the folder
to `step-NNNNNNNN`. A checkpoint cut mid-write is therefore a `.partial-*` folder, which
readers ignore: the newest complete one is used. A complete checkpoint whose file is later
missing or damaged (size or sha256 not the manifest's), whose manifest's step is not its
folder's, or whose chunks do not tile their tensors is a `CheckpointError` naming the file.
A commit that lacks a file its chunks name (written on another machine into a folder that is
not shared) or whose `step-NNNNNNNN` is already there is refused, and nothing is committed.
No torch here (`runtime.checkpoints.tensors` does the tensor I/O).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from math import prod
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from planner.base import Frozen
from planner.workload import ModelSpec
from runtime.errors import RunError
from runtime.hashing import file_sha256

FORMAT = "hexiscale.checkpoint/1"
MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step-(\d{8})$")
PARTIAL_PREFIX = ".partial-step-"
# the settings a resumed run must share with the checkpoint to continue the same numbers
PINNED_SETTINGS = ("seq_len", "seed", "data", "global_batch")


class CheckpointError(RunError):
    """A checkpoint that cannot be used; the message names the file and what is wrong."""


class Chunk(Frozen):
    file: str = Field(description="file in the checkpoint folder")
    key: str = Field(description="key of the chunk's tensor in that file")
    offsets: tuple[int, ...] = Field(description="global offset of the chunk in each dimension")
    sizes: tuple[int, ...] = Field(description="the chunk's size in each dimension")


class TensorEntry(Frozen):
    shape: tuple[int, ...] = Field(description="full (unsharded) shape")
    dtype: str = Field(default="float32", description="torch dtype name")
    chunks: tuple[Chunk, ...] = Field(min_length=1, description="chunks that tile the tensor")


class FileEntry(Frozen):
    bytes: int = Field(ge=0, description="file size")
    sha256: str = Field(description="hex digest of the file's bytes")


class Manifest(Frozen):
    format: str = Field(default=FORMAT, description="file format tag")
    step: int = Field(ge=0, description="optimizer steps done (also AdamW's step count)")
    data_position: int = Field(ge=0, description="the next step's index: step t reads batch t of the stream")
    sequences_seen: int = Field(ge=0, description="sequences trained on so far (step · B)")
    rng: dict[str, str] = Field(default_factory=dict, description="torch RNG state (base64) of rank 0")
    plan_kind: str = Field(description="kind of the plan that wrote it")
    plan: dict[str, Any] = Field(description="the plan that wrote it")
    problem_hash: str = Field(default="", description="sha256 of the problem the plan was run for")
    model: ModelSpec = Field(description="the model trained")
    settings: dict[str, Any] = Field(description="seq_len, seed, data, global_batch, lr, weight_decay")
    tensors: dict[str, TensorEntry] = Field(description="every tensor by name")
    files: dict[str, FileEntry] = Field(default_factory=dict, description="every shard file")


def problem_hash(problem) -> str:
    """sha256 of the problem's canonical JSON (cluster, model, training)."""
    return hashlib.sha256(problem.model_dump_json().encode()).hexdigest()


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def partial_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PARTIAL_PREFIX}{step:08d}"


def complete_steps(root: str | Path) -> list[int]:
    """Steps of the complete checkpoints under `root` (folder renamed, manifest present)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := STEP_DIR.match(p.name))
                  and (p / MANIFEST).is_file())


def incomplete_steps(root: str | Path) -> list[int]:
    """Steps of what is named like a checkpoint under `root` but holds no manifest (one deleted,
    a folder made by hand): readers pass over them, and a save of that step cannot rename its
    partial folder there."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := STEP_DIR.match(p.name))
                  and not (p / MANIFEST).is_file())


def saved_steps(first: int, steps: int, save_every: int) -> range:
    """The steps a run from step `first` to `steps` saves: every `save_every`-th (as the
    workers do: after step s when s % save_every == 0). A range, not a list: --steps 10^13 had
    looped over every step before the run started (10 minutes silent)."""
    if not save_every:
        return range(0)
    return range((first // save_every + 1) * save_every, steps + 1, save_every)


def sha256_of(path: Path) -> str:
    return file_sha256(path)


def _invalid(exc: ValidationError) -> str:
    """The first field a manifest gets wrong, named ('{}' said only 'Field required')."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else error["msg"]


def read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    try:
        manifest = Manifest.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError) as exc:
        reason = _invalid(exc) if isinstance(exc, ValidationError) else str(exc).splitlines()[0]
        raise CheckpointError(f"{path}: not a readable checkpoint manifest ({reason})") from None
    if manifest.format != FORMAT:
        raise CheckpointError(f"{path}: format {manifest.format!r}, expected {FORMAT!r}")
    named = STEP_DIR.match(folder.name)  # an edited step would resume at the wrong data and Adam step
    if named and int(named.group(1)) != manifest.step:
        raise CheckpointError(f"{path}: says step {manifest.step}, but its folder {folder.name} is step "
                              f"{int(named.group(1))}")
    return manifest


def chunk_files(manifest: Manifest) -> set[str]:
    """The files the manifest's chunks are read from."""
    return {c.file for t in manifest.tensors.values() for c in t.chunks}


def _where(chunk: Chunk) -> str:
    return f"{chunk.file}[{chunk.key!r}] at {chunk.offsets} of size {chunk.sizes}"


def overlapping_pair(chunks: tuple[Chunk, ...]) -> tuple[Chunk, Chunk] | None:
    """Two chunks that share an element, or None. A sweep along the first dimension: each chunk
    is compared only with those whose rows reach its first row, so row slabs (TP row splits,
    ZeRO rectangles) cost about n log n rather than n² comparisons."""
    active: list[Chunk] = []
    for chunk in sorted(chunks, key=lambda c: c.offsets):
        active = [a for a in active if a.offsets[0] + a.sizes[0] > chunk.offsets[0]]
        for other in active:
            if all(max(x, y) < min(x + s, y + t)
                   for x, s, y, t in zip(other.offsets, other.sizes, chunk.offsets, chunk.sizes)):
                return other, chunk
        active.append(chunk)
    return None


def tiling_error(entry: TensorEntry) -> str | None:
    """Why a tensor's chunks do not tile its shape exactly (None: they do), from the
    manifest's numbers alone: each chunk inside the shape, no two overlapping, and their sizes
    adding up to the whole. A chunk moved by an edit fails here, before any process starts."""
    for chunk in entry.chunks:
        if not len(chunk.offsets) == len(chunk.sizes) == len(entry.shape):
            return f"chunk {_where(chunk)} does not have the tensor's {len(entry.shape)} dimensions"
        if any(o < 0 or s < 1 or o + s > n for o, s, n in zip(chunk.offsets, chunk.sizes, entry.shape)):
            return f"chunk {_where(chunk)} lies outside the tensor's shape {entry.shape}"
    if pair := overlapping_pair(entry.chunks):
        return f"chunks {_where(pair[0])} and {_where(pair[1])} overlap"
    if (covered := sum(prod(c.sizes) for c in entry.chunks)) != prod(entry.shape):
        return f"its chunks cover {covered} of its {prod(entry.shape)} elements"
    return None


def verify(folder: Path, manifest: Manifest) -> None:
    """The manifest's chunks tile every tensor from files it lists (its numbers alone, checked
    first: cheap), and every file it lists is there, with its size and its sha256."""
    missing = chunk_files(manifest) - set(manifest.files)
    if missing:
        raise CheckpointError(f"{folder / MANIFEST}: chunks name files it does not list: {sorted(missing)}")
    for name, entry in manifest.tensors.items():
        if (why := tiling_error(entry)) is not None:
            raise CheckpointError(f"{folder / MANIFEST}: tensor {name!r}: {why}")
    for name, entry in manifest.files.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: shard file missing")
        size = path.stat().st_size
        if size != entry.bytes:
            raise CheckpointError(f"{path}: shard has {size} bytes, the manifest says {entry.bytes}")
        if sha256_of(path) != entry.sha256:
            raise CheckpointError(f"{path}: shard checksum differs from the manifest (sha256)")


def latest_checkpoint(root: str | Path, use: str = "resumed by naming it (--resume {folder})") -> tuple[Path, Manifest]:
    """The newest complete checkpoint under `root`, verified (partial ones are skipped). A
    damaged newest one is not passed over for an older one (that would redo steps silently):
    the error names the older one, and how to `use` it by its own folder ({folder} in it)."""
    root = Path(root)
    folder, older = _newest(root)
    if folder is None:
        raise CheckpointError(f"{root}: no complete checkpoint there")
    try:
        manifest = read_manifest(folder)
        verify(folder, manifest)
    except CheckpointError as exc:
        if not older:
            raise
        older_dir = step_dir(root, older[-1])
        raise CheckpointError(f"{exc}; the older checkpoint {older_dir} can be {use.format(folder=older_dir)}") \
            from None
    return folder, manifest


def _newest(root: Path) -> tuple[Path | None, list[int]]:
    """The newest complete checkpoint's folder under `root` (`root` itself when it is one;
    None: none there) and the older complete steps."""
    if (root / MANIFEST).is_file():  # the path of one checkpoint folder
        return root, []
    steps = complete_steps(root)
    return (step_dir(root, steps[-1]), steps[:-1]) if steps else (None, [])


def newest_manifest(root: str | Path) -> tuple[Path, Manifest] | None:
    """The newest complete checkpoint's folder and manifest under `root`, not verified: a quick
    look before long work (None where there is none, or its manifest does not read: the
    resume itself says why)."""
    folder, _ = _newest(Path(root))
    if folder is None:
        return None
    try:
        return folder, read_manifest(folder)
    except CheckpointError:
        return None


def check_resumable(manifest: Manifest, folder: Path, model: ModelSpec, settings: dict[str, Any]) -> None:
    """The resumed run trains the checkpoint's model with the settings that fix its numbers."""
    if manifest.model.model_dump(exclude={"name"}) != model.model_dump(exclude={"name"}):
        raise CheckpointError(f"{folder / MANIFEST}: the checkpoint's model {manifest.model.name!r} "
                              f"differs from this run's {model.name!r}")
    for name in PINNED_SETTINGS:
        if name in manifest.settings and manifest.settings[name] != settings.get(name):
            raise CheckpointError(f"{folder / MANIFEST}: the checkpoint was trained with {name} "
                                  f"{manifest.settings[name]!r}, this run has {settings.get(name)!r}")


def commit(root: str | Path, manifest: Manifest) -> Path:
    """Rank 0, once every rank has written its file: hash the files, write the manifest
    (temporary name, then rename), then rename the folder into place. Refused, with nothing
    committed, when a file the chunks name is not in the partial folder (ranks on another
    machine wrote into a folder that is not shared) or the step's folder is already there."""
    partial, final = partial_dir(root, manifest.step), step_dir(root, manifest.step)
    # the files the chunks name, each looked up by name (a listing of a shared folder may lag)
    files = {p.name: FileEntry(bytes=p.stat().st_size, sha256=sha256_of(p))
             for p in (partial / name for name in sorted(chunk_files(manifest))) if p.is_file()}
    if missing := sorted(chunk_files(manifest) - set(files)):
        raise CheckpointError(f"{partial}: {', '.join(missing)} missing, written by ranks that do not see this folder: "
                              f"the checkpoint folder must be one folder shared by every machine (the same path on "
                              f"each, e.g. NFS); step {manifest.step} is not committed")
    if final.exists():  # os.rename would fail on a non-empty folder (or replace an empty one silently)
        raise CheckpointError(f"{final}: already there (without a manifest: not a checkpoint); step "
                              f"{manifest.step} is not committed over it")
    text = manifest.model_copy(update={"files": files}).model_dump_json(indent=1)
    temporary = partial / (MANIFEST + ".tmp")
    with temporary.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, partial / MANIFEST)
    os.rename(partial, final)
    return final


def clear_partials(root: str | Path) -> None:
    """Remove the folders of checkpoints cut mid-write (rank 0, before any rank writes)."""
    import shutil

    root = Path(root)
    for path in root.glob(PARTIAL_PREFIX + "*") if root.is_dir() else ():
        shutil.rmtree(path, ignore_errors=True)
