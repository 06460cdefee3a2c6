"""What every part of the GPU check (benchmarks/bench_gpu.py) shares: the sizes it runs at,
and the CUDA allocator's counts (NaN on CPU, where the dry run has none)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

GIB = 2**30
# Llama-2 7B's layer (instances/models/llama2-7b.yaml) with few layers: a real layer's shapes,
# a step of tens of milliseconds on an H200.
LAYER_7B = dict(hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, vocab=32000)
TINY = dict(hidden=64, heads=8, kv_heads=8, ffn_hidden=160, vocab=256)


@dataclass(frozen=True)
class Setup:
    device: torch.device
    backend: str
    shape: dict  # the model's layer shape (LAYER_7B on a GPU)
    seq_len: int  # longest s of the cases
    layers: int  # n of the runs in part 3


def setup_for(dry_run: bool) -> Setup:
    if dry_run:
        return Setup(torch.device("cpu"), "gloo", TINY, 64, 2)
    return Setup(torch.device("cuda", 0), "nccl", LAYER_7B, 4096, 4)


def allocated() -> float:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else float("nan")


def peak() -> float:
    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else float("nan")


def reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def ratio(measured: float, predicted: float) -> str:
    return f"{measured / predicted:6.3f}" if predicted and measured == measured else "     —"
