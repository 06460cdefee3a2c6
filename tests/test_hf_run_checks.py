"""`hexiscale run` of a Hugging Face model (docs/models-and-data.md §12), as a QA pass found it
wanting:

- `--seq-len` longer than a Mistral folder's sliding window is refused as the problem's
  seq_len is (the run trained full attention, another model than transformers');
- `--resume` from a checkpoint of another model is refused unless --force (it trained and
  exported the checkpoint's model without a word), and `--init-from` beside it is said to be
  passed over;
- a loss that is not finite stops the run (exit 1, naming the step and the rank) before any
  checkpoint or --save-hf of it, under a layered and a sequence plan (it finished with rc 0);
- `--save-dtype` without `--save-hf` and `--eval-every` without `--eval-data` are refused
  (they were ignored), and `--precision` takes a dtype's spelling (bfloat16).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
import yaml
from safetensors.torch import save_file
from typer.testing import CliRunner

from hexiscale.cli import app
from runtime.checkpoints.hf_weights import saved_tensors
from runtime.model.data import CORPUS_PATH
from runtime.model.text import CACHE_ENV
from hf_models import make_model, write_jsonl

S = 16
TRAINING = {"seq_len": S, "global_batch": 2, "micro_batch": 1, "recompute": False, "token_block": 4}
LAYERED = {"format": "hexiscale.plan/1", "problem": "qa",
           "pipelines": [{"batch": 2, "stages": [{"devices": [0], "layers": 4}]}]}
SEQUENCE = {"format": "hexiscale.seqplan/1", "problem": "qa",
            "replicas": [{"batch": 2, "ring": [{"members": [{"device": 0, "heads": 4, "tokens": S}]}]}]}


def problem(root, name: str, folder: str):
    (root / f"{name}.yaml").write_text(yaml.safe_dump({"name": "qa", "cluster": "demo-4", "model": {"hf": folder},
                                                       "training": TRAINING}))
    return root / f"{name}.yaml"


def copy_with_config(root, source: str, target: str, **changes):
    shutil.copytree(root / source, root / target)
    config = json.loads((root / target / "config.json").read_text())
    (root / target / "config.json").write_text(json.dumps({**config, **changes}))
    return root / target


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A llama folder and a checkpoint of one step of it; a qwen2 folder; a llama whose final
    norm is NaN; a Mistral of a 24-token window; their problems and plans."""
    root = tmp_path_factory.mktemp("qa-run")
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(root / "cache"))
    make_model(root / "llama", "llama")
    make_model(root / "qwen", "qwen2", tied=True)
    nan = dict(saved_tensors(root / "llama"))
    nan["model.norm.weight"] = torch.full_like(nan["model.norm.weight"], float("nan"))
    copy_with_config(root, "llama", "nan")
    save_file(nan, str(root / "nan" / "model.safetensors"))
    copy_with_config(root, "llama", "mistral", model_type="mistral", architectures=["MistralForCausalLM"],
                     sliding_window=24)
    for name in ("llama", "qwen", "nan", "mistral"):
        problem(root, name, name)
    (root / "layered.json").write_text(json.dumps(LAYERED))
    (root / "sequence.json").write_text(json.dumps(SEQUENCE))
    write_jsonl(root / "text.jsonl", CORPUS_PATH.read_text())
    first = run(root / "llama.yaml", root / "layered.json", "--steps", 1, "--data", root / "text.jsonl",
                "--checkpoint-dir", root / "ck", "--save-every", 1, "--out", root / "first")
    assert first.exit_code == 0, first.output
    yield root
    patch.undo()


def run(*args):
    return CliRunner().invoke(app, ["run", *map(str, args)])


def error_line(result) -> str:
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "running" not in result.output, result.output
    return errors[0]


def said(result) -> str:
    return " ".join(result.output.split())


def test_a_seq_len_beyond_the_sliding_window_is_refused(work, tmp_path):
    line = error_line(run(work / "mistral.yaml", work / "layered.json", "--seq-len", 32, "--torchrun",
                          "--out", tmp_path / "a"))
    assert line.startswith("error: --seq-len 32:") and "sliding_window: 24" in line
    within = run(work / "mistral.yaml", work / "layered.json", "--seq-len", 24, "--torchrun", "--out", tmp_path / "b")
    assert within.exit_code == 0, within.output
    assert json.loads((tmp_path / "b" / "job.json").read_text())["config"]["seq_len"] == 24
    tiny = run(work / "mistral.yaml", work / "layered.json", "--model", "tiny", "--seq-len", 32, "--torchrun",
               "--out", tmp_path / "c")  # the tiny model has no window
    assert tiny.exit_code == 0, tiny.output


def test_resuming_another_models_checkpoint_needs_force_and_is_said(work, tmp_path):
    args = (work / "qwen.yaml", work / "layered.json", "--steps", 2, "--data", work / "text.jsonl",
            "--resume", work / "ck")
    write_jsonl(tmp_path / "new.jsonl", CORPUS_PATH.read_text()[::-1])
    cached = sorted((work / "cache").iterdir())
    line = error_line(run(*args[:-3], tmp_path / "new.jsonl", *args[-2:], "--out", tmp_path / "refused"))
    assert sorted((work / "cache").iterdir()) == cached  # refused before the new text was tokenized
    assert "--resume" in line and "'llama'" in line and "qkv_bias False (this run: True)" in line and "--force" in line
    forced = run(*args, "--force", "--init-from", work / "qwen", "--out", tmp_path / "forced")
    assert forced.exit_code == 0, forced.output
    text = said(forced)
    assert "note: training the checkpoint's model 'llama', not 'qwen'" in text
    assert f"note: --init-from {work / 'qwen'} is not read" in text
    assert "model llama (L=4" in text  # the job runs the checkpoint's model, as the note says


@pytest.mark.parametrize("plan", ["layered", "sequence"])
def test_a_loss_that_is_not_finite_stops_the_run_before_anything_is_saved(work, tmp_path, plan):
    result = run(work / "nan.yaml", work / f"{plan}.json", "--steps", 2, "--init-from", work / "nan",
                 "--data", work / "text.jsonl", "--save-hf", tmp_path / "saved",
                 "--checkpoint-dir", tmp_path / "ck", "--save-every", 1, "--out", tmp_path / "out")
    assert result.exit_code == 1, result.output
    text = said(result)
    assert "step 1: the loss is nan (computed on rank 0)" in text and "error: rank 0" in text
    assert "step 1/2" not in text and not (tmp_path / "saved").exists()
    assert not list((tmp_path / "ck").iterdir())


def test_options_that_would_be_ignored_are_refused(work, tmp_path):
    args = (work / "llama.yaml", work / "layered.json", "--torchrun", "--out", tmp_path / "job")
    for extra, start in ((("--save-dtype", "bf16"), "error: --save-dtype:"),
                         (("--save-dtype", "float32"), "error: --save-dtype:"),
                         (("--eval-every", 1), "error: --eval-every: needs --eval-data")):
        assert error_line(run(*args, *extra)).startswith(start)
    assert not (tmp_path / "job" / "job.json").exists()


def test_precision_takes_a_dtypes_spelling(work, tmp_path):
    result = run(work / "llama.yaml", work / "layered.json", "--precision", "bfloat16", "--torchrun",
                 "--out", tmp_path / "job")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "job" / "job.json").read_text())["config"]["precision"] == "bf16"
    assert "float16" in error_line(run(work / "llama.yaml", work / "layered.json", "--precision", "float16",
                                       "--torchrun", "--out", tmp_path / "other"))


def test_an_init_folder_of_another_config_or_a_save_over_the_start_is_refused_before_the_text_is_read(work, tmp_path):
    """--init-from a folder whose config.json differs in a field the tensors' shapes do not show
    (it trained with the problem's rms_norm_eps), and --save-hf into the --init-from folder (it
    replaced the start's weights): each one line, before --data is tokenized (they came after)."""
    write_jsonl(tmp_path / "new.jsonl", CORPUS_PATH.read_text()[::-1])
    cached = sorted((work / "cache").iterdir())
    other = copy_with_config(work, "llama", "llama-eps", rms_norm_eps=1e-3)
    line = error_line(run(work / "llama.yaml", work / "layered.json", "--init-from", other,
                          "--data", tmp_path / "new.jsonl", "--out", tmp_path / "a"))
    assert line.startswith(f"error: --init-from: {other / 'config.json'}: rms_norm_eps: 0.001 there, but the "
                           "problem's model has") and "another model's" in line
    start = tmp_path / "start"
    shutil.copytree(work / "llama", start)
    line = error_line(run(work / "llama.yaml", work / "layered.json", "--init-from", start, "--save-hf", start,
                          "--data", tmp_path / "new.jsonl", "--out", tmp_path / "b"))
    assert line == (f"error: --save-hf: {start} is the --init-from folder (the save would replace the weights it "
                    "starts from): write to another folder")
    assert sorted((work / "cache").iterdir()) == cached  # nothing was tokenized


def test_a_folder_models_run_says_what_its_user_may_not_have_meant(work, tmp_path):
    """Random weights without --init-from, random tokens without --data, a sequence past the
    folder's max_position_embeddings, an eval loss on the training text: a note each (they were
    silent; the saved folder then looked like a fine-tune of the model)."""
    short = copy_with_config(work, "llama", "llama-short", max_position_embeddings=8)
    problem(work, "short", "llama-short")
    plain = said(run(work / "short.yaml", work / "layered.json", "--torchrun", "--out", tmp_path / "a"))
    assert f"note: the weights start random (no --init-from): {short}'s safetensors are not read" in plain
    assert "note: the data is random tokens (no --data)" in plain
    assert f"note: seq_len {S} is longer than the model's max_position_embeddings 8 (config.json)" in plain
    chosen = said(run(work / "llama.yaml", work / "layered.json", "--init-from", work / "llama", "--data",
                      work / "text.jsonl", "--eval-data", work / "text.jsonl", "--torchrun", "--out", tmp_path / "b"))
    assert "note: --eval-data is the --data text: the eval loss is measured on training text" in chosen
    assert "fewer than one step reads" not in chosen
    write_jsonl(tmp_path / "short.jsonl", CORPUS_PATH.read_text()[:50])  # fewer tokens than B·s = 32 + s + 1
    short_text = said(run(work / "llama.yaml", work / "layered.json", "--init-from", work / "llama", "--data",
                          tmp_path / "short.jsonl", "--torchrun", "--out", tmp_path / "c"))
    assert re.search(r"note: the corpus has \d+ tokens, fewer than one step reads \(B·s = 32\): every step "
                     r"repeats its sequences", short_text), short_text
    assert "weights start random" not in chosen and "random tokens" not in chosen and "max_position" not in chosen
