"""A Hugging Face config.json as a problem's model (docs/models-and-data.md §12): the fields read, the cost
model's view of them, and every refusal as one line naming the field (exit 2 in the CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import hexiscale as hx
from hexiscale.cli import app
from planner.io import InputError, load_model, problem_to_dict

LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 8,
         "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 512, "hidden_act": "silu",
         "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "tie_word_embeddings": False, "eos_token_id": 2}


def write_model(folder: Path, **changes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {**LLAMA, **changes}
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))
    return folder


def write_problem(folder: Path, model_ref: str, seq_len: int = 64) -> Path:
    path = folder / "problem.yaml"
    path.write_text(yaml.safe_dump({"cluster": "demo-4", "model": {"hf": model_ref},
                                    "training": {"seq_len": seq_len, "global_batch": 8}}))
    return path


def test_llama_fields_are_read(tmp_path):
    spec = load_model(f"hf:{write_model(tmp_path / 'm')}")
    assert (spec.layers, spec.hidden, spec.heads, spec.num_kv_heads, spec.ffn_hidden, spec.vocab) == (4, 64, 8, 2, 176, 512)
    assert (spec.rope_theta, spec.norm_eps, spec.qkv_bias, spec.tied_embeddings) == (500000.0, 1e-6, False, False)
    assert spec.hf_folder == str((tmp_path / "m").resolve()) and spec.name == "m"


def test_qwen2_has_qkv_bias_and_transformers5_rope_parameters(tmp_path):
    folder = write_model(tmp_path / "q", model_type="qwen2", rope_theta=..., tie_word_embeddings=True,
                         rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, use_sliding_window=False,
                         sliding_window=None, layer_types=["full_attention"] * 4)
    spec = load_model(f"hf:{folder / 'config.json'}")  # the config.json itself also names the model
    assert spec.qkv_bias and spec.tied_embeddings and spec.rope_theta == 1e6
    # the cost model prices what the file holds: q/k/v biases in P_layer
    plain = load_model(f"hf:{write_model(tmp_path / 'l')}")
    assert spec.params_per_layer - plain.params_per_layer == 64 + 2 * 2 * 8


def test_missing_kv_heads_default_to_heads(tmp_path):
    assert load_model(f"hf:{write_model(tmp_path / 'm', num_key_value_heads=...)}").num_kv_heads == 8


def test_problem_file_reads_the_folder_relative_to_itself(tmp_path):
    write_model(tmp_path / "models" / "m")
    problem = hx.load_problem(write_problem(tmp_path, "models/m"))
    assert problem.model.hidden == 64 and problem.model.hf_folder.endswith("models/m")
    assert problem_to_dict(problem)["model"] == {"hf": problem.model.hf_folder}


@pytest.mark.parametrize("changes, words", [
    ({"model_type": "gpt2"}, ["model_type", "'gpt2'", "llama, mistral, qwen2"]),
    ({"hidden_act": "gelu"}, ["hidden_act", "gelu"]),
    ({"head_dim": 16}, ["head_dim", "16"]),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, ["rope_scaling.rope_type", "yarn"]),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, ["rope_parameters.rope_type", "llama3"]),
    ({"attention_bias": True}, ["attention_bias", "o_proj"]),
    ({"mlp_bias": True}, ["mlp_bias"]),
    ({"num_key_value_heads": 3}, ["num_key_value_heads", "not divisible"]),
    ({"vocab_size": ...}, ["vocab_size", "required"]),
    ({"model_type": "mistral", "sliding_window": 32}, ["sliding_window", "32", "64 tokens"]),
])
def test_unsupported_fields_are_one_line_naming_them(tmp_path, changes, words):
    write_model(tmp_path / "m", **changes)
    with pytest.raises(InputError) as exc:
        hx.load_problem(write_problem(tmp_path, "m"))
    assert all(w in str(exc.value) for w in words), str(exc.value)
    assert "config.json" in str(exc.value) and "\n" not in str(exc.value)


def test_mistral_window_longer_than_the_sequence_is_whole_attention(tmp_path):
    write_model(tmp_path / "m", model_type="mistral", sliding_window=4096)
    assert hx.load_problem(write_problem(tmp_path, "m", seq_len=4096)).model.layers == 4


def test_missing_folder_names_the_problem_field(tmp_path):
    with pytest.raises(InputError, match="model.hf.*no Hugging Face model folder"):
        hx.load_problem(write_problem(tmp_path, "nowhere"))


def test_generate_problem_from_a_folder(tmp_path):
    folder = write_model(tmp_path / "m")
    out = tmp_path / "p.yaml"
    result = CliRunner().invoke(app, ["generate", "problem", "--gpus", "4", "--model", f"hf:{folder}",
                                      "--seq-len", "64", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(out.read_text())["model"] == {"hf": str(folder.resolve())}
    assert hx.load_problem(out).model.ffn_hidden == 176


def test_generate_problem_refuses_an_unsupported_model_with_exit_2(tmp_path):
    folder = write_model(tmp_path / "m", hidden_act="relu")
    result = CliRunner().invoke(app, ["generate", "problem", "--gpus", "4", "--model", f"hf:{folder}",
                                      "-o", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2 and "hidden_act" in result.output and not (tmp_path / "p.yaml").exists()
