"""Text for a Hugging Face model (docs/models-and-data.md §12), as a QA pass found it wanting:

- a tokenizer whose ids reach past V (a gap in its vocabulary) is refused before any process,
  naming the token and its id (it passed on its token count; TP 1 then died of an IndexError,
  TP 2 trained a silently wrong loss);
- `--data PATH` with `--model tiny` is one line (a rank died of an IndexError), as run_plan's;
- `--data corpus` for a folder model is the bundled text through its tokenizer (it was raw
  bytes), and an existing path named `corpus` is read, not shadowed (both said);
- a corpus folder says which files it reads and what it passes over (a broken link, a
  subfolder, another suffix); `*.TXT` is text; an empty or blank `.txt` is no document;
- a `.jsonl` with a byte-order mark is read; a HEXISCALE_CACHE that is a file is one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import hexiscale as hx
from hexiscale.cli import app
from runtime.model.corpora import corpus_settings, with_corpora
from runtime.model.data import CORPUS_PATH
from runtime.model.text import CACHE_ENV, DataError, prepare_stream
from hf_models import EOS, VOCAB, folder_problem, write_jsonl

S = 16
PLAN = {"format": "hexiscale.plan/1", "problem": "llama",
        "pipelines": [{"batch": 2, "stages": [{"devices": [0], "layers": 4}]}]}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A tiny llama folder, its problem and a one-device plan, a token cache of this module's own."""
    root = tmp_path_factory.mktemp("qa-data")
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(root / "cache"))
    folder_problem(root, "llama", "llama", seq_len=S, global_batch=2)
    write_jsonl(root / "text.jsonl", CORPUS_PATH.read_text())
    (root / "plan.json").write_text(json.dumps(PLAN))
    yield root
    patch.undo()


def run(*args) -> object:
    return CliRunner().invoke(app, ["run", *map(str, args)])


def error_line(result) -> str:
    """The one `error:` line of a refused command (exit 2), besides the notes said before it."""
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and not any("Traceback" in line for line in result.output.splitlines()), result.output
    return errors[0]


def encoded(folder: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def stream_ids(settings: dict, key: str = "token_file") -> list[int]:
    return np.memmap(settings[key], dtype=np.uint32, mode="r").tolist()


def test_a_token_id_beyond_the_vocabulary_is_refused_before_any_process(work, tmp_path):
    """300 tokens fit V = 320 by count, but one id is 400: refused naming it, nothing started."""
    folder = tmp_path / "gap"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        (folder / name).write_bytes((work / "llama" / name).read_bytes())
    tokenizer = json.loads((work / "llama" / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    token = max(vocab, key=vocab.get)
    vocab[token] = 400
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (tmp_path / "gap.yaml").write_text((work / "llama.yaml").read_text().replace("hf: llama", "hf: gap"))
    result = run(tmp_path / "gap.yaml", work / "plan.json", "--force", "--steps", 1, "--data", work / "text.jsonl",
                 "--out", tmp_path / "out")
    line = error_line(result)
    assert "tokenizer.json" in line and repr(token) in line and "id 400" in line and "vocab_size 320" in line
    assert not (tmp_path / "out" / "steps.jsonl").exists() and "running" not in result.output


def test_text_with_the_tiny_model_is_one_line_as_run_plan_says(work, tmp_path):
    result = run(work / "llama.yaml", work / "plan.json", "--model", "tiny", "--steps", 1, "--data",
                 work / "text.jsonl", "--out", tmp_path / "out")
    assert "--model problem" in error_line(result) and "running" not in result.output
    with pytest.raises(DataError, match="model='problem'"):
        with_corpora(hx.load_problem(str(work / "llama.yaml")), "tiny", 1, {"data": str(work / "text.jsonl")})


def test_corpus_for_a_folder_model_is_the_bundled_text_through_its_tokenizer(work):
    problem = hx.load_problem(str(work / "llama.yaml"))
    expected = encoded(work / "llama", CORPUS_PATH.read_text()) + [EOS]
    settings = with_corpora(problem, "problem", 1, {"data": "corpus"})
    assert settings["data"] == "text" and stream_ids(settings) == expected
    assert len(expected) < len(CORPUS_PATH.read_bytes())  # BPE ids, fewer than the text's bytes
    # the tiny model still reads the bundled text as bytes
    assert with_corpora(problem, "tiny", 1, {"data": "corpus"}) == {"data": "corpus"}


def test_an_existing_path_named_like_a_source_is_read_and_said(work, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text(CORPUS_PATH.read_text()[:2000])
    model, said = hx.load_problem(str(work / "llama.yaml")).model, []
    settings = corpus_settings(model, "corpus", None, 0, 1, S, said.append)
    assert stream_ids(settings) == encoded(work / "llama", CORPUS_PATH.read_text()[:2000]) + [EOS]
    assert any(line.startswith("note: data corpus: reading the path") for line in said), said
    # a run of the tiny model reads the named source, and says the path is not read
    tiny = run(work / "llama.yaml", work / "plan.json", "--model", "tiny", "--data", "corpus", "--torchrun",
               "--out", tmp_path / "job")
    assert tiny.exit_code == 0 and "note: --data corpus: the named source; the path corpus here is not read" in \
        tiny.output, tiny.output


def test_a_corpus_folder_says_what_it_reads_and_passes_over(work, tmp_path):
    text = CORPUS_PATH.read_text()
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "inner.txt").write_text(text)
    (folder / "a.txt").write_text(text[:1500])
    (folder / "B.TXT").write_text(text[1500:3000])
    (folder / "c.txt").write_text(" \n\t\n")  # blank: no document
    (folder / "README.md").write_text("not text for training")
    (folder / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    said = []
    stream = prepare_stream(folder, work / "llama", VOCAB, said.append)
    ids = np.memmap(stream.path, dtype=np.uint32, mode="r").tolist()
    llama = work / "llama"
    assert ids == encoded(llama, text[1500:3000]) + [EOS] + encoded(llama, text[:1500]) + [EOS]  # B.TXT < a.txt
    assert said[0] == (f"{folder}: reading 3 files (B.TXT, a.txt, c.txt); passed over README.md: not .jsonl or "
                       ".txt; gone.txt: a broken link; sub: a folder (subfolders are not read)")


@pytest.mark.parametrize("content", ["", "  \n\n "])
def test_an_empty_txt_is_an_empty_corpus_as_an_empty_jsonl_is(work, tmp_path, content):
    for name in ("empty.txt", "empty.jsonl"):
        (tmp_path / name).write_text(content)
        with pytest.raises(DataError, match="the corpus is empty"):
            prepare_stream(tmp_path / name, work / "llama", VOCAB, lambda line: None)


def test_a_byte_order_mark_is_no_part_of_the_text(work, tmp_path):
    plain = write_jsonl(tmp_path / "plain.jsonl", CORPUS_PATH.read_text())
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    streams = [prepare_stream(tmp_path / name, work / "llama", VOCAB, lambda line: None)
               for name in ("plain.jsonl", "bom.jsonl")]
    plain_ids, bom_ids = (np.memmap(s.path, dtype=np.uint32, mode="r").tolist() for s in streams)
    assert bom_ids == plain_ids


def test_a_cache_variable_naming_a_file_is_one_line(work, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "file"))
    line = error_line(run(work / "llama.yaml", work / "plan.json", "--steps", 1, "--data", work / "text.jsonl"))
    assert line.startswith(f"error: {CACHE_ENV}: {tmp_path / 'file'}") and "folder" in line
    assert os.path.isfile(tmp_path / "file")
