"""Tokenizing a text corpus for `hexiscale run --data` (runtime.model.text, docs/models-and-data.md §12):
throughput of the first run, and the second run, which reads the cache.

The corpus is the bundled text's paragraphs repeated into a .jsonl file of --mb megabytes
(each document numbered, so that no two are the same); the tokenizer a byte-level BPE of
--vocab tokens trained on its first megabyte with the tokenizers library (no hub here).

    .venv/bin/python benchmarks/bench_tokenize.py [--mb 100] [--vocab 8192] [--work DIR]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.model.data import CORPUS_PATH  # noqa: E402
from runtime.model.text import CACHE_ENV, prepare_stream  # noqa: E402

console = Console()


def write_corpus(path: Path, megabytes: float) -> int:
    """Numbered paragraphs of the bundled text until the file holds `megabytes` MB."""
    paragraphs = [p for p in CORPUS_PATH.read_text().split("\n\n") if p.strip()]
    size, index = 0, 0
    with path.open("w") as handle:
        while size < megabytes * 1e6:
            line = json.dumps({"text": f"{index}. {paragraphs[index % len(paragraphs)]}"}) + "\n"
            handle.write(line)
            size, index = size + len(line), index + 1
    return index


def make_model_folder(folder: Path, corpus: Path, vocab: int) -> None:
    """config.json (eos 0) and a byte-level BPE tokenizer.json trained on the corpus's first MB."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    sample = [json.loads(line)["text"] for line in corpus.read_text()[:1_000_000].splitlines()[:-1]]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(sample, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab, "eos_token_id": 0}))


def timed_stream(corpus: Path, folder: Path, vocab: int) -> tuple[float, object]:
    start = time.perf_counter()
    stream = prepare_stream(corpus, folder, vocab, log=lambda line: console.print(line, highlight=False))
    return time.perf_counter() - start, stream


def main(mb: float = typer.Option(100, help="corpus size, MB"), vocab: int = typer.Option(8192),
         work: Path = typer.Option(None, help="folder for the corpus and cache (default: a temporary one)")) -> None:
    work = work or Path(tempfile.mkdtemp(prefix="bench-tokenize-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_ENV] = str(work / "cache")
    corpus = work / "corpus.jsonl"
    documents = write_corpus(corpus, mb)
    make_model_folder(work / "model", corpus, vocab)
    first_s, stream = timed_stream(corpus, work / "model", vocab)
    cached_s, again = timed_stream(corpus, work / "model", vocab)
    assert again.path == stream.path
    table = Table(title=f"tokenizing --data ({os.cpu_count()} cores, byte-level BPE of {vocab} tokens)")
    for column in ("corpus MB", "documents", "tokens", "first run s", "tokens/s", "MB/s", "second run s (cache)"):
        table.add_column(column, justify="right")
    size = corpus.stat().st_size / 1e6
    table.add_row(f"{size:.1f}", f"{documents:,}", f"{stream.tokens:,}", f"{first_s:.1f}",
                  f"{stream.tokens / first_s:,.0f}", f"{size / first_s:.2f}", f"{cached_s:.2f}")
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
