"""The GPU check (benchmarks/bench_gpu.py, docs/device-check.md) without a GPU: its count of
what the runtime keeps reduces to Megatron's, and its dry run drives the same code on CPU
(the layered worker in-process over gloo, the local launcher), so it still runs the day a
GPU is lent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.workload import ModelSpec, TrainingSpec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_layers import kept_activation_bytes  # noqa: E402


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_kept_count_is_megatrons_without_dropout_on_a_gpt_layer(tp):
    """MHA, a plain MLP of f = 4h, β = 2: s·b·h·(8 + 24/t) — Korthikanti et al.'s 10 + 24/t
    less the two 1-byte dropout masks a Llama layer does not have."""
    h, s, b = 1024, 512, 3
    spec = ModelSpec(layers=1, hidden=h, heads=16, ffn_hidden=4 * h, vocab=100, gated=False)
    training = TrainingSpec(seq_len=s, global_batch=b, micro_batch=b)
    assert kept_activation_bytes(spec, training, tp) == pytest.approx(s * b * h * (8 + 24 / tp))


def test_kept_count_of_swiglu_gqa_and_sequence_parallelism():
    """Gated (4f split), GQA (2h_kv split), SP (norm inputs split, linear inputs whole)."""
    h, f, kv_width, s = 4096, 14336, 1024, 4096
    spec = ModelSpec(layers=1, hidden=h, heads=32, kv_heads=8, ffn_hidden=f, vocab=100)
    plain = TrainingSpec(seq_len=s, global_batch=1)
    sp = plain.model_copy(update={"sequence_parallel": True})
    split = 2 * h + 2 * kv_width + 4 * f
    assert kept_activation_bytes(spec, plain, 1) == 2 * s * (4 * h + split)
    assert kept_activation_bytes(spec, plain, 2) == 2 * s * (4 * h + split / 2)
    assert kept_activation_bytes(spec, sp, 2) == 2 * s * (h + 2 * h + split / 2)
    assert kept_activation_bytes(spec, sp, 1) == kept_activation_bytes(spec, plain, 1)  # a group of one splits nothing


@pytest.mark.slow
def test_dry_run_drives_every_part_on_cpu(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/bench_gpu.py", "--dry-run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for part in ("bf16 GEMM", "activations per layer", "the layered runtime over gloo", "launch_local, gloo"):
        assert part in out, out[-2000:]
    assert out.count("q=") == 4 and "replicas identical: True" in out
    # the runs' folders are gone (97 had piled up in /tmp); torch keeps its compile cache there on purpose
    assert not [p.name for p in tmp_path.iterdir() if not p.name.startswith("torchinductor_")]


def test_without_a_gpu_the_check_says_so_and_fails():
    """It printed 'no CUDA device here' and exited 0, so a scripted check read it as passed."""
    done = subprocess.run([sys.executable, "benchmarks/bench_gpu.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "no CUDA device here" in done.stderr, (done.returncode, done.stderr)
