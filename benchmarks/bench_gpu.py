"""The GPU check: the CUDA/NCCL path, bf16, and §3.5's memory against the CUDA allocator.

    python3 benchmarks/bench_gpu.py            # on a CUDA machine (prints why it stops elsewhere)
    python3 benchmarks/bench_gpu.py --dry-run  # here, on CPU: the same code with a tiny model, gloo

Made for the rare, short loans of a GPU machine (docs/device-check.md says what it printed):
one command, a few minutes. Six parts (`--parts`), each a table:

1. The device: torch, the GPU, a bf16 GEMM's TFLOP/s against the catalogue's peak
   (instances/gpus.yaml) — the η that §3.1 would need on this GPU for plain matrix work.
2. Activations per layer, §3.5: the runtime's own `StageModel` (a middle stage of n layers,
   bf16), one micro-batch forward, bytes the allocator holds afterwards over n, against
   a_full = s·b·h·(10 + 24/t) (34·s·b·h/t with sequence parallelism) and a_ckpt = 2·s·b·h(/t).
   A TP-2 rank runs in this one process with its collectives replaced by local stand-ins of
   the right shapes (benchmarks/bench_sp_share.py's), so t = 2 needs no second GPU. Beside
   §3.5, the count of what this runtime keeps (`gpu_layers.kept_activation_bytes`).
3. The runtime end to end over NCCL (a world of one: one GPU here): the layered worker's
   `train` on a one-device plan, bf16 (fp32 master weights and moments), 1F1B or GPipe,
   recompute on and off. Per case: the states held at a step's start (weights, masters,
   moments; the gradients are dropped then) against (μ − γ)·P, the peak during the
   micro-batches (and the whole step's, as the worker reports it) against §3.5's W_σ + Act_σ,
   and the fastest step against `iteration_time` on one catalogue GPU of the device's type.
4. The local launcher (`launch_local`: a worker process, NCCL, bf16): the losses fall.
5. The command line: `hexiscale run` on a one-GPU problem file, as a user types it; on a GPU
   its report has each stage's memory beside §3.5 (the worker's per-step peak).
6. §3.1's C_σ/t: a TP-2 rank's forward + backward (local stand-ins for its collectives)
   against one device's, with and without sequence parallelism.

Where §3.5 and the allocator differ, the ratio column says by how much; nothing here is
fitted to the other.
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_layers import report_activations, report_tp_share  # noqa: E402
from gpu_setup import GIB, Setup, allocated, peak, ratio, reset_peak, setup_for, synchronize  # noqa: E402
from planner.hardware import Cluster, GpuType, Machine, builtin_catalog  # noqa: E402
from planner.layered.evaluate import iteration_time  # noqa: E402
from planner.problem import Problem  # noqa: E402
from planner.layered.cost import (StageShape, in_flight_micro_batches, stage_activation_bytes,  # noqa: E402
                                  stage_params, stage_state_bytes)
from planner.io import save_plan  # noqa: E402
from planner.layered.plan import Pipeline, Plan, Stage  # noqa: E402
from planner.workload import ModelSpec, TrainingSpec  # noqa: E402
from runtime.communication.communicator import Communicator, RankPlace  # noqa: E402
from runtime.config import Job, RunConfig  # noqa: E402
from runtime.launch.launcher import launch_local  # noqa: E402
from runtime.layered import worker as layered_worker  # noqa: E402
from runtime.layered.schedule import StepRunner  # noqa: E402
from runtime.precision import SCHEMES  # noqa: E402

# -- 1. the device ----------------------------------------------------------------------------


def gemm_tflops(device: torch.device, size: int, repeats: int = 10) -> float:
    """One size³ bf16 matrix product's rate, the mean of `repeats` after three warm-ups."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e12


def catalogue_entry(name: str) -> GpuType | None:
    """The catalogue's type whose name the device's name contains (the longest such)."""
    matches = [gpu for gpu in builtin_catalog().values() if gpu.name.lower() in name.lower()]
    return max(matches, key=lambda gpu: len(gpu.name), default=None)


def report_device(setup: Setup) -> GpuType | None:
    name = torch.cuda.get_device_name(setup.device) if setup.device.type == "cuda" else "CPU (dry run)"
    print(f"torch {torch.__version__}, device {name}, backend {setup.backend}"
          f"{', CUDA ' + str(torch.version.cuda) if setup.device.type == 'cuda' else ''}")
    size = 8192 if setup.device.type == "cuda" else 256
    rate = gemm_tflops(setup.device, size)
    gpu = catalogue_entry(name)
    if gpu is None:
        print(f"bf16 GEMM {size}³: {rate:.1f} TFLOP/s; no catalogue entry for {name}\n")
    else:
        print(f"bf16 GEMM {size}³: {rate:.1f} TFLOP/s; catalogue {gpu.name}: peak {gpu.peak_tflops:g} TFLOP/s, "
              f"η {gpu.efficiency:g}, η_att {gpu.attention_eta:g}; measured/peak {rate / gpu.peak_tflops:.3f}\n")
    return gpu


# -- 3. the runtime over NCCL ----------------------------------------------------------------


class MeasuredRunner(StepRunner):
    """The worker's StepRunner, noting the allocator around each step's micro-batches: the
    bytes held at the start (states; gradients dropped) and the peak while they run."""

    notes: list[tuple[float, float]] = []

    def run(self, schedule) -> None:
        reset_peak()
        start = allocated()
        super().run(schedule)
        synchronize()
        MeasuredRunner.notes.append((start, peak()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_in_process(job: Job, device: torch.device) -> list[tuple[float, float]]:
    """The layered worker's `train` in this process, a world of one over the job's backend."""
    comm = Communicator.start(job.config.backend, "127.0.0.1", free_port(), 0, 1, (RankPlace(device=0),),
                              job.config.timeout_s, device)
    MeasuredRunner.notes = []
    original, layered_worker.StepRunner = layered_worker.StepRunner, MeasuredRunner
    try:
        layered_worker.train(job, comm)
    finally:
        layered_worker.StepRunner = original
        comm.close()
    return list(MeasuredRunner.notes)


def one_device_problem(spec: ModelSpec, training: TrainingSpec, gpu: GpuType | None) -> Problem:
    """The problem of one device of the GPU's catalogue type (an H200 for the dry run too)."""
    machine = Machine(name="gpu0", gpu=gpu.name if gpu else "H200", count=1, intra_bw_gbps=900)
    return Problem(name="gpu-check", cluster=Cluster(machines=(machine,), inter_bw_gbps=50), model=spec,
                   training=training)


def runtime_row(setup: Setup, spec: ModelSpec, case: tuple, gpu: GpuType | None, scratch: Path, steps: int = 5) -> str:
    """One case run in-process: held states, the micro-batches' peak and the step time of its
    last step, each beside what §3 prices."""
    label, schedule, recompute, micro_batch, batch, seq_len = case
    training = TrainingSpec(seq_len=seq_len, global_batch=batch, micro_batch=micro_batch, recompute=recompute,
                            schedule=schedule)
    q = int(in_flight_micro_batches(training, 1, 0, batch // micro_batch))
    shape = StageShape(tp=1, layers=spec.layers, first=1, last=1, in_flight=q)
    states, act = float(stage_state_bytes(spec, training, shape)), float(stage_activation_bytes(spec, training, shape))
    scheme = SCHEMES["bf16"]
    held_predicted = (scheme.param_state_bytes - scheme.grad_bytes) * float(stage_params(spec, shape))
    out = Path(tempfile.mkdtemp(prefix="runtime-", dir=scratch))
    config = RunConfig(model=spec, seq_len=seq_len, micro_batch=micro_batch, steps=steps, schedule=schedule,
                       recompute=recompute, backend=setup.backend, precision="bf16", timeout_s=120,
                       check_replicas=False, log_every=steps, out_dir=str(out))
    plan = Plan(pipelines=[Pipeline(batch=batch, stages=[Stage(devices=[0], layers=spec.layers)])])
    notes = run_in_process(Job(plan=plan, config=config), setup.device)
    start_held, schedule_peak = notes[-1]  # the last step: the moments exist since step 1
    steps = json.loads((out / "metrics.json").read_text())["steps"]
    step_s = min(step["step_s"] for step in steps[2:])
    reported = steps[-1]["stages"][0].get("peak_mib", math.nan) * 2**20  # the worker's own, the whole step
    predicted_s = iteration_time(one_device_problem(spec, training, gpu), plan)
    return (f"{label:20s} q={q}  {start_held / GIB:6.2f} {held_predicted / GIB:6.2f} {ratio(start_held, held_predicted)}"
            f"  {schedule_peak / GIB:6.2f} {reported / GIB:6.2f} {(states + act) / GIB:6.2f} "
            f"{ratio(schedule_peak, states + act)}"
            f"  {step_s * 1e3:8.1f} {predicted_s * 1e3:8.1f} {ratio(step_s, predicted_s)}")


RUNTIME_CASES = (  # label, schedule, recompute, b, B, s as a fraction of the longest
    ("1f1b b=1", "1f1b", False, 1, 2, 1), ("1f1b b=1 recompute", "1f1b", True, 1, 2, 1),
    ("gpipe b=1 m=4", "gpipe", False, 1, 4, 2), ("1f1b b=2", "1f1b", False, 2, 2, 2))


def report_runtime(setup: Setup, gpu: GpuType | None, scratch: Path) -> None:
    spec = ModelSpec(name="runtime-check", layers=setup.layers, **setup.shape)
    print(f"the layered runtime over {setup.backend} (a world of one): {spec.layers} layers of h = {spec.hidden}, "
          f"P = {spec.total_params / 1e9:.2f} B, bf16. GiB: states held at a step's start vs (μ − γ)·P; the "
          f"micro-batches' peak (and the whole step's, as the worker reports it) vs §3.5's W_σ + Act_σ (R left "
          f"out). ms: the fastest step after 2 warm-up vs "
          f"evaluate()'s T on one {gpu.name if gpu else 'H200'} of the catalogue")
    print(f"{'case':20s} {'':4s} {'held':>6s} {'(μ−γ)P':>6s} {'ratio':>6s}  {'peak':>6s} {'step':>6s} {'W+Act':>6s} "
          f"{'ratio':>6s}  {'step ms':>8s} {'T ms':>8s} {'ratio':>6s}")
    for label, schedule, recompute, b, batch, fraction in RUNTIME_CASES:
        case = (label, schedule, recompute, b, batch, setup.seq_len // fraction)
        print(runtime_row(setup, spec, case, gpu, scratch), flush=True)
    print()


# -- 4. the local launcher --------------------------------------------------------------------


def report_launcher(setup: Setup, scratch: Path) -> None:
    spec = ModelSpec(name="launcher-check", layers=setup.layers, **setup.shape)
    config = RunConfig(model=spec, seq_len=setup.seq_len // 4, micro_batch=1, steps=6, backend=setup.backend,
                       precision="bf16", lr=3e-4, timeout_s=180, out_dir=str(scratch / "launcher"))
    plan = Plan(pipelines=[Pipeline(batch=4, stages=[Stage(devices=[0], layers=spec.layers)])])
    result = launch_local(Job(plan=plan, config=config), echo=False)
    if not result.ok:
        print("launch_local FAILED:\n" + result.failure_summary())
        return
    losses = " ".join(f"{step['loss']:.3f}" for step in result.steps)
    step_ms = [step["step_s"] * 1e3 for step in result.steps[2:]]
    print(f"launch_local, {setup.backend}, bf16, 6 steps: losses {losses}; step {min(step_ms):.1f}–"
          f"{max(step_ms):.1f} ms after 2 warm-up; replicas identical: {result.replicas_identical}")


# -- 5. the command line ------------------------------------------------------------------------

def one_gpu_files(folder: Path, setup: Setup, gpu: GpuType | None) -> tuple[Path, Path]:
    """A problem file and a plan file of part 3's model on one device of the GPU's type, as a
    user would hand them to `hexiscale run`."""
    spec = ModelSpec(name="gpu-check", layers=setup.layers, **setup.shape)
    training = TrainingSpec(seq_len=setup.seq_len, global_batch=4, micro_batch=1, recompute=False)
    problem, plan = folder / "problem.json", folder / "plan.json"
    problem.write_text(json.dumps(one_device_problem(spec, training, gpu).model_dump(mode="json")))
    save_plan(Plan(problem="gpu-check", pipelines=[Pipeline(batch=4, stages=[Stage(devices=[0], layers=spec.layers)])]),
              plan)
    return problem, plan


def report_command_line(setup: Setup, gpu: GpuType | None, scratch: Path) -> None:
    """`hexiscale run PROBLEM PLAN --model problem --backend nccl --precision bf16` as a user
    types it, with its whole output: times and (on a GPU) memory against the cost model."""
    folder = scratch / "command-line"
    folder.mkdir()
    problem, plan = one_gpu_files(folder, setup, gpu)
    command = ["run", str(problem), str(plan), "--model", "problem", "--backend", setup.backend,
               "--precision", "bf16", "--steps", "6", "--timeout", "180", "--out", str(folder / "out")]
    print("hexiscale " + " ".join(command), flush=True)
    done = subprocess.run([sys.executable, "-c", "from hexiscale.cli import main; main()", *command],
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    print(done.stdout + done.stderr + f"(exit {done.returncode})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="on CPU with a tiny model and gloo")
    parser.add_argument("--parts", default="123456", help="which parts to run (digits 1–6)")
    args = parser.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        # exit 2, not 0: a scripted GPU check must not read "nothing checked" as passed
        print("bench_gpu: no CUDA device here (torch.cuda.is_available() is False); --dry-run runs the same code on CPU",
              file=sys.stderr)
        raise SystemExit(2)
    setup = setup_for(args.dry_run)
    gpu = report_device(setup) if "1" in args.parts else catalogue_entry("H200")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:  # the runs' files, gone afterwards
        scratch = Path(folder)
        parts = {"2": lambda: report_activations(setup), "3": lambda: report_runtime(setup, gpu, scratch),
                 "4": lambda: report_launcher(setup, scratch), "5": lambda: report_command_line(setup, gpu, scratch),
                 "6": lambda: report_tp_share(setup)}
        for part, report in parts.items():
            if part in args.parts:
                started = time.perf_counter()
                report()
                print(f"(part {part}: {time.perf_counter() - started:.1f} s)\n", flush=True)


if __name__ == "__main__":
    main()
