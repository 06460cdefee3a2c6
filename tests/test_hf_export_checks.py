"""Hugging Face weights out (docs/models-and-data.md §12), as a QA pass found them wanting:

- a save into a folder of an earlier save leaves none of its weight files (stale shards and
  their index were left beside the new model.safetensors, and --init-from read them), says
  which it removed, and a folder holding both a file and an index is refused on reading;
- export-hf checks the model folder's config.json against the checkpoint's model (an edited
  one was copied as it is now), and says what the export lacks when the folder is gone;
- --save-hf (or export-hf -o) into the model's own folder is refused before any work (it
  failed after the training, half-way through rewriting the folder);
- --save-dtype takes --precision's spellings (bf16) and --precision the dtype's (bfloat16).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.io import load_model
from runtime.checkpoints.hf_names import INDEX, SINGLE
from runtime.checkpoints.hf_weights import HFReader, write_hf_folder
from runtime.model.catalogue import model_tensors
from runtime.model.data import CORPUS_PATH
from runtime.model.text import CACHE_ENV
from hf_models import folder_problem, relative_distance, write_jsonl

PLAN = {"format": "hexiscale.plan/1", "problem": "qwen",
        "pipelines": [{"batch": 2, "stages": [{"devices": [0], "layers": 4}]}]}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A tied qwen2 folder, its problem, and a checkpoint of one step trained from it."""
    root = tmp_path_factory.mktemp("qa-weights")
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(root / "cache"))
    folder_problem(root, "qwen", "qwen2", tied=True, seq_len=16, global_batch=2)
    write_jsonl(root / "text.jsonl", CORPUS_PATH.read_text())
    (root / "plan.json").write_text(json.dumps(PLAN))
    trained = cli("run", root / "qwen.yaml", root / "plan.json", "--steps", 1, "--data", root / "text.jsonl",
                  "--init-from", root / "qwen", "--checkpoint-dir", root / "ck", "--save-every", 1,
                  "--out", root / "out")
    assert trained.exit_code == 0, trained.output
    yield root
    patch.undo()


def cli(*args):
    return CliRunner().invoke(app, [*map(str, args)])


def error_line(result) -> str:
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def read_back(folder: Path) -> dict[str, torch.Tensor]:
    """Every runtime tensor as the runtime reads a folder (HFReader, --init-from's reader)."""
    spec, reader = load_model(f"hf:{folder}"), HFReader(folder)
    return {n: reader.region(f"param/{n}", (0,) * len(s), s) for n, s in model_tensors(spec).items()}


def hf_state(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict())


def test_a_save_over_an_earlier_one_leaves_only_its_own_weights(work, tmp_path):
    fresh, reused = tmp_path / "fresh", tmp_path / "reused"
    assert cli("export-hf", work / "ck", "-o", fresh).exit_code == 0
    original = read_back(work / "qwen")  # an earlier save of other weights, in shards
    write_hf_folder(reused, load_model(f"hf:{work / 'qwen'}"), original.__getitem__, max_shard_bytes=100_000)
    shards = sorted(p.name for p in reused.glob("model-*.safetensors"))
    assert len(shards) > 1
    result = cli("export-hf", work / "ck", "-o", reused)
    assert result.exit_code == 0, result.output
    assert f"the weight files of an earlier save, which this one does not write: {', '.join(shards)}, {INDEX}" \
        in " ".join(result.output.split())
    assert sorted(p.name for p in reused.iterdir()) == sorted(p.name for p in fresh.iterdir())
    ours, expected = read_back(reused), read_back(fresh)
    assert all(torch.equal(ours[n], expected[n]) for n in expected)
    assert not all(torch.equal(ours[n], original[n]) for n in original)  # the step moved the weights
    assert relative_distance(hf_state(reused), hf_state(fresh)) == 0


def test_a_folder_of_a_file_and_an_index_is_refused(work, tmp_path):
    both = tmp_path / "both"
    write_hf_folder(both, load_model(f"hf:{work / 'qwen'}"), read_back(work / "qwen").__getitem__,
                    max_shard_bytes=100_000)
    shutil.copy(work / "qwen" / SINGLE, both / SINGLE)
    line = error_line(cli("run", work / "qwen.yaml", work / "plan.json", "--init-from", both, "--torchrun",
                          "--out", tmp_path / "job"))
    assert str(both) in line and SINGLE in line and INDEX in line and "ambiguous" in line


@pytest.mark.parametrize("field, value", [("tie_word_embeddings", False), ("rms_norm_eps", 0.1),
                                          ("num_key_value_heads", 4)])
def test_export_refuses_a_model_folder_whose_config_changed(work, tmp_path, field, value):
    config = work / "qwen" / "config.json"
    before = config.read_text()
    try:
        config.write_text(json.dumps({**json.loads(before), field: value}))
        line = error_line(cli("export-hf", work / "ck", "-o", tmp_path / "out"))
    finally:
        config.write_text(before)
    assert str(config) in line and field in line and json.dumps(value) in line
    assert not (tmp_path / "out" / SINGLE).exists()


def test_export_says_what_it_lacks_when_the_model_folder_is_gone(work, tmp_path):
    assert cli("export-hf", work / "ck", "-o", tmp_path / "with").exit_code == 0
    (work / "qwen").rename(work / "moved")
    try:
        result = cli("export-hf", work / "ck", "-o", tmp_path / "without")
    finally:
        (work / "moved").rename(work / "qwen")
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"note: the model's folder {work / 'qwen'} is gone" in said
    assert all(word in said for word in ("eos_token_id", "tokenizer", "generation_config.json"))
    assert sorted(p.name for p in (tmp_path / "without").iterdir()) == ["config.json", SINGLE]
    assert relative_distance(hf_state(tmp_path / "without"), hf_state(tmp_path / "with")) == 0


def test_saving_into_the_models_own_folder_is_refused_before_any_work(work, tmp_path):
    before = folder_bytes(work / "qwen")
    result = cli("run", work / "qwen.yaml", work / "plan.json", "--steps", 1, "--save-hf", work / "qwen",
                 "--out", tmp_path / "out")
    assert error_line(result).startswith(f"error: --save-hf: {work / 'qwen'} is the model's own folder")
    assert "running" not in result.output and not (tmp_path / "out" / "steps.jsonl").exists()
    assert str(work / "qwen") in error_line(cli("export-hf", work / "ck", "-o", work / "qwen"))
    assert folder_bytes(work / "qwen") == before


def test_export_takes_the_precisions_spelling_of_a_dtype(work, tmp_path):
    result = cli("export-hf", work / "ck", "-o", tmp_path / "bf16", "--save-dtype", "bf16")
    assert result.exit_code == 0, result.output
    with safe_open(str(tmp_path / "bf16" / SINGLE), framework="pt") as handle:
        assert {handle.get_tensor(name).dtype for name in handle.keys()} == {torch.bfloat16}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def test_an_interrupted_save_leaves_the_earlier_one_whole_and_its_leftovers_are_removed(work, tmp_path):
    """Stopped while it writes, a save leaves the folder as it was (it had written config.json
    first: a new config over the old weights, which transformers loaded without a word); its
    staged files go, and `cut_short` says the folder is as it was."""
    from runtime.checkpoints.staged_save import PARAMS_FOLDER, cut_short, partial_saves

    spec, weights = load_model(f"hf:{work / 'qwen'}"), read_back(work / "qwen")
    out = tmp_path / "out"
    write_hf_folder(out, spec, weights.__getitem__)
    before = folder_bytes(out)
    calls = []

    def stopped(name):
        calls.append(name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return weights[name]

    with pytest.raises(KeyboardInterrupt):
        write_hf_folder(out, spec, stopped, dtype="bfloat16")
    assert folder_bytes(out) == before and not partial_saves(out)
    (out / PARAMS_FOLDER).mkdir()  # what a rank stopped before its conversion leaves
    (out / ".hexiscale-save-1").mkdir()
    assert cut_short(out) == f"the save to {out} was cut short: its partial files were removed and {out} is as it was"
    assert folder_bytes(out) == before


def test_a_save_stopped_while_it_is_published_has_no_config(work, tmp_path, monkeypatch):
    """Between the first and the last move of publishing, config.json is gone: transformers
    refuses the folder instead of loading a mix, and `cut_short` says it is incomplete."""
    import os

    from runtime.checkpoints import staged_save

    spec, weights = load_model(f"hf:{work / 'qwen'}"), read_back(work / "qwen")
    out = tmp_path / "out"
    write_hf_folder(out, spec, weights.__getitem__)
    moves = []

    def one_move_then_stop(source, target):
        if moves:
            raise KeyboardInterrupt
        moves.append(target)
        os.replace(source, target)

    monkeypatch.setattr(staged_save.os, "replace", one_move_then_stop)
    with pytest.raises(KeyboardInterrupt):
        write_hf_folder(out, spec, weights.__getitem__, dtype="bfloat16")
    monkeypatch.undo()
    assert not (out / "config.json").exists() and (out / SINGLE).is_file()
    assert staged_save.cut_short(out) == (f"the save to {out} was cut short while it was published: {out} has no "
                                          "config.json (incomplete)")
