"""Training data: a deterministic synthetic token stream and a small byte-level text corpus,
read through one loader.

Sequence j of step t is a pure function of (source, seed, t, j), so each pipeline reads
only its own slice [offset_p, offset_p + B_p) of the global batch and the one-process
reference reads the whole batch — and both see the same tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from runtime.config import BYTE_VOCAB, DataName

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


def make_source(name: DataName, vocab: int, seed: int) -> TokenSource:
    return SyntheticSource(vocab, seed) if name == "synthetic" else ByteCorpusSource(vocab, seed)


class BatchLoader:
    """Inputs and next-token labels for any slice of a step's global batch."""

    def __init__(self, source: TokenSource, seq_len: int):
        self.source, self.seq_len = source, seq_len

    def batch(self, step: int, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self.source.sequence(step, start + j, self.seq_len + 1) for j in range(count)])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
