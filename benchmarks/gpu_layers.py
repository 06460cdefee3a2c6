"""Parts 2 and 6 of the GPU check (benchmarks/bench_gpu.py, docs/device-check.md): one layer's
kept activations against §3.5 and against a count of the runtime's own tensors, and a TP-2
rank's compute against §3.1's 1/t — both on the runtime's `StageModel`, in one process, its
TP collectives replaced by local stand-ins of the right shapes (benchmarks/bench_sp_share.py).
"""

from __future__ import annotations

import time

import torch

from bench_sp_share import LocalStandIn
from gpu_setup import Setup, allocated, peak, ratio, reset_peak, synchronize
from planner.layered.cost import layer_activation_bytes
from planner.workload import ModelSpec, TrainingSpec
from runtime.layered.layout import StageRanks
from runtime.layered.stage import StageModel


def middle_stage(spec: ModelSpec, tp: int, sequence_parallel: bool, recompute: bool, seq_len: int,
                 device: torch.device) -> StageModel:
    ranks = tuple(range(tp))
    layout = StageRanks(pipeline=0, stage=0, ranks=ranks, devices=ranks, layer_start=0, layer_end=spec.layers,
                        first=False, last=False)
    model = StageModel(spec, layout, 0, object() if tp > 1 else None, seq_len, seed=0, recompute=recompute,
                       comm=LocalStandIn(), sequence_parallel=sequence_parallel)
    return model.to(device).to(torch.bfloat16)


def kept_activation_bytes(spec: ModelSpec, training: TrainingSpec, tp: int) -> float:
    """What this runtime keeps of one layer and micro-batch without recompute, counted from its
    code (docs/device-check.md): per token, β·(4h + (2h + 2h_kv + m·f)/t) with m = 4 (gated:
    gate, up, silu, product) or 2 (up, activation) — the two norms' inputs and the two linear
    inputs on every rank; q, k, v, the attention output and the MLP's intermediates split by t.
    With sequence parallelism the norms' inputs are split too (2h/t), the gathered linear
    inputs are not (2h). A candidate for §3.5, set beside it here, not used by the planner."""
    h, kv, f, t = spec.hidden, spec.num_kv_heads * spec.head_dim, spec.ffn_hidden, tp
    split = 2 * h + 2 * kv + (4 if spec.gated else 2) * f
    kept = (2 * h / t + 2 * h) if training.sequence_parallel and t > 1 else 4 * h
    return training.seq_len * training.micro_batch * training.act_bytes * (kept + split / t)


def activation_row(setup: Setup, spec: ModelSpec, tp: int, sp: bool, recompute: bool, micro_batch: int) -> str:
    """One micro-batch forward through a middle stage; (held after forward − before) / n."""
    training = TrainingSpec(seq_len=setup.seq_len, global_batch=micro_batch, micro_batch=micro_batch,
                            recompute=recompute, sequence_parallel=sp)
    a_full, a_ckpt = layer_activation_bytes(spec, training, tp)
    predicted = a_ckpt if recompute else a_full
    candidate = a_ckpt if recompute else kept_activation_bytes(spec, training, tp)
    model = middle_stage(spec, tp, sp, recompute, setup.seq_len, setup.device)
    rows = setup.seq_len // tp if sp and tp > 1 else setup.seq_len
    x = torch.randn(micro_batch, rows, spec.hidden, device=setup.device, dtype=torch.bfloat16, requires_grad=True)
    synchronize()
    before = allocated()
    reset_peak()
    out = model(x, None, 1.0)
    synchronize()
    held = (allocated() - before) / spec.layers
    out.backward(torch.ones_like(out))
    synchronize()
    backward_peak = peak() - before
    del model, x, out
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    label = f"{spec.name} t={tp}{' SP' if sp else ''}{' recompute' if recompute else ''}"
    return (f"{label:28s} b={micro_batch}  {held / 2**20:9.1f} {predicted / 2**20:9.1f} {ratio(held, predicted)}"
            f"  {candidate / 2**20:9.1f} {ratio(held, candidate)}   {backward_peak / 2**20:9.1f}")


def layer_models(shape: dict) -> list[ModelSpec]:
    """Llama-2 7B's layer (MHA, SwiGLU f = 2.69h); Llama-3 8B's (GQA 32/8, f = 3.5h); a plain
    two-matrix MLP of f = 4h (the layer §3.5's 10 + 24/t was counted on, less its dropout)."""
    h = shape["hidden"]
    gqa = {**shape, "kv_heads": shape["heads"] // 4, "ffn_hidden": 7 * h // 2}
    return [ModelSpec(name="mha-swiglu", layers=2, **shape), ModelSpec(name="gqa-swiglu", layers=2, **gqa),
            ModelSpec(name="mha-plain-4h", layers=2, gated=False, **{**shape, "ffn_hidden": 4 * h})]


ACTIVATION_CASES = {  # (t, sequence parallel, recompute, b): all on the first model, three on the others
    "all": ((1, False, False, 1), (1, False, False, 2), (1, False, True, 1), (2, False, False, 1), (2, True, False, 1),
            (2, True, True, 1)),
    "some": ((1, False, False, 1), (2, False, False, 1), (2, True, False, 1))}


def report_activations(setup: Setup) -> None:
    print(f"§3.5 activations per layer and micro-batch: a middle stage of 2 layers, s = {setup.seq_len}, bf16 "
          f"(flash attention where the GPU has it); MiB held after one forward, per layer, against §3.5 and "
          f"against what this runtime's code keeps (kept_activation_bytes)")
    print(f"{'case':28s} {'':4s} {'held':>9s} {'§3.5':>9s} {'ratio':>6s}  {'kept':>9s} {'ratio':>6s}   "
          f"{'bwd peak':>9s}")
    for index, spec in enumerate(layer_models(setup.shape)):
        for tp, sp, recompute, b in ACTIVATION_CASES["all" if index == 0 else "some"]:
            print(activation_row(setup, spec, tp, sp, recompute, b), flush=True)
    print()


def pass_ms(model: StageModel, x: torch.Tensor, repeats: int) -> float:
    """The least of `repeats` timed forward + backward passes of one micro-batch, ms."""
    times = []
    for _ in range(repeats + 2):  # two warm-ups
        synchronize()
        start = time.perf_counter()
        out = model(x, None, 1.0)
        out.backward(torch.ones_like(out))
        synchronize()
        times.append(time.perf_counter() - start)
    return min(times[2:]) * 1e3


def report_tp_share(setup: Setup, repeats: int = 10) -> None:
    """§3.1 prices a TP-t rank's compute at 1/t of the stage's: a TP-2 rank's forward + backward
    (collectives replaced by the local stand-ins, so only its own compute and copies count)
    against one device's, on the 7B layer (the CPU measured 0.57–0.62 on a small one)."""
    spec = layer_models(setup.shape)[0]
    print(f"§3.1 compute of a TP-2 rank against one device: {spec.name}, {spec.layers} layers, s = {setup.seq_len}, "
          f"b = 1, bf16, forward + backward, least of {repeats}")
    one = None
    for tp, sp in ((1, False), (2, False), (2, True)):
        model = middle_stage(spec, tp, sp, False, setup.seq_len, setup.device)
        rows = setup.seq_len // tp if sp else setup.seq_len
        x = torch.randn(1, rows, spec.hidden, device=setup.device, dtype=torch.bfloat16, requires_grad=True)
        ms = pass_ms(model, x, repeats)
        one = one or ms
        print(f"t={tp}{' SP' if sp else '   '}  {ms:8.2f} ms  share {ms / one:.3f}  (§3.1: {1 / tp:.3f})", flush=True)
        del model, x
    print()
