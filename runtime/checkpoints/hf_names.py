"""A Hugging Face model folder's weights, seen without torch (docs/models-and-data.md §12): which
file holds each tensor (one `model.safetensors`, or shards listed by
`model.safetensors.index.json`), the Hugging Face name of each of the runtime's tensors, and
the check that a folder holds exactly the model a run trains — every tensor there, with its
shape and a floating-point dtype — read from the files' headers only, before any process
starts. A mismatch is a CheckpointError naming the tensor (one line).
"""

from __future__ import annotations

import json
import struct
from functools import cached_property
from pathlib import Path

from planner.workload import ModelSpec
from runtime.checkpoints.manifest import CheckpointError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
FLOAT_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
# runtime name inside a layer → transformers' name inside `model.layers.{i}.`
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "mlp_norm.weight": "post_attention_layernorm.weight",
    **{f"attn.{x}.{kind}": f"self_attn.{x}_proj.{kind}" for x in "qkvo" for kind in ("weight", "bias")},
    **{f"mlp.{x}.weight": f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")},
}
TOP_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "head.weight": "lm_head.weight"}


def hf_name(name: str) -> str:
    """transformers' name of a runtime tensor ("layers.3.attn.q.weight" → "model.layers.3.self_attn.q_proj.weight")."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{layer}.{LAYER_NAMES[rest]}"


def harmless_extra(name: str, spec: ModelSpec) -> bool:
    """Tensors a folder may hold that are no weight of the model: rotary tables of older
    exports, and a tied model's separate copy of its head."""
    return name.endswith("rotary_emb.inv_freq") or (spec.tied_embeddings and name == TOP_NAMES["head.weight"])


def read_header(path: Path) -> dict[str, dict]:
    """A safetensors file's header: tensor name → {dtype, shape, data_offsets} (no data read)."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except (OSError, struct.error, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({type(exc).__name__})") from None
    header.pop("__metadata__", None)
    return header


class HFWeights:
    """The safetensors files of a model folder and the file of every tensor."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if (self.folder / INDEX).is_file() and (self.folder / SINGLE).is_file():
            # transformers would take model.safetensors and this index its shards: one is stale
            raise CheckpointError(f"{self.folder}: holds both {SINGLE} and {INDEX}, so which are the weights is "
                                  f"ambiguous (one is likely left from an earlier save): remove the stale one")
        if (self.folder / INDEX).is_file():
            try:
                self.file_of = {name: self.folder / file for name, file in
                                json.loads((self.folder / INDEX).read_text())["weight_map"].items()}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{self.folder / INDEX}: not a readable safetensors index "
                                      f"({type(exc).__name__})") from None
        elif (self.folder / SINGLE).is_file():
            self.file_of = {name: self.folder / SINGLE for name in read_header(self.folder / SINGLE)}
        else:
            raise CheckpointError(f"{self.folder}: no {SINGLE} or {INDEX} there")

    @cached_property
    def headers(self) -> dict[str, dict]:
        """Every tensor's header entry, from each file's header (read once)."""
        out = {}
        for path in sorted(set(self.file_of.values())):
            if not path.is_file():
                raise CheckpointError(f"{path}: shard named by {INDEX} is missing")
            out.update({name: entry for name, entry in read_header(path).items() if self.file_of.get(name) == path})
        return out


def check_weights(folder: str | Path, spec: ModelSpec, tensors: dict[str, tuple[int, ...]]) -> None:
    """The folder holds every tensor of `tensors` (runtime name → full shape) with that shape
    and a floating-point dtype, and no weight the model lacks; else one line naming the tensor."""
    weights = HFWeights(folder)
    headers, wanted = weights.headers, {hf_name(n): (n, shape) for n, shape in tensors.items()}
    for hf, (_, shape) in wanted.items():
        entry = headers.get(hf)
        where = weights.file_of.get(hf, Path(folder) / SINGLE)
        if entry is None:
            raise CheckpointError(f"{where}: tensor {hf} is missing (model {spec.name!r} needs it, shape {list(shape)})")
        if tuple(entry["shape"]) != tuple(shape):
            raise CheckpointError(f"{where}: tensor {hf} has shape {entry['shape']}, the model needs {list(shape)}")
        if entry["dtype"] not in FLOAT_DTYPES:
            raise CheckpointError(f"{where}: tensor {hf} has dtype {entry['dtype']}, expected a floating-point "
                                  f"one ({', '.join(FLOAT_DTYPES)})")
    for hf in sorted(set(headers) - set(wanted)):
        if not harmless_extra(hf, spec):
            raise CheckpointError(f"{weights.file_of[hf]}: tensor {hf} is not a weight of model {spec.name!r} "
                                  "(another architecture or size?)")
