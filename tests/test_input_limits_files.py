"""How input files are found, guessed and reported: the kind `validate` reads a file as, files
that are empty, folders or pipes, byte-order marks, Hugging Face config.json values, `generate`'s
options, the printed problem schema, and the TP-size rule's message. Bad input: one line, exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.io import InputError, bundled_dir, load_model, load_problem
from planner.kinds import validate
from planner.layered.plan import Plan
from planner.problem import Problem

INSTANCES = Path(__file__).parent.parent / "instances"
MODEL = (INSTANCES / "models" / "tiny.yaml").read_text()
CLUSTER = (INSTANCES / "clusters" / "demo-4.yaml").read_text()
runner = CliRunner()


def one_line_error(*args: str) -> str:
    """The CLI's one `error:` line for bad input (exit 2, no traceback)."""
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, (args, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in result.output and "internal error" not in lines[0]
    return lines[0]


def validate_ok(path: Path) -> str:
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    return result.stdout


# -- the kind validate reads a file as -------------------------------------------------------

@pytest.mark.parametrize("text, words", [
    (MODEL.replace("layers:", "layer:"), ["read as a model file (it has hidden, heads", "layers: Field required",
                                          "layer: unknown field"]),
    (CLUSTER.replace("machines:", "machine:"), ["read as a cluster file (it has inter_bw_gbps)",
                                                "machines: Field required", "machine: unknown field"]),
    # an unknown key is named before the fields it leaves missing: `trainig:` is a typo of training
    ("foo: 1\n", ["read as a problem file (it has none of the fields", "foo: unknown field, a typo?"]),
    ("cluster: demo-4\nmodel: tiny\n", ["read as a problem file (it has cluster, model)", "training: field required"]),
])
def test_a_file_missing_a_field_says_what_it_was_read_as(tmp_path, text, words):
    path = tmp_path / "f.yaml"
    path.write_text(text)
    line = one_line_error("validate", str(path))
    assert line.startswith(f"error: {path}: read as a "), line
    assert all(w in line for w in words), line


def test_complete_files_of_each_kind_are_read_as_that_kind(tmp_path):
    for name, text, expect in (("m.yaml", MODEL, "ok model tiny"), ("c.yaml", CLUSTER, "ok cluster demo-4"),
                               ("p.yaml", "cluster: demo-4\nmodel: tiny\ntraining: {seq_len: 64, global_batch: 8}\n",
                                "ok problem p")):
        (tmp_path / name).write_text(text)
        assert expect in validate_ok(tmp_path / name)
    # a complete file with a typo elsewhere keeps the plain message (the kind is not in doubt)
    (tmp_path / "m2.yaml").write_text(MODEL + "kv_head: 2\n")
    line = one_line_error("validate", str(tmp_path / "m2.yaml"))
    assert line == f"error: {tmp_path / 'm2.yaml'}: kv_head: unknown field (a typo?) (got 2)", line


# -- what is not a mapping in a file ------------------------------------------------------------

@pytest.mark.parametrize("name, text, reason", [
    ("e.yaml", "", "the file is empty"), ("e.json", "", "the file is empty"), ("w.yaml", "  \n\n", "the file is empty"),
    ("c.yaml", "# only a comment\n", "the file holds no data"), ("n.json", "null", "the file holds no data"),
])
def test_empty_files_say_so(tmp_path, name, text, reason):
    (tmp_path / name).write_text(text)
    assert one_line_error("validate", str(tmp_path / name)) == \
        f"error: {tmp_path / name}: {reason}: expected a YAML or JSON mapping"


def test_a_folder_is_not_no_such_file(tmp_path):
    (tmp_path / "d.yaml").mkdir()
    line = one_line_error("validate", str(tmp_path / "d.yaml"))
    assert line == f"error: {tmp_path / 'd.yaml'}: is a directory, not a file"
    # named by a problem as its cluster
    (tmp_path / "p.yaml").write_text("cluster: d.yaml\nmodel: tiny\ntraining: {seq_len: 64, global_batch: 8}\n")
    # the problem file and its field named, then the folder (QA: it named the folder alone)
    assert f"p.yaml: cluster: 'd.yaml' is a folder ({tmp_path / 'd.yaml'}), expected a cluster file" in \
        one_line_error("validate", str(tmp_path / "p.yaml"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_pipe_is_refused_without_reading_it(tmp_path):
    os.mkfifo(tmp_path / "f.yaml")  # reading it would block: the check must come first
    line = one_line_error("validate", str(tmp_path / "f.yaml"))
    assert line == (f"error: {tmp_path / 'f.yaml'}: not a regular file (a pipe, socket or device): "
                    "expected a YAML or JSON file")


@pytest.mark.parametrize("name", ["p.json", "p.yaml"])
def test_a_byte_order_mark_is_accepted_in_json_and_yaml(tmp_path, name):
    data = {"cluster": "demo-4", "model": "tiny", "training": {"seq_len": 64, "global_batch": 8}}
    text = json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data)
    (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_problem(tmp_path / name).training.global_batch == 8


# -- Hugging Face config.json --------------------------------------------------------------------

LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 8,
         "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 512, "hidden_act": "silu",
         "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "tie_word_embeddings": False}


def hf_error(tmp_path: Path, **changes) -> str:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text(json.dumps({**LLAMA, **changes}))
    with pytest.raises(InputError) as exc:
        load_model(f"hf:{tmp_path / 'm'}")
    message = str(exc.value)
    assert message.startswith(str(tmp_path / "m" / "config.json")) and "\n" not in message
    assert "[type=" not in message and "input_value" not in message and "Value error" not in message
    return message.split("config.json: ", 1)[1]


@pytest.mark.parametrize("changes, expect", [
    ({"rope_theta": float("nan")}, "rope_theta: expected a positive number, got nan"),
    ({"rope_theta": float("inf")}, "rope_theta: expected a positive number, got inf"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps: expected a positive number, got nan"),
    ({"rope_theta": True}, "rope_theta: expected a positive number, got True"),
    ({"num_key_value_heads": -2}, "num_key_value_heads: expected a positive integer, got -2"),
    ({"num_key_value_heads": 0}, "num_key_value_heads: expected a positive integer, got 0"),
    ({"num_key_value_heads": 3}, "num_key_value_heads: heads 8 is not divisible by kv_heads 3"),
    ({"num_attention_heads": 3}, "num_attention_heads: hidden 64 is not divisible by heads 3"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings: expected true or false, got 'false'"),
    ({"hidden_size": 2**30, "num_attention_heads": 1, "num_key_value_heads": 1},
     "hidden_size: Input should be less than or equal to 1048576 (got 1073741824)"),
    ({"rms_norm_eps": 2.0}, "rms_norm_eps: Input should be less than or equal to 1 (got 2.0)"),
])
def test_config_json_values_are_reported_under_their_own_key(tmp_path, changes, expect):
    assert hf_error(tmp_path, **changes) == expect


def test_config_json_null_kv_heads_and_real_booleans_still_read(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**LLAMA, "num_key_value_heads": None,
                                                           "tie_word_embeddings": True}))
    spec = load_model(f"hf:{tmp_path / 'm'}")
    assert spec.num_kv_heads == 8 and spec.tied_embeddings is True


# -- generate's options ----------------------------------------------------------------------------

@pytest.mark.parametrize("args, expect", [
    (["--mix", "A100-80G:nan"], "error: --mix: entry 'A100-80G:nan': the weight must be a finite number"),
    (["--mix", "A100-80G:inf,H20:1"], "error: --mix: entry 'A100-80G:inf': the weight must be a finite number"),
    (["--seed", "-5"], "error: --seed: expected a non-negative integer, got -5"),
    (["--mix", "A100-80G:1,H20:1,A100-80G:1"],
     "error: --mix: GPU type A100-80G is named twice (give each type once, with its whole weight)"),
])
def test_generate_refuses_bad_options_in_one_line_naming_the_option(tmp_path, args, expect):
    out = tmp_path / "c.yaml"
    assert one_line_error("generate", "cluster", "--gpus", "8", *args, "-o", str(out)) == expect
    assert not out.exists()


# -- the printed problem schema ---------------------------------------------------------------------

def test_problem_schema_accepts_what_the_loader_accepts():
    schema = json.loads(runner.invoke(app, ["schema", "--type", "problem"]).stdout)
    assert "hf_folder" not in json.dumps(schema)
    assert "hf_folder" not in json.dumps(json.loads(runner.invoke(app, ["schema"]).stdout))
    props = schema["properties"]
    cluster_forms = {b.get("type", b.get("$ref")) for b in props["cluster"]["anyOf"]}
    model_forms = {b.get("type", b.get("$ref")) for b in props["model"]["anyOf"]}
    assert cluster_forms == {"#/$defs/Cluster", "string"}
    assert model_forms == {"#/$defs/ModelSpec", "string", "object"}
    hf = next(b for b in props["model"]["anyOf"] if b.get("type") == "object")
    assert hf["required"] == ["hf"] and hf["additionalProperties"] is False
    # the bundled problems name their cluster and model: the schema once refused every one of them
    bundled = [yaml.safe_load(p.read_text()) for p in bundled_dir("problems").glob("*.yaml")]
    assert sum(isinstance(d["cluster"], str) and isinstance(d["model"], str) for d in bundled) >= 10


# -- the TP-size rule names only what it fails to divide -------------------------------------------

def test_tp_size_message_names_only_the_head_count_it_does_not_divide():
    problem = Problem.model_validate({  # tiny: 4 heads, 2 kv heads
        "cluster": {"inter_bw_gbps": 25, "machines": [{"name": "m", "gpu": "H100", "count": 8, "intra_bw_gbps": 450}]},
        "model": yaml.safe_load(MODEL), "training": {"seq_len": 64, "global_batch": 8}})
    for tp, expect in ((4, "TP size 4 does not divide kv heads 2"),
                       (8, "TP size 8 does not divide heads 4 and kv heads 2")):
        plan = Plan.model_validate({"pipelines": [{"batch": problem.training.global_batch,
                                                   "stages": [{"devices": list(range(tp)), "layers": 4}]}]})
        messages = [v.message for v in validate(problem, plan) if v.rule == "tp_size"]
        assert messages == [expect], messages
