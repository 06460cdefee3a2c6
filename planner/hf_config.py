"""A Hugging Face model folder's config.json → ModelSpec (docs/models-and-data.md §12).

Supported: `llama`, `mistral` (no sliding window shorter than the sequence), `qwen2` (biases on
q, k and v). Every field that would make the model something the runtime's decoder does not
compute — another activation, a head_dim other than h/a, a rope scaling, biases elsewhere
than q/k/v, attention dropout, sliding windows — is refused with one line naming the field,
so that nobody plans for (or trains) a model that is not the one in the folder.
No import of planner.io (which reads `model: {hf: path}` through this module); errors are an
`HFConfigError` carrying file, field and reason, which planner.io turns into its InputError.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.workload import ModelSpec

SUPPORTED = ("llama", "mistral", "qwen2")
CONFIG = "config.json"
REQUIRED = {"num_hidden_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
            "intermediate_size": "ffn_hidden", "vocab_size": "vocab"}
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_NORM_EPS = 1e-6  # transformers' LlamaConfig / Qwen2Config / MistralConfig default
# ModelSpec's fields → the config.json keys they are read from, so that a value ModelSpec
# refuses is reported under the key the user sees
CONFIG_KEYS = {**{name: key for key, name in REQUIRED.items()}, "kv_heads": "num_key_value_heads",
               "rope_theta": "rope_theta", "norm_eps": "rms_norm_eps", "tied_embeddings": "tie_word_embeddings",
               "name": "the folder's name"}


class HFConfigError(ValueError):
    """A config.json that does not describe a model hexiscale runs: file, field, reason."""

    def __init__(self, file: str | Path, field: str, reason: str):
        self.file, self.field, self.reason = str(file), field, reason
        super().__init__(f"{self.file}: {field}: {reason}" if field else f"{self.file}: {reason}")


def config_path(path: str | Path) -> Path:
    """The config.json of a model folder, or the file itself when given."""
    path = Path(path)
    return path / CONFIG if path.is_dir() else path


def read_config(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(config.json's path, its mapping); unreadable or not a JSON mapping: HFConfigError."""
    file = config_path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8-sig"))  # -sig: a byte-order mark is dropped
    except OSError as exc:
        raise HFConfigError(file, "", f"cannot read the model's config ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HFConfigError(file, "", f"not a JSON config.json ({exc})") from None
    if not isinstance(data, dict):
        raise HFConfigError(file, "", "expected a JSON mapping at the top level")
    return file, data


def rope_theta(file: Path, data: dict[str, Any]) -> float:
    """rope_theta, or rope_parameters.rope_theta (transformers 5); a rope scaling is refused."""
    params = data.get("rope_parameters") or {}
    scaling = data.get("rope_scaling") or {}
    for field, mapping in (("rope_parameters", params), ("rope_scaling", scaling)):
        kind = mapping.get("rope_type", mapping.get("type", "default")) if isinstance(mapping, dict) else mapping
        if kind not in ("default", None):
            raise HFConfigError(file, f"{field}.rope_type", f"rope scaling {kind!r} is not supported "
                                                            "(only the default rotary embedding)")
    theta = params.get("rope_theta", data.get("rope_theta", DEFAULT_ROPE_THETA))
    return positive_number(file, "rope_theta", theta)


def positive_number(file: Path, field: str, value: Any) -> float:
    """A finite positive number (json reads NaN and Infinity; true is not a number here)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise HFConfigError(file, field, f"expected a positive number, got {value!r}")
    return float(value)


def _refusals(data: dict[str, Any], kind: str) -> list[tuple[str, str]]:
    """(field, reason) of everything the runtime's decoder does not compute."""
    out = []
    if data.get("hidden_act", "silu") != "silu":
        out.append(("hidden_act", f"activation {data['hidden_act']!r} is not supported (only silu)"))
    heads, hidden = data.get("num_attention_heads"), data.get("hidden_size")
    head_dim = data.get("head_dim")
    if head_dim is not None and isinstance(heads, int) and heads and head_dim * heads != hidden:
        out.append(("head_dim", f"{head_dim} is not hidden_size/num_attention_heads = {hidden}/{heads}"))
    if data.get("mlp_bias"):
        out.append(("mlp_bias", "biases on the MLP are not supported"))
    if kind != "qwen2" and data.get("attention_bias"):
        out.append(("attention_bias", f"{kind} puts a bias on o_proj too; only q/k/v biases (qwen2) are supported"))
    if data.get("attention_dropout"):
        out.append(("attention_dropout", f"{data['attention_dropout']} > 0: dropout is not supported"))
    layer_types = data.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        out.append(("layer_types", "only full attention is supported, not "
                                   f"{next(t for t in layer_types if t != 'full_attention')!r}"))
    return out


def sliding_window(data: dict[str, Any], kind: str) -> int | None:
    """The attention window a layer uses, None when attention sees the whole prefix."""
    if kind == "qwen2" and not data.get("use_sliding_window"):
        return None
    return data.get("sliding_window")


def read_hf_model(path: str | Path, seq_len: int | None = None) -> ModelSpec:
    """ModelSpec of a Hugging Face folder (or its config.json). With `seq_len`, a sliding
    window shorter than the sequence is refused (the model would attend differently)."""
    file, data = read_config(path)
    kind = data.get("model_type")
    if kind not in SUPPORTED:
        raise HFConfigError(file, "model_type", f"{kind!r} is not supported (supported: {', '.join(SUPPORTED)})")
    for field, reason in _refusals(data, kind):
        raise HFConfigError(file, field, reason)
    window = sliding_window(data, kind)
    if window is not None and seq_len is not None and window < seq_len:
        raise HFConfigError(file, "sliding_window", f"{window} is shorter than the sequence ({seq_len} tokens): "
                                                    "sliding-window attention is not supported")
    sizes = {}
    for field, name in REQUIRED.items():
        value = data.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HFConfigError(file, field, "field required (a positive integer)" if value is None
                                else f"expected a positive integer, got {value!r}")
        sizes[name] = value
    return _spec(file, data, kind, sizes)


def _spec(file: Path, data: dict[str, Any], kind: str, sizes: dict[str, int]) -> ModelSpec:
    kv = data.get("num_key_value_heads")  # absent or null: as many as the heads (transformers' rule)
    if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1):
        raise HFConfigError(file, "num_key_value_heads", f"expected a positive integer, got {kv!r}")
    tied = data.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):  # bool("false") is True
        raise HFConfigError(file, "tie_word_embeddings", f"expected true or false, got {tied!r}")
    try:
        return ModelSpec(name=file.parent.name or "model", kv_heads=kv, gated=True, qkv_bias=kind == "qwen2",
                         tied_embeddings=tied, rope_theta=rope_theta(file, data),
                         norm_eps=positive_number(file, "rms_norm_eps", data.get("rms_norm_eps", DEFAULT_NORM_EPS)),
                         hf_folder=str(file.parent.resolve()), **sizes)
    except ValidationError as exc:
        raise HFConfigError(file, *_config_error(exc.errors()[0])) from None


def _config_error(error: dict) -> tuple[str, str]:
    """(config.json key, reason) of ModelSpec's first error. Its model-level checks carry no
    field: heads not dividing hidden is a fault of num_attention_heads, kv heads not dividing
    heads one of num_key_value_heads."""
    reason = error["msg"].removeprefix("Value error, ")
    if error["loc"]:
        field = str(error["loc"][0])
        return CONFIG_KEYS.get(field, field), f"{reason} (got {repr(error['input'])[:60]})"
    return ("num_key_value_heads" if "kv_heads" in reason else "num_attention_heads"), reason


def eos_token_id(path: str | Path) -> int | None:
    """The config's eos_token_id (the first, where it is a list); None when it has none."""
    file, data = read_config(path)
    eos = data.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is not None and (not isinstance(eos, int) or isinstance(eos, bool) or eos < 0):
        raise HFConfigError(file, "eos_token_id", f"expected a token id, got {eos!r}")
    return eos


# ModelSpec's fields a config.json sets → its key (two configs of one model say the same for each)
CONFIG_FIELDS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                 "num_kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size", "vocab": "vocab_size",
                 "tied_embeddings": "tie_word_embeddings", "qkv_bias": "model_type (q/k/v biases)",
                 "rope_theta": "rope_theta", "norm_eps": "rms_norm_eps"}


def config_differences(first: ModelSpec, second: ModelSpec) -> list[tuple[str, str, str]]:
    """(config.json key, first's value, second's value) of every field the two models' configs
    set differently, as JSON."""
    return [(key, json.dumps(getattr(first, field)), json.dumps(getattr(second, field)))
            for field, key in CONFIG_FIELDS.items() if getattr(first, field) != getattr(second, field)]


def max_positions(path: str | Path) -> int | None:
    """The folder's max_position_embeddings (None: its config.json gives none)."""
    _, data = read_config(path)
    value = data.get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

