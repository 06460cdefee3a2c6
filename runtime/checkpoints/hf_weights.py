"""Hugging Face safetensors in and out (imports torch; docs/models-and-data.md §12).

In: `HFReader.region` reads the block a rank holds of one tensor through safetensors' lazy
slices (`safe_open(...).get_slice(name)[...]`): only those bytes are read from the file, and
the rank never holds the whole tensor, let alone the whole file. It answers the same
`region(key, offsets, sizes)` as a checkpoint's `ShardReader`, so a plan of either kind fills
its parameters from a model folder exactly as it resumes from a checkpoint.

Out: `write_hf_folder` writes config.json, every other file of the source folder except the
weights and their index (the tokenizer's among them), and model.safetensors (or shards of at
most `max_shard_bytes` with model.safetensors.index.json) under transformers' names; a tied
head is not written (transformers ties it to the embedding on loading). Every file is staged
first and config.json published last (`staged_save`): an interrupted save never passes for a
whole one. The source folder's
config.json must still say what the trained model is (an edited one is refused); a folder that
is gone is said, with what the export lacks; the weight files of an earlier save that this one
does not write over are removed, and said. `export_checkpoint` converts a plan-independent
checkpoint (any plan, either kind) the same way.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from math import prod
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from planner.hf_config import HFConfigError, config_differences, read_config, read_hf_model
from planner.workload import ModelSpec
from runtime.checkpoints.hf_names import INDEX, SINGLE, HFWeights, hf_name
from runtime.checkpoints.manifest import CheckpointError, commit, latest_checkpoint
from runtime.checkpoints.staged_save import PARAMS_FOLDER, publish, remove_partial_saves, staging_folder
from runtime.checkpoints.tensors import ShardReader, write_shard
from runtime.model.llama import model_tensors

SAVE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the weight files and indexes transformers loads from a folder (an earlier save's are removed)
STALE_WEIGHTS = re.compile(r"(model|pytorch_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)"
                           r"|(model\.safetensors|pytorch_model\.bin)\.index\.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
WEIGHT_INDEXES = (INDEX, "pytorch_model.bin.index.json")
MAX_SHARD_BYTES = 5 * 2**30


class HFReader:
    """Regions of a model folder's tensors as fp32, by runtime name (`param/<name>` keys, as a
    checkpoint's ShardReader); `bytes_read` counts what the slices asked of the files."""

    def __init__(self, folder: str | Path):
        self.weights, self._open, self.bytes_read = HFWeights(folder), {}, 0

    def _file(self, path: Path):
        if path not in self._open:
            self._open[path] = safe_open(str(path), framework="pt")
        return self._open[path]

    def region(self, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
        name = hf_name(key.removeprefix("param/"))
        if name not in self.weights.file_of:
            raise CheckpointError(f"{self.weights.folder}: tensor {name} is missing")
        part = self._file(self.weights.file_of[name]).get_slice(name)
        block = part[tuple(slice(o, o + n) for o, n in zip(offsets, sizes))]
        self.bytes_read += block.numel() * block.element_size()
        return block.to(torch.float32)


def folder_config(spec: ModelSpec) -> dict | None:
    """The model folder's config.json as it is now (None: no folder, or no config.json there),
    refused when a field the model holds says otherwise than the trained model: the folder
    may have been edited since, and its config would make transformers load another model."""
    if not spec.hf_folder or not (Path(spec.hf_folder) / "config.json").is_file():
        return None
    try:
        now = read_hf_model(spec.hf_folder)
        file, config = read_config(spec.hf_folder)
    except HFConfigError as exc:
        raise CheckpointError(f"{exc} (the model folder's config, which the export would copy)") from None
    for key, there, trained in config_differences(now, spec)[:1]:
        raise CheckpointError(f"{file}: {key}: {there} there, but the trained model has {trained} (the folder "
                              "changed since): its config.json would describe another model")
    return config


def config_of(spec: ModelSpec, dtype: str, log: Callable[[str], None] = print) -> dict:
    """config.json of the model: the source folder's (its dtype set to the one written), or,
    for a model of no folder, a Llama (Qwen2 with q/k/v biases) config of its sizes; a folder
    that is gone is said in one line, with what the export then lacks."""
    config = folder_config(spec)
    if config is not None:
        config.update({key: dtype for key in ("dtype", "torch_dtype") if key in config} or {"dtype": dtype})
        return config
    if spec.hf_folder:
        gone = not Path(spec.hf_folder).is_dir()
        log(f"note: the model's folder {spec.hf_folder} {'is gone' if gone else 'has no config.json'}: the export's "
            "config.json is made from the model's sizes, without eos_token_id or any other field of the original"
            + (", and the export has none of the folder's other files (tokenizer, generation_config.json)"
               if gone else ""))
    if not spec.gated:
        raise CheckpointError(f"model {spec.name!r} has a plain MLP: no Hugging Face Llama layout holds it")
    kind = "qwen2" if spec.qkv_bias else "llama"
    return {"architectures": ["Qwen2ForCausalLM" if spec.qkv_bias else "LlamaForCausalLM"], "model_type": kind,
            "num_hidden_layers": spec.layers, "hidden_size": spec.hidden, "num_attention_heads": spec.heads,
            "num_key_value_heads": spec.num_kv_heads, "intermediate_size": spec.ffn_hidden,
            "vocab_size": spec.vocab, "hidden_act": "silu", "rms_norm_eps": spec.norm_eps,
            "rope_theta": spec.rope_theta, "tie_word_embeddings": spec.tied_embeddings, "dtype": dtype}


def copy_other_files(source: Path, out: Path) -> None:
    """Every file of the source folder but its weights, their index and config.json."""
    for path in sorted(source.iterdir()):
        if (path.is_file() and not path.name.startswith(".") and path.name != "config.json"
                and not path.name.endswith(WEIGHT_SUFFIXES) and path.name not in WEIGHT_INDEXES):
            shutil.copy2(path, out / path.name)


def shard_plan(spec: ModelSpec, itemsize: int, max_shard_bytes: int) -> list[list[str]]:
    """Runtime tensor names in file order, cut into shards of at most max_shard_bytes."""
    shards, size = [[]], 0
    for name, shape in model_tensors(spec).items():
        nbytes = prod(shape) * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards, size = shards + [[]], 0
        shards[-1].append(name)
        size += nbytes
    return shards


def stale_weights(out: Path, written: list[str]) -> list[Path]:
    """The weight files of an earlier save that this one does not write over (removed when it
    is published, and said): transformers loads model.safetensors before an index, and an index
    names its own shards, so a left-over one would be loaded instead of the new weights
    (save_pretrained removes its stale shards likewise)."""
    return sorted(p for p in out.iterdir() if p.is_file() and STALE_WEIGHTS.fullmatch(p.name) and p.name not in written)


def write_hf_folder(out: str | Path, spec: ModelSpec, full_tensor: Callable[[str], torch.Tensor],
                    dtype: str = "float32", max_shard_bytes: int = MAX_SHARD_BYTES,
                    log: Callable[[str], None] = print) -> Path:
    """The model in the Hugging Face layout; `full_tensor(name)` gives each whole tensor (one
    shard's tensors are in memory at a time); `log` hears what is removed or missing."""
    out, torch_dtype = Path(out), SAVE_DTYPES[dtype]
    if spec.hf_folder and out.resolve() == Path(spec.hf_folder).resolve():
        raise CheckpointError(f"{out}: the model's own folder (its config.json and tokenizer are read from it): "
                              "write to another folder")
    config = config_of(spec, dtype, log)
    shards = shard_plan(spec, torch_dtype.itemsize, max_shard_bytes)
    files = [SINGLE] if len(shards) == 1 else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                                               for i in range(len(shards))]
    out.mkdir(parents=True, exist_ok=True)
    remove_partial_saves(out, log, params=False)  # (run --save-hf's chunks are being read: theirs to remove)
    staging = staging_folder(out)
    try:
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if spec.hf_folder and Path(spec.hf_folder).is_dir():
            copy_other_files(Path(spec.hf_folder), staging)
        write_weights(staging, files, shards, full_tensor, torch_dtype)
        stale = stale_weights(out, files + ([INDEX] if len(files) > 1 else []))
        publish(staging, out, stale)
    finally:  # stopped or refused: the staged files go, and `out` is as it was
        shutil.rmtree(staging, ignore_errors=True)
    if stale:
        log(f"removed from {out} the weight files of an earlier save, which this one does not write: "
            + ", ".join(p.name for p in stale))
    return out


def write_weights(folder: Path, files: list[str], shards: list[list[str]], full_tensor: Callable[[str], torch.Tensor],
                  torch_dtype: torch.dtype) -> None:
    """The weight files (one shard's tensors in memory at a time) and, for several, their index."""
    weight_map, total = {}, 0
    for file, names in zip(files, shards):
        tensors = {hf_name(n): full_tensor(n).to(torch_dtype).contiguous() for n in names}
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    if len(files) > 1:
        (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                               indent=2))


def checkpoint_tensors(folder: Path, manifest) -> Callable[[str], torch.Tensor]:
    """name → the whole parameter, assembled from a checkpoint's chunks."""
    reader = ShardReader(folder, manifest)

    def full_tensor(name: str) -> torch.Tensor:
        shape = manifest.tensors[f"param/{name}"].shape
        return reader.region(f"param/{name}", (0,) * len(shape), shape)

    return full_tensor


def export_checkpoint(checkpoint: str | Path, out: str | Path, dtype: str = "float32",
                      max_shard_bytes: int = MAX_SHARD_BYTES, log: Callable[[str], None] = print) -> tuple[Path, int]:
    """A plan-independent checkpoint (the newest under `checkpoint`, verified) in the Hugging
    Face layout (`log`: as write_hf_folder's); returns (its folder, its step)."""
    folder, manifest = latest_checkpoint(checkpoint, use="exported by naming it (hexiscale export-hf {folder} -o …)")
    missing = [n for n in model_tensors(manifest.model) if f"param/{n}" not in manifest.tensors]
    if missing:
        raise CheckpointError(f"{folder}: the checkpoint has no tensor param/{missing[0]}")
    write_hf_folder(out, manifest.model, checkpoint_tensors(folder, manifest), dtype, max_shard_bytes, log)
    return folder, manifest.step


def saved_tensors(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(transformers name, tensor) of every tensor a written folder holds (tests, checks)."""
    weights = HFWeights(folder)
    for path in sorted(set(weights.file_of.values())):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)


def save_hf_folder(out: str | Path, step: int, comm, tensors: dict[str, torch.Tensor],
                   manifest: Callable[[], object], dtype: str) -> None:
    """--save-hf after the last step: the writing ranks put their weight chunks (`param/`
    keys) in a plan-independent checkpoint under OUT/.hexiscale-params, and rank 0 converts
    it (export_checkpoint) and removes it: the same path `hexiscale export-hf` takes."""
    root = Path(out) / PARAMS_FOLDER
    if comm.rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    comm.barrier()
    if tensors:
        write_shard(root, step, comm.rank, tensors)
    comm.barrier()
    if comm.rank == 0:
        written = manifest()
        weights = {key: entry for key, entry in written.tensors.items() if key.startswith("param/")}
        try:
            export_checkpoint(commit(root, written.model_copy(update={"tensors": weights})), out, dtype)
        finally:  # a refused export leaves no weight chunks behind either
            shutil.rmtree(root, ignore_errors=True)
        print(f"saved the model in the Hugging Face layout to {out} ({dtype})", flush=True)
    comm.barrier()


def report_init(rank: int, folder: str, bytes_read: int) -> None:
    """One line in the rank's log: what it read of the model folder (its slice only)."""
    print(f"rank {rank}: weights from {folder}: read {bytes_read:,} bytes (this rank's slice)", flush=True)
