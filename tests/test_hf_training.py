"""Training a Hugging Face model under any plan (docs/models-and-data.md §12), against
transformers itself: tiny random models made here (llama with GQA; qwen2 with q/k/v biases and
tied embeddings), a tokenizer trained here, the bundled text as .jsonl documents.

- `hexiscale run PROBLEM PLAN --init-from DIR --data F --save-hf OUT` (fp32) under a TP 2/1
  pipeline, two pipelines with different layer splits and a sequence plan: per-step losses
  equal a one-process transformers loop with torch's AdamW on the §12 batches to 1e-5, and
  OUT loads with from_pretrained, its parameters equal to the loop's to 1e-5 (‖Δ‖/‖ref‖);
- export-hf of a checkpoint equals --save-hf of the same run, file for file;
- a tied model's checkpoint from two pipelines resumes under a sequence plan;
- with lr 0, init-from A then save-hf B gives A's tensors bit for bit;
- the token stream is §12's (computed here independently) and is read from the cache the
  second time; a long .txt encoded in pieces equals it encoded whole;
- a rank reads only its slice: a stage's RssFile growth against a file 24× its slice;
- sharded folders (an index and several files) are written, loaded and read by region;
- bad input is one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file
from typer.testing import CliRunner

from hexiscale.cli import app
from runtime.checkpoints.hf_weights import saved_tensors
from runtime.model.data import CORPUS_PATH, TokenStreamSource
from runtime.model.text import CACHE_ENV, PIECE_CHARS, prepare_stream
from hf_models import (EOS, batch, folder_problem, relative_distance, stream_of, train_transformers,
                             write_jsonl)

STEPS, B, S, LR, WD = 4, 4, 16, 1e-3, 0.01
TP_PLAN = {"pipelines": [{"batch": 4, "stages": [{"devices": [0, 1], "layers": 3}, {"devices": [2], "layers": 1}]}]}
TWO_PIPELINES = {"pipelines": [
    {"batch": 2, "stages": [{"devices": [0], "layers": 3}, {"devices": [1], "layers": 1}]},
    {"batch": 2, "stages": [{"devices": [2], "layers": 1}, {"devices": [3], "layers": 3}]}]}
SEQUENCE_PLAN = {"replicas": [
    {"batch": 2, "ring": [{"members": [{"device": 0, "heads": 2, "tokens": 8}, {"device": 1, "heads": 2, "tokens": 8}]}]},
    {"batch": 2, "ring": [{"members": [{"device": 2, "heads": 4, "tokens": 16}]}]}]}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Models, tokenizer, text, problems and plans, and a token cache of this module's own."""
    root = tmp_path_factory.mktemp("hf")
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(root / "cache"))
    for name, family, tied in (("qwen", "qwen2", True), ("llama", "llama", False)):
        folder_problem(root, name, family, tied=tied, seq_len=S, global_batch=B, token_block=4)
    write_jsonl(root / "text.jsonl", CORPUS_PATH.read_text())
    for name, plan, fmt, problem in (("tp", TP_PLAN, "hexiscale.plan/1", "qwen"),
                                     ("pp", TWO_PIPELINES, "hexiscale.plan/1", "qwen"),
                                     ("seq", SEQUENCE_PLAN, "hexiscale.seqplan/1", "llama"),
                                     ("seq-qwen", SEQUENCE_PLAN, "hexiscale.seqplan/1", "qwen")):
        (root / f"{name}.json").write_text(json.dumps({"format": fmt, "problem": problem, **plan}))
    yield root
    patch.undo()


@pytest.fixture(scope="module")
def reference(work):
    """The transformers loop of each model: (per-step losses, trained state)."""
    out = {}
    for name in ("qwen", "llama"):
        stream = stream_of(work / "text.jsonl", work / name)
        losses, model = train_transformers(work / name, stream, steps=STEPS, global_batch=B, seq_len=S,
                                           lr=LR, weight_decay=WD)
        out[name] = (losses, dict(model.state_dict()))
    return out


def run(*args: str):
    return CliRunner().invoke(app, ["run", *map(str, args)])


def hf_state(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict())


@pytest.mark.slow
@pytest.mark.parametrize("model, plan", [("qwen", "tp"), ("qwen", "pp"), ("llama", "seq")])
def test_a_plan_trains_as_transformers_does(work, reference, model, plan):
    out, saved = work / f"run-{plan}", work / f"saved-{plan}"
    result = run(work / f"{model}.yaml", work / f"{plan}.json", "--init-from", work / model, "--data",
                 work / "text.jsonl", "--steps", STEPS, "--lr", LR, "--weight-decay", WD, "--save-hf", saved,
                 "--out", out, "--checkpoint-dir", work / f"ck-{plan}", "--save-every", STEPS)
    assert result.exit_code == 0, result.output
    losses = [s["loss"] for s in json.loads((out / "metrics.json").read_text())["steps"]]
    ref_losses, ref_state = reference[model]
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, ref_losses)), (losses, ref_losses)
    assert relative_distance(hf_state(saved), ref_state) <= 1e-5
    assert (saved / "tokenizer.json").read_bytes() == (work / model / "tokenizer.json").read_bytes()
    # the checkpoint written under this plan converts to the very same files
    exported = work / f"exported-{plan}"
    assert CliRunner().invoke(app, ["export-hf", str(work / f"ck-{plan}"), "-o", str(exported)]).exit_code == 0
    assert sorted(p.name for p in exported.iterdir()) == sorted(p.name for p in saved.iterdir())
    assert all((exported / p.name).read_bytes() == p.read_bytes() for p in saved.iterdir())


@pytest.mark.slow
def test_tied_copies_resume_across_kinds(work, reference):
    """2 steps under two pipelines (a tied copy on each of 4 stages), a checkpoint, 2 more
    under a sequence plan (one ZeRO-3 copy): the 4 losses are transformers'."""
    first = run(work / "qwen.yaml", work / "pp.json", "--init-from", work / "qwen", "--data", work / "text.jsonl",
                "--steps", 2, "--out", work / "run-first", "--checkpoint-dir", work / "ck-kinds", "--save-every", 2)
    assert first.exit_code == 0, first.output
    second = run(work / "qwen.yaml", work / "seq-qwen.json", "--data", work / "text.jsonl", "--steps", 4,
                 "--out", work / "run-second", "--resume", work / "ck-kinds")
    assert second.exit_code == 0, second.output
    losses = [s["loss"] for out in ("run-first", "run-second")
              for s in json.loads((work / out / "metrics.json").read_text())["steps"]]
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, reference["qwen"][0])), losses


@pytest.mark.slow
def test_lr_0_round_trip_is_bit_exact(work):
    """init-from A, one step at lr 0, save-hf B: every tensor of B is A's, bit for bit (a tied
    head is not written: transformers ties it on loading)."""
    saved = work / "round-trip"
    result = run(work / "qwen.yaml", work / "pp.json", "--init-from", work / "qwen", "--data", work / "text.jsonl",
                 "--steps", 1, "--lr", 0, "--save-hf", saved, "--out", work / "run-round-trip")
    assert result.exit_code == 0, result.output
    original, written = dict(saved_tensors(work / "qwen")), dict(saved_tensors(saved))
    original.pop("lm_head.weight", None)
    assert set(written) == set(original)
    assert all(torch.equal(written[n], original[n]) for n in original)


def test_token_stream_is_section_12s_and_cached(work, capsys):
    """The cached stream equals the documents' ids + eos computed here; sequence j of step t
    is stream[o : o + s + 1]; the second time the cache is read."""
    stream = prepare_stream(work / "text.jsonl", work / "llama", 320)
    expected = stream_of(work / "text.jsonl", work / "llama")
    assert np.memmap(stream.path, dtype=np.uint32, mode="r").tolist() == expected
    source = TokenStreamSource(stream.path, B)
    inputs, targets = batch(expected, 3, B, S)
    assert torch.equal(source.sequence(3, 2, S + 1), torch.cat((inputs[2], targets[2, -1:])))
    again = prepare_stream(work / "text.jsonl", work / "llama", 320)
    assert again.path == stream.path and "cached" in capsys.readouterr().err


def test_long_txt_in_pieces_equals_whole(work, tmp_path):
    from tokenizers import Tokenizer

    text = CORPUS_PATH.read_text() * (PIECE_CHARS // len(CORPUS_PATH.read_text()) + 2)
    (tmp_path / "long.txt").write_text(text)
    stream = prepare_stream(tmp_path / "long.txt", work / "llama", 320)
    whole = Tokenizer.from_file(str(work / "llama" / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert np.memmap(stream.path, dtype=np.uint32, mode="r").tolist() == whole + [EOS]


def rss_file_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssFile in /proc/self/status")


def test_a_stage_reads_only_its_slice(tmp_path):
    """A middle stage of one layer (of 24) of a model written here: the bytes its slices ask
    for are its layer's, and while the files are open (safetensors maps them) its resident
    file pages grow by about that, not by the file."""
    from planner.io import load_model
    from runtime.checkpoints.hf_weights import HFReader
    from runtime.layered.checkpoint import load_params
    from runtime.layered.groups import RankGroups
    from runtime.layered.layout import StageRanks
    from runtime.layered.stage import StageModel
    from runtime.checkpoints.hf_names import hf_name
    from runtime.model.catalogue import model_tensors

    config = {"model_type": "llama", "num_hidden_layers": 24, "hidden_size": 256, "num_attention_heads": 4,
              "intermediate_size": 512, "vocab_size": 320, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_model(f"hf:{tmp_path}")
    save_file({hf_name(n): torch.randn(shape) for n, shape in model_tensors(spec).items()},
              str(tmp_path / "model.safetensors"))
    stage = StageRanks(pipeline=0, stage=7, ranks=(7,), devices=(7,), layer_start=7, layer_end=8, first=False, last=False)
    model = StageModel(spec, stage, 0, None, seq_len=8, seed=0)
    slice_bytes = sum(p.numel() * 4 for p in model.parameters())
    file_bytes = (tmp_path / "model.safetensors").stat().st_size
    assert file_bytes >= 20 * slice_bytes
    reader, before = HFReader(tmp_path), rss_file_bytes()
    load_params(reader, model, RankGroups(rank=7, layout=None, stage=stage))
    grown = rss_file_bytes() - before
    assert reader.bytes_read == slice_bytes and slice_bytes / 2 <= grown <= 2 * slice_bytes, \
        (reader.bytes_read, grown, slice_bytes, file_bytes)


# ---- bad input: one line, exit 2, nothing written ------------------------------------------

def one_line_exit_2(result, *words: str) -> None:
    """Exit 2 and one error line with every word (besides the tokenizer's note on what it read)."""
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.strip().splitlines() if not ln.startswith(("tokenized ", "tokens of "))]
    assert len(lines) == 1 and all(w in lines[0] for w in words), result.output


def bad_model_folder(work: Path, tmp_path: Path, drop: str = "", reshape: str = "") -> Path:
    """A copy of the qwen folder whose safetensors lack `drop` or hold `reshape` cut short."""
    folder = tmp_path / "model"
    shutil.copytree(work / "qwen", folder)
    tensors = dict(saved_tensors(folder))
    tensors.pop(drop, None)
    if reshape:
        tensors[reshape] = tensors[reshape][:-2].contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("drop, reshape, words", [
    ("model.layers.1.self_attn.k_proj.bias", "", ["model.layers.1.self_attn.k_proj.bias", "missing"]),
    ("", "model.layers.2.mlp.up_proj.weight", ["model.layers.2.mlp.up_proj.weight", "shape [62, 32]", "[64, 32]"]),
])
def test_weights_that_are_not_the_model(work, tmp_path, drop, reshape, words):
    folder = bad_model_folder(work, tmp_path, drop, reshape)
    result = run(work / "qwen.yaml", work / "tp.json", "--init-from", folder, "--save-hf", tmp_path / "out")
    one_line_exit_2(result, *words)
    assert not (tmp_path / "out").exists()


def test_an_unsupported_family_in_a_problem(work, tmp_path):
    folder = tmp_path / "gpt"
    shutil.copytree(work / "qwen", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"cluster": "demo-4", "model": {"hf": "gpt"},
                                                     "training": {"seq_len": S, "global_batch": B}}))
    one_line_exit_2(run(tmp_path / "p.yaml", work / "tp.json", "--force"), "model_type", "gpt2")


def test_a_tokenizer_larger_than_the_vocabulary(work, tmp_path):
    folder = tmp_path / "small"
    shutil.copytree(work / "qwen", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 256}))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"cluster": "demo-4", "model": {"hf": "small"},
                                                     "training": {"seq_len": S, "global_batch": B}}))
    result = run(tmp_path / "p.yaml", work / "tp.json", "--force", "--data", work / "text.jsonl")
    one_line_exit_2(result, "tokenizer.json", "300 tokens", "vocab_size 256")


@pytest.mark.parametrize("content, words", [
    ("", ["empty"]),
    ('{"text": "one"}\n{"body": "two"}\n', ["bad.jsonl:2", "text", "field required"]),
    ('{"text": "too short"}\n', ["fewer than one sequence"]),
    ("not json\n", ["bad.jsonl:1", "not a JSON line"]),
])
def test_bad_corpora(work, tmp_path, content, words):
    (tmp_path / "bad.jsonl").write_text(content)
    result = run(work / "qwen.yaml", work / "tp.json", "--data", tmp_path / "bad.jsonl", "--save-hf", tmp_path / "out")
    one_line_exit_2(result, "--data" if "fewer" in words[0] else "bad.jsonl", *words)
    assert not (tmp_path / "out").exists()


def test_an_unreadable_corpus(work, tmp_path):
    one_line_exit_2(run(work / "qwen.yaml", work / "tp.json", "--data", tmp_path / "nowhere.jsonl"),
                    "nowhere.jsonl", "no such file")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00text")
    one_line_exit_2(run(work / "qwen.yaml", work / "tp.json", "--data", tmp_path / "binary.txt"),
                    "binary.txt", "not UTF-8")


def test_sharded_folders_out_and_in(work, tmp_path):
    """Shards with model.safetensors.index.json: written when the model exceeds a shard,
    loaded by transformers, and read back region by region."""
    from planner.io import load_model
    from runtime.checkpoints.hf_names import INDEX, check_weights
    from runtime.checkpoints.hf_weights import HFReader, write_hf_folder
    from runtime.model.catalogue import model_tensors

    spec, source = load_model(f"hf:{work / 'llama'}"), HFReader(work / "llama")
    tensors = model_tensors(spec)
    whole = {name: source.region(f"param/{name}", (0,) * len(shape), shape) for name, shape in tensors.items()}
    write_hf_folder(tmp_path, spec, whole.__getitem__, max_shard_bytes=100_000)
    files = json.loads((tmp_path / INDEX).read_text())["weight_map"]
    assert len(set(files.values())) > 1
    check_weights(tmp_path, spec, tensors)
    assert relative_distance(hf_state(tmp_path), hf_state(work / "llama")) == 0
    reader = HFReader(tmp_path)
    block = reader.region("param/layers.3.mlp.down.weight", (8, 16), (4, 32))
    assert torch.equal(block, whole["layers.3.mlp.down.weight"][8:12, 16:48])
