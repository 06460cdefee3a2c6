"""A rank's memory, as each plan kind's worker reports it per step.

On a GPU the CUDA caching allocator's own counts: what tensors hold (allocated), not what the
allocator reserved or NCCL took for its buffers — the quantity docs/cost-model.md §3.5 prices
(docs/device-check.md compares them). On CPU the process's resident set, which also holds
torch itself: only differences of it mean anything.
"""

from __future__ import annotations

import os
import resource

import torch


def current_mib(device: torch.device) -> float:
    """Memory in use now, MiB (allocated on a GPU; resident set on CPU)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib(device: torch.device) -> float:
    """This process's memory high-water mark, MiB: the CUDA allocator's peak since the last
    `reset_peak` on a GPU; on CPU the peak resident set (getrusage max RSS, never reset)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def reset_peak(device: torch.device) -> None:
    """Start a new high-water mark (a GPU's; the CPU's cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
