"""`--time-limit` as a user sees it: the whole command, from the shell, output included.

Generates clusters of 4,096, 16,384 and 100,000 GPUs (llama2-70b, seed 1), runs `hexiscale solve`
(and `compare`, `replan` where asked) on each as a separate process, and prints per run the
limit, the command's wall time, its peak memory (the child's max RSS) and the lines it printed.
Targets (issue 29): 100,000 GPUs at -t 60 within 66 s and 2 GB; 16,384 at -t 10 within 11 s;
4,096 at -t 5 within 5.5 s; under 200 lines of default output at every size.

    .venv/bin/python benchmarks/bench_time_limit.py [--sizes 4096,16384,100000] [--commands solve,compare,replan]
    .venv/bin/python benchmarks/bench_time_limit.py --solvers

`--solvers`: instead, the exact path and the frontier where their work does not shrink with the
cluster: every exact layered solver at -t 5 on the 96-GPU offers problems (CP-SAT and MILP models
of up to 178,000 variables) and on 8 GPUs with B/b = 1,024 (the per-D bound's sweep grows with
(B/b)²), and `frontier -o` at -t 60 on a 1,024-GPU priced cluster (Llama-2 13B).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
HEXISCALE = [str(Path(sys.executable).parent / "hexiscale")]  # the installed command, as a user runs it
LIMITS = {4096: 5.0, 16384: 10.0, 100000: 60.0}


def timed(args: list[str]) -> tuple[float, float, int, int]:
    """(wall s, peak MiB of this child alone, output lines, exit code) of one command."""
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        child = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        lines = out.read().count("\n")
    return wall, usage.ru_maxrss / 1024, lines, os.waitstatus_to_exitcode(status)


def generate(gpus: int, folder: Path) -> Path:
    path = folder / f"p{gpus}.yaml"
    subprocess.run([*HEXISCALE, "generate", "problem", "--gpus", str(gpus), "--model", "llama2-70b", "--seed", "1",
                    "-o", str(path)], check=True, capture_output=True, cwd=ROOT)
    return path


def command_args(command: str, problem: Path, limit: float, folder: Path) -> list[str]:
    plan = folder / f"{problem.stem}.plan.json"
    if command == "solve":
        return [*HEXISCALE, "solve", str(problem), "-t", str(limit), "-o", str(plan)]
    if command == "compare":
        return [*HEXISCALE, "compare", str(problem), "-t", str(limit)]
    return [*HEXISCALE, "replan", str(problem), str(plan), "--lost-machines", "0,1", "-t", str(limit),
            "-o", str(folder / f"{problem.stem}.replanned.json")]


def solver_cases(folder: Path) -> list[tuple[str, str, float, list[str]]]:
    """(problem label, command label, limit, arguments) of the `--solvers` runs."""
    big_batch, priced = folder / "small8-bigB.yaml", folder / "priced1024.yaml"
    subprocess.run([*HEXISCALE, "generate", "problem", "--gpus", "8", "--seed", "3", "--global-batch", "1024",
                    "--model", "llama2-7b", "-o", str(big_batch)], check=True, capture_output=True, cwd=ROOT)
    subprocess.run([*HEXISCALE, "generate", "problem", "--gpus", "1024", "--prices", "--model", "llama2-13b",
                    "-o", str(priced)], check=True, capture_output=True, cwd=ROOT)
    cases = [(name, f"solve -s {solver}", 5.0, [*HEXISCALE, "solve", problem, "--kind", "layered", "-s", solver,
                                                 "-t", "5"])
             for name, problem, solvers in (("offers (budget)", "offers-llama2-13b-budget", ("cpsat", "milp", "colgen")),
                                            ("offers (cost)", "offers-llama2-13b-cost", ("cpsat", "milp")),
                                            ("8 GPUs, B/b 1,024", str(big_batch), ("cpsat", "milp")))
             for solver in solvers]
    return cases + [("1,024 priced", "frontier -o", 60.0, [*HEXISCALE, "frontier", str(priced), "--levels", "10",
                                                           "-t", "60", "-o", str(folder / "front")])]


def size_cases(sizes: str, commands: str, folder: Path):
    """(size label, command, limit, arguments) per size and command, each size's problem
    generated when its runs come (replan needs solve's plan: solve comes first)."""
    for gpus in (int(x) for x in sizes.split(",")):
        problem, limit = generate(gpus, folder), LIMITS.get(gpus, 10.0)
        for command in commands.split(","):
            yield f"{gpus:,} GPUs", command, limit, command_args(command, problem, limit, folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4096,16384,100000")
    parser.add_argument("--commands", default="solve,compare,replan")
    parser.add_argument("--solvers", action="store_true", help="the exact solvers and the frontier instead (text)")
    args = parser.parse_args()
    table = Table(title="--time-limit of the whole command (wall from the shell; peak RSS of the process)")
    for col in ("problem", "command", "limit s", "wall s", "over", "peak MiB", "lines", "exit"):
        table.add_column(col, justify="left" if col in ("problem", "command") else "right")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        runs = solver_cases(folder) if args.solvers else size_cases(args.sizes, args.commands, folder)
        for name, command, limit, arguments in runs:
            wall, peak, lines, code = timed(arguments)
            table.add_row(name, command, f"{limit:g}", f"{wall:.2f}", f"{wall / limit - 1:+.1%}",
                          f"{peak:,.0f}", str(lines), str(code))
            Console().print(f"{name} {command}: {wall:.2f} s of {limit:g} s", highlight=False)
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
