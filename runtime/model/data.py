"""Training data: a deterministic synthetic token stream, a small byte-level text corpus, and
a tokenized corpus (`runtime.model.text`) in the order of docs/models-and-data.md §12, read
through one loader.

Sequence j of step t is a pure function of (source, seed, t, j), so each pipeline reads
only its own slice [offset_p, offset_p + B_p) of the global batch and the one-process
reference reads the whole batch — and both see the same tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from runtime.config import BYTE_VOCAB, DataName, RunConfig
from runtime.model.text import TOKEN_DTYPE

CORPUS_PATH = Path(__file__).parent / "data" / "corpus.txt"


class TokenSource(Protocol):
    def sequence(self, step: int, index: int, length: int) -> torch.Tensor:
        """Token ids (int64) of global sequence `index` of step `step`."""


class SyntheticSource:
    """A learnable stream: each sequence follows x' = (a·x + c) mod V from a random start,
    with an occasional random token, so a model's loss falls visibly in a few steps."""

    def __init__(self, vocab: int, seed: int):
        self.vocab, self.seed = vocab, seed
        self.mult, self.inc = 5 % vocab or 1, 3 % vocab

    def sequence(self, step: int, index: int, length: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 7_919 + step * 104_729 + index)
        values = [int(torch.randint(self.vocab, (1,), generator=gen))]
        for _ in range(1, length):
            values.append((self.mult * values[-1] + self.inc) % self.vocab)
        tokens = torch.tensor(values, dtype=torch.int64)
        noise = torch.rand(length, generator=gen) < 0.1
        tokens[noise] = torch.randint(self.vocab, (int(noise.sum()),), generator=gen)
        return tokens


class ByteCorpusSource:
    """Bytes of a text file as tokens (byte-level tokenizer, vocabulary 256)."""

    def __init__(self, vocab: int, seed: int, path: Path = CORPUS_PATH):
        if vocab < BYTE_VOCAB:
            raise ValueError(f"the byte-level corpus needs vocab ≥ {BYTE_VOCAB}, the model has {vocab}")
        self.data = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).to(torch.int64)
        self.seed = seed

    def sequence(self, step: int, index: int, length: int) -> torch.Tensor:
        if length >= len(self.data):
            raise ValueError(f"sequence length {length} exceeds the corpus ({len(self.data)} bytes)")
        gen = torch.Generator().manual_seed(self.seed * 7_919 + step * 104_729 + index)
        start = int(torch.randint(len(self.data) - length, (1,), generator=gen))
        return self.data[start:start + length]


class TokenStreamSource:
    """A tokenized corpus (memory-mapped, read-only): global sequence j of step t is
    stream[o : o + s + 1], o = (t·B + j)·s mod (len − s − 1) — a pure function of (t, j), so
    every plan, rank layout and resumed run reads the same tokens (§12)."""

    def __init__(self, path: str | Path, global_batch: int):
        self.stream = np.memmap(path, dtype=TOKEN_DTYPE, mode="r")
        self.global_batch = global_batch

    def sequence(self, step: int, index: int, length: int) -> torch.Tensor:
        s = length - 1
        if len(self.stream) < length + 1:
            raise ValueError(f"sequence length {s} needs at least {s + 2} tokens; the stream has {len(self.stream)}")
        start = (step * self.global_batch + index) * s % (len(self.stream) - length)
        return torch.from_numpy(self.stream[start:start + length].astype(np.int64))


def make_source(name: DataName, vocab: int, seed: int) -> TokenSource:
    return SyntheticSource(vocab, seed) if name == "synthetic" else ByteCorpusSource(vocab, seed)


def run_source(config: RunConfig, global_batch: int) -> TokenSource:
    """The training tokens of a run: its token stream (data "text"), or a named source."""
    if config.data == "text":
        return TokenStreamSource(config.token_file, global_batch)
    return make_source(config.data, config.model.vocab, config.seed)


def eval_loader(config: RunConfig, global_batch: int) -> BatchLoader | None:
    """The held-out tokens: batch 0 of the eval stream is every eval's batch (None: no eval)."""
    if not (config.eval_token_file and config.eval_every):
        return None
    return BatchLoader(TokenStreamSource(config.eval_token_file, global_batch), config.seq_len)


def eval_due(config: RunConfig, step: int) -> bool:
    """An eval loss after step `step` (0-based): every eval_every steps, and after the last."""
    return bool(config.eval_token_file and config.eval_every) and (
        (step + 1) % config.eval_every == 0 or step + 1 == config.steps)


class BatchLoader:
    """Inputs and next-token labels for any slice of a step's global batch."""

    def __init__(self, source: TokenSource, seq_len: int):
        self.source, self.seq_len = source, seq_len

    def batch(self, step: int, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self.source.sequence(step, start + j, self.seq_len + 1) for j in range(count)])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
